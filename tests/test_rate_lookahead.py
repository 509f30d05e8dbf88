"""The look-ahead: the pure decisions on known numbers, then a regression whose best constant
rate is known (swept on the exact expected loss), then the no-trace contract."""

from __future__ import annotations

import math
import random

import pytest

from leadline.lookahead.rate.lookahead_rules import carry_trend, parabola_log2, prune, trend_slope
from leadline.rate.compare import compare

torch = pytest.importorskip("torch")

from test_rate_toys import Regression, constant_rate_loss  # noqa: E402


# ---- the pure decisions ----------------------------------------------------------------
def test_compare_uses_the_paired_t_and_the_sequential_bar():
    rng = random.Random(0)
    b = [rng.gauss(1.0, 0.5) for _ in range(100)]
    a = [x + 0.05 + rng.gauss(0, 0.05) for x in b]  # worse by 0.05, t about 10
    fixed = compare(a, b)
    assert fixed.worse and not fixed.better and fixed.diff is not None and fixed.diff.t > 5
    early = compare(a, b, look=1, max_looks=8)
    assert early.bar > fixed.bar  # an early look needs more
    tiny = [x + 0.002 + rng.gauss(0, 0.05) for x in b]  # t about 0.4
    assert not compare(tiny, b).worse and not compare(tiny, b).better
    assert compare([math.nan, 1.0], [1.0, 1.0]).worse
    assert compare([1.0, 1.0], [math.inf, 1.0]).better


def test_prune_names_the_best_and_tests_the_rest_against_it():
    rng = random.Random(1)
    base = [rng.gauss(1.0, 0.3) for _ in range(64)]
    readings = {0: [x + 0.2 for x in base], 1: base, 2: [x + 0.001 * rng.random() for x in base]}
    best, verdicts = prune(readings, alpha=0.05, look=3, max_looks=3)
    assert best == 1 and set(verdicts) == {0, 2}
    assert verdicts[0].worse


def test_trend_slope_carry_and_parabola_on_known_numbers():
    assert trend_slope([10, 20, 40], [0.04, 0.02, 0.01]) == pytest.approx(-1.0)
    assert trend_slope([10, 20, 40], [0.01, 0.01, 0.01]) == pytest.approx(0.0)
    assert trend_slope([10, 20], [0.04, 0.02]) is None
    assert carry_trend(0.01, 40, -1.0, 160) == pytest.approx(0.0025)
    assert carry_trend(0.01, 40, -3.0, 160) == pytest.approx(0.0025)  # slope clamped to -1
    assert carry_trend(0.01, 10, -1.0, 1000) == pytest.approx(0.01 / 8)  # bounded to 8x
    # a parabola in log2(lr) with its vertex at log2(lr) = -6.3
    lrs = [2.0**-7, 2.0**-6, 2.0**-5]
    means = [(math.log2(r) + 6.3) ** 2 for r in lrs]
    assert math.log2(parabola_log2(lrs, means)) == pytest.approx(-6.3)
    assert parabola_log2(lrs, [1.0, 2.0, 3.0]) is None  # does not bend upward
    far = [(math.log2(r) + 9.0) ** 2 + 0.1 * r for r in lrs]
    assert math.log2(parabola_log2(lrs, far)) == pytest.approx(-6.5)  # clamped to half a step


def test_only_a_falling_unsettled_trend_is_carried_to_the_run_length():
    from leadline.lookahead.rate.lookahead import answer_at_run_length

    # falling and not settled: carried, lr * (T/n)^s
    lr, why = answer_at_run_length(0.01, 40, -1.0, 160, settled=False)
    assert lr == pytest.approx(0.0025) and "carried from 40 to 160" in why
    # settled: the estimate as read, whatever the small slope says (the full fine-tune on gsm_symbolic: n^0.11 carried 1.15x up; docs/rate.md)
    for slope in (0.11, -0.2):
        lr, why = answer_at_run_length(2.1e-4, 40, slope, 90, settled=True)
        assert lr == 2.1e-4 and "settled: not carried" in why
    # rising and not settled: kept, never extrapolated upward
    lr, why = answer_at_run_length(0.01, 40, 0.6, 160, settled=False)
    assert lr == 0.01 and "rising trend, n^0.60, is not carried" in why
    # no trend yet, or at the run's length: kept
    assert answer_at_run_length(0.01, 40, None, 160, settled=False)[0] == 0.01
    assert answer_at_run_length(0.01, 160, -1.0, 160, settled=False) == (0.01, "")


# ---- the known answer ------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 2])
def test_lookahead_lands_within_2x_of_the_best_constant_rate(seed):
    """Known answer: the regression's best constant rate for T = 128 Adam steps (warmup from
    alpha1), swept 2^(1/2) apart on the exact expected loss ||w - w*||^2 + noise^2."""
    from leadline.lookahead.rate import lookahead_lr, measure_first_step

    steps = 128
    toy = Regression(seed=seed, dim=32)
    alpha1 = measure_first_step(toy.params, toy.opt, toy.train_step, toy.held_out).alpha1
    sweep = [1e-4 * 2 ** (k / 2) for k in range(20)]
    known = min(sweep, key=lambda r: constant_rate_loss(seed, r, steps, alpha1, dim=32))
    assert sweep[0] < known < sweep[-1]  # an interior best
    la = lookahead_lr(toy.params, toy.opt, toy.train_step, toy.held_out, alpha1, total_steps=steps)
    assert known / 2 <= la.lr <= known * 2, (la.lr, known, la.stopped_because)
    assert la.steps_used <= la.budget_steps == 2 * steps
    # the look-ahead's rate also costs little against the best rate's loss
    assert constant_rate_loss(seed, la.lr, steps, alpha1, dim=32) - 0.01 < 2 * (constant_rate_loss(seed, known, steps, alpha1, dim=32) - 0.01)


