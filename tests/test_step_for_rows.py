"""The step for the rows (``step_for="rows"``): the fewest rows a step whose time a row is at most
what the least-time step pays a row over the 1 + B/B_noise passes it needs to the loss its rows
reach at a small step — known answers on recorded timings, the same step on a smaller card, and
the inputs it refuses."""

from __future__ import annotations

import random

import pytest

from leadline.errors import InputError
from leadline.lookahead.noise.step import rows_step_rule, tokens_per_step
from test_derive_golden import clock  # noqa: F401  (the fixture)

# gsm_symbolic's timings on the H200 (benchmarks/results/scoreboard_gsm_symbolic.json, leadline_full):
# 69 rows fit at 0.6783 s, one row 0.146 s (3 repeats), the update 0.01407 s, B_noise 6,008 tokens
GSM = {"rows_fit": 69, "tokens_per_micro_batch": 69 * 95.85, "t_step_seconds": 0.01407, "t_micro_seconds": 0.6783,
       "t_micro_one_row_seconds": [0.1507, 0.1423, 0.1461]}


def test_on_recorded_timings_the_rows_step_is_the_smallest_the_least_time_steps_budget_affords():
    time = tokens_per_step(6008.0, **GSM)
    rows = tokens_per_step(6008.0, step_for="rows", **GSM)
    assert (time.rows_per_step, rows.rows_per_step) == (35, 14)
    rule = rows.inputs["rows_rule"]
    budget = rule["seconds_a_row_allowed"]
    assert budget == pytest.approx(rule["least_time_seconds_a_row"] * (1 + 35 * 95.85 / 6008.0))
    afford = [r for r in range(1, 36) if rule["fixed_seconds"] / r + rule["row_seconds"] <= budget]
    assert min(afford) == 14  # 13 rows would cost more a row than the budget
    assert rows.row_efficiency > time.row_efficiency  # more from each row: 82% against 64%
    v = rows.as_values()["tokens_per_step"]
    assert v.kind == "derived" and v.source.startswith("for the rows") and "35 rows" in v.source
    assert time.inputs["rows_rule"] is None and time.inputs["step_for"] == "time"


def test_the_rule_at_its_limits():
    assert rows_step_rule(20, 200.0, 400.0, 0.0, 0.01)["rows"] == 1  # no cost a step: one row a step costs nothing more
    assert rows_step_rule(20, 200.0, 1e12, 0.2, 0.01)["rows"] == 20  # B << B_noise: one pass is all it needs
    sizes = [rows_step_rule(40, 40 * 50.0, b, 0.15, 0.008)["rows"] for b in (1e3, 2e3, 8e3, 3e4)]
    # the larger the noise scale, the fewer extra passes the least-time step needs, the nearer the two steps
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1] <= 40


def test_a_given_step_and_a_bad_name_are_refused_in_one_sentence():
    from leadline.lookahead.derive import derive

    with pytest.raises(InputError, match="step_for must be one of time, rows"):
        tokens_per_step(6008.0, step_for="tokens", **GSM)
    with pytest.raises(InputError, match="not both"):
        derive(total_steps=10, rows_per_step=16, step_for="rows")
    with pytest.raises(InputError, match="step_for='fast' is not one of time, rows"):
        derive(total_steps=10, step_for="fast")


def test_derive_for_the_rows_takes_a_smaller_step_the_same_on_a_smaller_card(clock):  # noqa: F811
    from leadline.lookahead.derive import derive
    from test_derive_card_independent import _pieces

    time = derive(**_pieces(clock, fits=10**6), total_steps=40, effort="full", step_for="time")
    big = derive(**_pieces(clock, fits=10**6), total_steps=40, effort="full", step_for="rows")
    default = derive(**_pieces(clock, fits=10**6), total_steps=40, effort="full")
    assert default.tokens_per_step == big.tokens_per_step  # the step for the rows is derive's default
    assert default["tokens_per_step"].evidence["step_for"] == "rows"
    small = derive(**_pieces(clock, fits=4), total_steps=40, effort="full", step_for="rows")
    assert big.tokens_per_step < time.tokens_per_step, (big.tokens_per_step, time.tokens_per_step)
    rule = big["tokens_per_step"].evidence["rows_rule"]
    assert rule is not None and rule["least_time_rows"] * big.scored_tokens_per_row == pytest.approx(
        time.tokens_per_step)
    assert small.tokens_per_step == pytest.approx(big.tokens_per_step)  # the card decides the split only
    assert small.micro_batch * small.grad_accum == big.micro_batch * big.grad_accum


