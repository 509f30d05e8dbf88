"""The ``Examples:`` in the docstrings run as written (doctest), so the rule a docstring states
and the numbers it shows cannot drift apart: every module under src/leadline that shows one."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
MODULES = sorted(".".join(p.relative_to(SRC).with_suffix("").parts) for p in (SRC / "leadline").rglob("*.py")
                 if ">>> " in p.read_text())


def test_the_modules_with_examples_are_found():
    assert {"leadline.plan", "leadline.lookahead.noise.step", "leadline.lookahead.rate.schedule"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no Examples: to run"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"
