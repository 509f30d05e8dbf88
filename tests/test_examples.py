"""The scripts in examples/ run as written and do what their docstrings say."""

from __future__ import annotations

import runpy
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_derive_in_your_own_loop_trains_the_plan_below_the_default_rate(capsys):
    module = runpy.run_path(str(EXAMPLES / "derive_in_your_own_loop.py"))
    out = module["main"](["--steps", "60"])
    printed = capsys.readouterr().out
    assert "lr" in printed and "measured" in printed  # the rate came from the look-ahead
    assert out["after"] < 0.5 * out["before"] and out["after"] < out["recipe"], out
