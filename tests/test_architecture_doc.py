"""docs/architecture.md lists the tree as it is: one line a module under src/leadline/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "leadline"


def _listed() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"```\nsrc/leadline/\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no tree block starting with src/leadline/"
    return [line.split()[0] for line in block.group(1).splitlines() if line.strip()]


def test_every_module_is_in_the_tree_and_every_line_is_a_module():
    modules = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py"))
    listed = _listed()
    missing = sorted(set(modules) - set(listed))
    gone = sorted(set(listed) - set(modules))
    assert not missing, f"modules missing from docs/architecture.md's tree: {', '.join(missing)}"
    assert not gone, f"docs/architecture.md lists modules that do not exist: {', '.join(gone)}"
    assert len(listed) == len(set(listed)), "a module is listed twice"


def test_each_line_says_what_its_module_is():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"```\nsrc/leadline/\n(.*?)```", text, re.S).group(1)
    for line in block.splitlines():
        assert len(line.split(maxsplit=1)) == 2, f"no description: {line!r}"
        assert len(line) <= 120, f"longer than 120 characters: {line!r}"
