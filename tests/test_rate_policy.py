"""Known answers for the rate policy (leadline.lookahead.rate.policy): which rate the plan takes from the
numbers the rate phases measured. Pure decisions on small plans, no torch."""

from __future__ import annotations

import doctest
from types import SimpleNamespace

import pytest

from leadline.lookahead.rate import policy
from leadline.plan import Plan, Value


def _plan(**numbers: float) -> Plan:
    plan = Plan()
    for name, v in numbers.items():
        plan.set(name, Value(v, "constant" if name == "lr_anchor" else "measured", f"the {name}"))
    return plan


def _la(lr: float, horizon: int, stop: str = "budget") -> SimpleNamespace:
    return SimpleNamespace(lr=lr, horizon_steps=horizon, stop=stop, stopped_because=f"{stop}: the sentence",
                           evidence=lambda: {"plot": "lookahead"})


def test_the_doctest_examples_run():
    assert doctest.testmod(policy).failed == 0


@pytest.mark.parametrize(("anchor", "alpha1", "total", "want"), [
    (4.57e-4, 0.01, 24, {"grid": (-5, -4, -3), "first_horizon": 16}),  # 48 steps over 16-step horizons: 3 rates
    (4.57e-4, 0.01, 30, {"grid": (-5, -4, -3), "first_horizon": 16}),  # 60 steps: 3 rates from 2^-5, below the anchor
    (4.57e-4, 0.01, 40, {}),  # 5 rates x 16 steps = 80 = 2 x 40: the default grid fits exactly
    (4.57e-4, 0.01, 400, {}),  # the default grid reaches its 50-step minimum on 800 steps
    (0.02, 0.01, 24, {}),  # the anchor above alpha1: the default grid stands
    (None, 0.01, 24, {}),  # no anchor known
    (0.009, 0.01, 24, {"grid": (-2, -1, 0), "first_horizon": 16}),  # never above alpha1
])
def test_a_short_run_reads_the_rates_nearest_the_anchor(anchor, alpha1, total, want):
    assert policy.short_run_grid(anchor, alpha1, total) == want


def test_a_lookahead_cut_before_its_minimum_horizon_takes_the_anchor_and_says_why():
    plan = _plan(lr_anchor=4.57e-4)
    by_budget = policy.cut_rate(plan, _la(4.82e-3, 10, "budget"), 37)["lr"]
    assert by_budget.value == 4.57e-4 and by_budget.kind == "constant"
    assert "its step budget stopped the look-ahead at 10 steps, before its 16-step minimum horizon" in by_budget.source
    assert by_budget.evidence["lookahead"] == {"plot": "lookahead"}
    by_time = policy.cut_rate(plan, _la(4.82e-3, 10, "max_seconds"), 400)["lr"]
    assert by_time.source.startswith("the anchor, below the look-ahead's 0.00482: max_seconds cut the look-ahead at "
                                     "10 steps, before its 50-step minimum horizon")


def test_a_lookahead_past_its_minimum_horizon_or_below_the_anchor_keeps_its_answer():
    plan = _plan(lr_anchor=4.57e-4)
    assert policy.cut_rate(plan, _la(4.82e-3, 16), 37) == {}  # reached the 16-step minimum
    assert policy.cut_rate(plan, _la(4.82e-3, 8), 8) == {}  # reached the run's length
    assert policy.cut_rate(plan, _la(3e-4, 10), 37) == {}  # its answer is already below the anchor
    assert policy.cut_rate(_plan(), _la(4.82e-3, 10), 37) == {}  # no anchor


@pytest.mark.parametrize(("numbers", "value", "kind", "starts"), [
    ({"alpha1": 4e-4, "lr_anchor": 1e-3}, 4e-4, "measured", "alpha1, the first safe step"),
    ({"alpha1": 4e-3, "lr_anchor": 1e-3}, 1e-3, "constant", "the anchor, below alpha1 0.004"),
    ({"alpha1": 4e-3}, 4e-3, "measured", "alpha1, the first safe step"),
    ({"lr_anchor": 1e-3}, 1e-3, "constant", "the anchor (nothing could be run for the rate)"),
    ({"alpha1": float("nan"), "lr_anchor": 1e-3}, 1e-3, "constant", "the anchor (nothing could be run"),
])
def test_without_a_rate_phase_the_plan_takes_the_lower_of_alpha1_and_the_anchor(numbers, value, kind, starts):
    lr = policy.fallback_rate(_plan(**numbers))
    assert lr is not None and lr.value == value and lr.kind == kind and lr.source.startswith(starts), lr


def test_a_plan_with_a_rate_or_nothing_to_take_one_from_gets_no_fallback():
    assert policy.fallback_rate(_plan(lr=1e-3, alpha1=4e-3)) is None
    assert policy.fallback_rate(_plan()) is None
