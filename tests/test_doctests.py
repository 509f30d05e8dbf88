"""The ``Examples:`` in the docstrings run as written (doctest), so the rule a docstring states
and the numbers it shows cannot drift apart."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["leadline.budget", "leadline.pieces", "leadline.plan", "leadline.rate.policy", "leadline.rate.lookahead_rules",
           "leadline.derive.runner", "leadline.noise.step"]


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no Examples: to run"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"