def test_the_world_step_for_the_rows_counts_the_all_reduce_as_a_steps_fixed_seconds():
    """Over W GPUs a micro-batch of W x rows_fit rows takes one t_micro: the rule reads the update
    and the all-reduce as the fixed seconds a step, t_micro / (W rows_fit) as a row's seconds, and
    spreads its rows over the world, one row a GPU at least."""
    from leadline.lookahead.distributed.phases import world_step

    kw = {"world_size": 2, "rows_fit": 16, "tokens_per_row": 100.0, "t_step_seconds": 0.05,
          "t_micro_seconds": 0.4, "t_allreduce_seconds": 0.05}
    time = world_step(6000.0, **kw)
    rows = world_step(6000.0, step_for="rows", **kw)
    t_ev, r_ev = time["tokens_per_step"].evidence, rows["tokens_per_step"].evidence
    rule = r_ev["rows_rule"]
    assert t_ev["rows_rule"] is None and rule["least_time_rows"] == t_ev["rows_wanted"]
    assert rule["fixed_seconds"] == pytest.approx(0.10) and rule["row_seconds"] == pytest.approx(0.4 / 32)
    assert 2 <= r_ev["rows_per_step"] < t_ev["rows_per_step"]
    assert r_ev["rows_per_step"] % 2 == 0  # micro x accum x world
    assert "for the rows" in rows["tokens_per_step"].source and "for the rows" not in time["tokens_per_step"].source


def _drifting_card(slow_until: list[bool]):
    """A step whose true time is 0.2 s + 2 ms a row (a fixed cost dominating, as on the H200),
    1.4x slower while ``slow_until[0]`` holds: a card whose clocks change between two timings."""
    from leadline.memory.step import StepTiming

    def step_fn(rows, length, repeats=1):
        t = (0.2 + 0.002 * rows) * (1.4 if slow_until[0] else 1.0)
        return StepTiming(rows, length, t, 0.01, [t] * repeats, [0.01] * repeats)

    return step_fn


def test_the_step_times_one_row_and_the_rows_that_fit_in_turn_so_a_drift_between_phases_does_not_move_it():
    """The ramp timed 32 rows while the card ran 1.4x slower; by the step phase it runs at full
    speed. Timed at those two moments the per-row cost read 5.4 ms instead of 2 and the step came
    out smaller; timed in turn, both shapes see the same card and the step is the drift-free one."""
    from leadline.lookahead.derive.batches import paired_timings, step
    from leadline.plan import Plan, Value

    slow = [True]
    card = _drifting_card(slow)
    ramp_time = card(32, 411).t_micro_seconds  # the ramp's timing, on the slow card
    slow[0] = False

    def plan_of() -> Plan:
        p = Plan()
        for name, v in {"rows_fit": 32, "scored_tokens_per_row": 95.85, "t_micro_seconds": ramp_time,
                        "t_step_seconds": 0.01, "scored_tokens": 191_709.0, "seq_len": 411}.items():
            p.set(name, Value(v, "measured", "recorded"))
        return p

    drifted = step(plan_of(), 6008.0, step_fn=card, step_for="rows").step
    fixed = drifted.inputs["fixed_cost"]
    assert fixed["c_seconds_per_row"] == pytest.approx(0.002, rel=1e-6)
    assert fixed["a_seconds"] == pytest.approx(0.2, rel=1e-6)
    truth = tokens_per_step(6008.0, rows_fit=32, tokens_per_micro_batch=32 * 95.85, t_step_seconds=0.01,
                            t_micro_seconds=0.2 + 0.064, t_micro_one_row_seconds=[0.202] * 3,
                            corpus_scored_tokens=191_709.0, step_for="rows")
    assert drifted.rows_per_step == truth.rows_per_step
    # what the two moments gave: the ramp's slow 32 rows against one row at full speed
    skewed = tokens_per_step(6008.0, rows_fit=32, tokens_per_micro_batch=32 * 95.85, t_step_seconds=0.01,
                             t_micro_seconds=ramp_time, t_micro_one_row_seconds=[0.202] * 3,
                             corpus_scored_tokens=191_709.0, step_for="rows")
    # the figures docs/noise.md gives: 2 ms a row read as 5.4, 25 rows a step taken as 18
    assert skewed.inputs["fixed_cost"]["c_seconds_per_row"] == pytest.approx(0.0054, abs=5e-5)
    assert (truth.rows_per_step, skewed.rows_per_step) == (25, 18)
    one, fit, update = paired_timings(card, 32, 411)
    assert len(one) == len(fit) == len(update) == 3


