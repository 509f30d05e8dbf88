"""The package's layers: no import cycle among leadline's modules nor among its packages (imports
inside functions count), no private name imported across packages, plan.py at the bottom, and the
run (``leadline.run``) below the Hugging Face layer and the command line."""

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


def _imports(name: str, type_checking: bool = False) -> list[tuple[str, str | None]]:
    """``(module, imported name or None)`` for every import in module ``name``, anywhere in it;
    those of ``if TYPE_CHECKING:`` blocks only when ``type_checking``."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    skip = set() if type_checking else _type_checking_lines(tree)
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
    """The package a module belongs to: ``leadline.lookahead.noise.step`` -> ``leadline.lookahead.noise``; a module
    directly under leadline is its own home."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _package_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto packages: ``leadline.hf`` imports ``leadline.run`` when one of
    its modules imports one of run's."""
    out: dict[str, set[str]] = {_home(m): set() for m in graph}
    for module, targets in graph.items():
        for target in targets:
            out.setdefault(_home(target), set())
            if _home(target) != _home(module):
                out[_home(module)].add(_home(target))
    return out


KNOWN_PACKAGE_CYCLES: list[list[str]] = []
"""Package cycles that exist and are tracked elsewhere, each sorted as :func:`_cycles` returns it.
None today: a new one fails the test below."""


def test_no_import_cycle_among_the_packages():
    cycles = [c for c in _cycles(_package_edges(_edges())) if c not in KNOWN_PACKAGE_CYCLES]
    crossings = {
        " <-> ".join(c): sorted(f"{m} -> {t}" for m in MODULES if _home(m) in c for t in _edges()[m]
                                if _home(t) in c and _home(t) != _home(m))
        for c in cycles
    }
    assert not cycles, f"package cycles (imports inside functions count): {crossings}"


def test_the_package_cycle_check_folds_modules_onto_their_packages():
    modules = {"leadline.hf.deriving": {"leadline.run.one"}, "leadline.run.one": {"leadline.hf.task"},
               "leadline.hf.task": set(), "leadline.plan": set()}
    assert _cycles(_package_edges(modules)) == [["leadline.hf", "leadline.run"]]
    assert _cycles(_package_edges({**modules, "leadline.run.one": {"leadline.plan"}})) == []


def test_the_run_imports_neither_the_hugging_face_layer_nor_the_command_line():
    above = ("leadline.hf", "leadline.cli")
    run_modules = [m for m in MODULES if _home(m) == "leadline.run"]
    assert "leadline.run.one" in run_modules and "leadline.run.task" in run_modules
    reached = sorted(f"{name} imports {module}" + (f".{what}" if what else "")
                     for name in run_modules for module, what in _imports(name, type_checking=True)
                     if any(module == a or module.startswith(a + ".") for a in above)
                     or (module == "leadline" and what in ("hf", "cli")))
    assert not reached, "leadline.run reaches above itself: " + "; ".join(reached)


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
