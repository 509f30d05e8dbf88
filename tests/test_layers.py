"""The package's layers: no import cycle among leadline's modules (imports inside functions
count), no private name imported across packages, and plan.py at the bottom."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "leadline"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """The lines of ``if TYPE_CHECKING:`` blocks: imports for the type checker, never run."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def _imports(name: str) -> list[tuple[str, str | None]]:
    """``(module, imported name or None)`` for every import in module ``name``, anywhere in it."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    skip = _type_checking_lines(tree)
    package = name if _is_package(name) else name.rpartition(".")[0]
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            out += [(base, a.name) for a in node.names]
    return [(m, n) for m, n in out if m == "leadline" or m.startswith("leadline.")]


def _edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for name in MODULES:
        for module, what in _imports(name):
            target = f"{module}.{what}" if what and f"{module}.{what}" in MODULES else module
            if target in MODULES and target != name:
                graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_among_the_modules():
    cycles = _cycles(_edges())
    assert not cycles, "import cycles (imports inside functions count): " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_plan_is_the_bottom_layer():
    allowed = {"leadline._io", "leadline._version", "leadline.errors"}
    assert _edges()["leadline.plan"] <= allowed, sorted(_edges()["leadline.plan"] - allowed)


def _home(module: str) -> str:
    """The package a module belongs to: ``leadline.noise.step`` -> ``leadline.noise``; a module
    directly under leadline is its own home."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_private_name_is_imported_across_packages():
    crossing = []
    for name in MODULES:
        for module, what in _imports(name):
            if _home(module) == _home(name):
                continue
            private_module = any(p.startswith("_") and p != "__init__" for p in module.split(".")[1:])
            if (what and what.startswith("_") and what != "__version__") or (private_module and module != "leadline._io"
                                                                             and module != "leadline._version"):
                crossing.append(f"{name} imports {module}.{what}" if what else f"{name} imports {module}")
    assert not crossing, "private names used outside their package: " + "; ".join(crossing)