def test_the_card_is_timed_again_only_after_the_ramp_moved():
    """The step read again past the format reuses the step phase's paired timings at the same
    rows_fit (no micro-batch run) and gives the step those timings give; at other rows it times anew."""
    from leadline.lookahead.derive.batches import PAIRS, step
    from leadline.plan import Plan, Value

    calls = []
    card = _drifting_card([False])

    def counted(rows, length, repeats=1):
        calls.append(rows)
        return card(rows, length, repeats)

    def plan_at(rows_fit: int) -> Plan:
        p = Plan()
        for name, v in {"rows_fit": rows_fit, "scored_tokens_per_row": 95.85, "t_micro_seconds": 0.3,
                        "t_step_seconds": 0.01, "scored_tokens": 191_709.0, "seq_len": 411}.items():
            p.set(name, Value(v, "measured", "recorded"))
        return p

    first = step(plan_at(19), 229.6, step_fn=counted)
    assert len(calls) == 2 * PAIRS and first.step.inputs["timed_in_turn"]
    again = step(plan_at(19), 6008.0, step_fn=counted, timed=first)
    assert len(calls) == 2 * PAIRS  # nothing run
    fresh = step(plan_at(19), 6008.0, step_fn=card)
    assert again.step.rows_per_step == fresh.step.rows_per_step
    assert again.step.inputs["fixed_cost"] == fresh.step.inputs["fixed_cost"]
    step(plan_at(32), 6008.0, step_fn=counted, timed=first)  # the ramp moved: timed again
    assert calls[2 * PAIRS:] == [1, 32] * PAIRS


def _jittery_card(seed: int, sd: float):
    """The H200's shape of cost (0.22 s fixed + 3.4 ms a row) read with ``sd`` relative jitter a
    timing: the one-row repeats of the scoreboard's plans spread 0.18-0.24 s."""
    from leadline.memory.step import StepTiming

    rng = random.Random(seed)

    def step_fn(rows, length, repeats=1):
        ts = [(0.22 + 0.0034 * rows) * (1 + rng.gauss(0, sd)) for _ in range(repeats)]
        return StepTiming(rows, length, ts[0], 0.015, ts, [0.015] * repeats)

    return step_fn


def _gsm_plan():
    from leadline.plan import Plan, Value

    p = Plan()
    for name, v in {"rows_fit": 30, "scored_tokens_per_row": 96.8, "t_micro_seconds": 0.32, "t_step_seconds": 0.015,
                    "scored_tokens": 484_196.0, "seq_len": 412}.items():
        p.set(name, Value(v, "measured", "recorded"))
    return p


def test_more_pairs_are_timed_while_the_step_is_not_resolved_and_the_steps_of_many_derives_draw_closer(monkeypatch):
    """At 15% jitter a timing, three pairs leave the per-row cost loose: twenty derives of one
    task on one simulated card took steps far apart. Timing more pairs until the bootstrap's
    10th-90th percentile of the step is within 1.2x draws them closer, at a few more pairs."""
    import leadline.lookahead.derive.batches as batches

    def steps(max_pairs: int) -> tuple[list[int], list[int]]:
        monkeypatch.setattr(batches.resolved_timings, "__defaults__", (batches.PAIRS, max_pairs, 1.2, None))
        out = [batches.step(_gsm_plan(), 5781.0, step_fn=_jittery_card(seed, 0.15), step_for="rows").step
               for seed in range(20)]
        return sorted(s.rows_per_step for s in out), [s.inputs["step_resolution"]["pairs"] for s in out]

    fixed, fixed_pairs = steps(batches.PAIRS)
    resolved, pairs = steps(batches.MAX_PAIRS)
    assert set(fixed_pairs) == {batches.PAIRS}
    assert max(pairs) > batches.PAIRS and max(pairs) <= batches.MAX_PAIRS
    assert resolved[-1] / resolved[0] < fixed[-1] / fixed[0]
    assert resolved[17] / resolved[2] <= 1.25  # the middle 80% of the derives within the rule's 1.2x, give or take a row


def test_a_steady_card_takes_the_first_pairs_only_and_the_source_gives_the_interval():
    from leadline.lookahead.derive.batches import PAIRS, step

    calls = []
    card = _drifting_card([False])

    def counted(rows, length, repeats=1):
        calls.append(rows)
        return card(rows, length, repeats)

    phase = step(_gsm_plan(), 5781.0, step_fn=counted, step_for="rows")
    res = phase.step.inputs["step_resolution"]
    assert len(calls) == 2 * PAIRS and res["pairs"] == PAIRS and res["resolved"]
    assert res["rows_p10"] == res["rows_p90"] == phase.step.rows_per_step
    assert f"timed in turn {PAIRS} times" in phase.values["tokens_per_step"].source
    given = step(_gsm_plan(), 5781.0, step_fn=_jittery_card(0, 0.15), rows_per_step=16).step
    assert "step_resolution" not in given.inputs and len(given.inputs["t_micro_repeats"]) == PAIRS


def test_a_noise_scale_past_the_bootstraps_reach_is_decided_by_the_first_pairs(monkeypatch):
    import leadline.lookahead.derive.batches as batches

    monkeypatch.setattr(batches, "MOST_ROWS", 50)  # B_noise 5,781 tokens at 96.8 a row: 60 rows
    sp = batches.step(_gsm_plan(), 5781.0, step_fn=_jittery_card(0, 0.15), step_for="rows").step
    assert "step_resolution" not in sp.inputs and len(sp.inputs["t_micro_repeats"]) == batches.PAIRS