def test_evidence_has_the_plot_shape_and_the_values_their_kinds():
    from leadline.lookahead.rate import lookahead_lr

    toy = Regression(seed=1, dim=32)
    seen = []
    la = lookahead_lr(toy.params, toy.opt, toy.train_step, toy.held_out, 0.01, total_steps=64, on_progress=seen.append)
    ev = la.evidence()
    assert ev["plot"] == "lookahead" and ev["chosen_lr"] == la.lr and ev["horizons"] == seen
    for h in ev["horizons"]:
        assert h["steps"] >= 10 and all({"lr", "loss", "se", "status"} <= set(c) for c in h["candidates"])
    assert [h["steps"] for h in ev["horizons"]][:2] == [10, 20]  # n doubles from the warmup
    values = la.as_values()
    assert values["lr"].kind == "measured" and values["lookahead_horizon_steps"].value == la.horizon_steps
    assert values["warmup_steps"].value == 0 and values["weight_decay"].kind == "constant"  # the run: no warmup
    # candidates continue: every step number was run by each candidate at most once
    assert la.steps_used == len(toy.calls)


def test_a_diverging_rate_is_out_and_the_answer_stays_below_it():
    from leadline.lookahead.rate import lookahead_lr

    toy = Regression(seed=1, dim=32)
    orig = toy.train_step

    def step(t: int) -> float:  # any rate above 0.03 blows up
        if toy.opt.param_groups[0]["lr"] > 0.03:
            with torch.no_grad():
                toy.w.fill_(math.nan)
        return orig(t)

    la = lookahead_lr(toy.params, toy.opt, step, toy.held_out, 0.01, total_steps=64)
    statuses = {c["lr"]: c["status"] for h in la.horizons for c in h["candidates"]}
    assert statuses[0.04] == "diverged" and statuses[0.08] == "diverged"
    assert la.lr < 0.04


def test_no_trace_after_the_lookahead_and_after_an_exception():
    from leadline.lookahead.rate import lookahead_lr

    toy = Regression(seed=3, dim=16, dropout=0.1)
    toy.opt.zero_grad()
    toy.train_step(100)
    toy.opt.step()
    toy.opt.param_groups[0]["lr"] = 0.5
    before = toy.state()
    lookahead_lr(toy.params, toy.opt, toy.train_step, toy.held_out, 0.01, total_steps=32)
    toy.assert_state(before)
    toy.fail_at = 5
    with pytest.raises(RuntimeError, match="planted"):
        lookahead_lr(toy.params, toy.opt, toy.train_step, toy.held_out, 0.01, total_steps=32)
    toy.assert_state(before)


def test_bad_arguments_say_what_to_pass():
    from leadline.errors import InputError
    from leadline.lookahead.rate import lookahead_lr

    toy = Regression()
    with pytest.raises(InputError, match="alpha1"):
        lookahead_lr(toy.params, toy.opt, toy.train_step, toy.held_out, -1.0, total_steps=10)
    other = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(InputError, match="not in the optimizer"):
        lookahead_lr([other], toy.opt, toy.train_step, toy.held_out, 0.01, total_steps=10)


def test_the_warmup_is_raced_at_the_run_length_and_kept_only_when_better():
    from leadline.lookahead.rate import lookahead_lr

    toy = Regression(seed=1)
    # the toy's best rate over 24 steps is the grid's top: a warmup only slows it (a known loser)
    la = lookahead_lr(toy.params, toy.opt, toy.train_step, toy.held_out, 0.002, total_steps=24, grid=(1, 2),
                      budget_fraction=6.0, warmup_steps=0, first_horizon=10, race_warmup=10, keep_branch=True)
    assert la.stop == "run_length" and la.warmup_steps in (0, 10)
    race = la.warmup_race
    assert race["raced"] and race["total_steps"] == 24 and race["rate"] in la.rates
    w = la.as_values()["warmup_steps"]
    assert w.kind == "measured" and w.value == (10 if race["kept"] == "warmup" else 0)
    assert w.value == la.warmup_steps and "raced at the run's length (24 steps" in w.source
    assert race["kept"] == "none" and race["warmup_versus_constant"]["worse"]
    assert la.branch is not None and la.branch.steps == 24 and la.branch.warmup_steps == la.warmup_steps
    assert torch.equal(toy.w.detach(), torch.zeros_like(toy.w)) and not toy.opt.state  # no trace of either
    short = lookahead_lr(toy.params, toy.opt, toy.train_step, toy.held_out, 0.002, total_steps=200, grid=(1, 2),
                         warmup_steps=0, first_horizon=10, race_warmup=10, budget_fraction=0.3)
    assert not short.warmup_race["raced"] and "of the run's 200 steps" in short.warmup_race["why"]
    ws = short.as_values()["warmup_steps"]
    assert ws.kind == "constant" and ws.value == 0 and "not raced on this run" in ws.source
