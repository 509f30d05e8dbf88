"""Where derive()'s seconds go: ``plan.phases`` holds a PhaseTime per phase, and on a clock that
moves only when a fake piece runs the phases' seconds add up to derive's wall time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from leadline.plan import PhaseTime, Plan
from test_derive_golden import _pieces, clock  # noqa: F401  (the fixture)


def _counting(pieces: dict) -> tuple[dict, dict]:
    calls = {"steps": 0}
    inner = pieces["pieces"].train_step_of

    def train_step_of(mb, accum):
        step = inner(mb, accum)

        def counted(t):
            calls["steps"] += 1
            return step(t)

        return counted

    return {**pieces, "pieces": replace(pieces["pieces"], train_step_of=train_step_of)}, calls


def test_the_phases_seconds_add_up_to_derives_wall_time(clock):  # noqa: F811
    from leadline.lookahead.derive import derive

    pieces, calls = _counting(_pieces(clock))
    t0 = clock()
    plan = derive(**pieces, total_steps=40, effort="full")
    wall = clock() - t0
    assert wall > 1.0  # the fakes moved the clock: there is something to account for
    assert plan.derive_seconds == pytest.approx(wall)
    assert sum(p.seconds for p in plan.phases) == pytest.approx(wall, rel=0.01)
    assert sum(p.steps for p in plan.phases) == calls["steps"] > 0
    by = {p.phase: p for p in plan.phases}
    assert list(by) == ["corpus", "noise", "memory", "step", "first_step", "past_format", "anchor", "rate", "warmup"]
    assert by["noise"].steps == by["memory"].steps == 0  # draws and rungs are not the run's steps
    assert by["past_format"].steps > 0 and by["rate"].steps > 0
    assert {"micro_batch", "grad_accum", "tokens_per_step"} <= set(by["step"].changed)
    assert by["noise"].changed == ()  # it feeds the step; it sets none of the numbers the run trains with
    assert "lr" in by["first_step"].changed  # alpha1: the rate the plan falls back to without a rate phase
    # at the step for the rows the look-ahead reads ahead within the 40-step run: the rate it measured
    # is the plan's, and the table says the rate phase changed it
    assert plan["lr"].source.startswith("look-ahead") and "lr" in by["rate"].changed
    # at the least-time step its budget stops it before its minimum horizon and the plan keeps the anchor:
    # the rate phase's steps moved no rate, and the table says so
    slow = derive(**_pieces(clock), total_steps=40, effort="full", step_for="time")
    slow_by = {p.phase: p for p in slow.phases}
    assert slow["lr"].source.startswith("the anchor") and "lr" not in slow_by["rate"].changed
    assert slow_by["rate"].steps > 0


def test_each_phase_says_how_much_of_it_was_steps_and_held_out_reads(clock):  # noqa: F811
    from leadline.lookahead.derive import derive

    pieces = _pieces(clock)
    reads = {"n": 0}
    inner = pieces["pieces"].held_out_losses

    def held_out_losses():
        reads["n"] += 1
        return inner()

    plan = derive(**{**pieces, "pieces": replace(pieces["pieces"], held_out_losses=held_out_losses)}, total_steps=40, effort="full")
    by = {p.phase: p for p in plan.phases}
    assert sum(p.reads for p in plan.phases) == reads["n"] > 0
    assert by["first_step"].reads > 0 and by["rate"].reads > 0 and by["noise"].reads == 0
    for p in plan.phases:  # the parts fit inside the phase, and steps take time on this clock
        assert p.step_seconds + p.read_seconds <= p.seconds + 1e-9, p
        assert (p.step_seconds > 0) == (p.steps > 0), p
    assert "held-out reads" in by["rate"].row() and "held-out reads" in plan.phase_table()
    assert Plan.from_json(plan.to_json()).phases == plan.phases


def test_a_cut_phase_keeps_its_seconds_and_the_table_still_adds_up(clock):  # noqa: F811
    from leadline.lookahead.derive import derive

    t0 = clock()
    plan = derive(**_pieces(clock), total_steps=400, effort="full", max_seconds=6.0, started=clock())
    wall = clock() - t0
    cut = [p for p in plan.phases if p.status == "cut"]
    # the budget runs out in a phase that trains on the run's rows (the rate; on a loaded machine the
    # burn-in past the format can be the one cut): it keeps the seconds and the steps it spent
    assert len(cut) == 1 and cut[0].phase in ("past_format", "rate") and cut[0].seconds > 0 and cut[0].steps > 0
    assert sum(p.seconds for p in plan.phases) == pytest.approx(wall, rel=0.01)


def test_the_table_is_in_the_report_and_survives_json():
    plan = Plan(phases=[PhaseTime("noise", 2.0), PhaseTime("rate", 8.5, 120, ("lr",)),
                        PhaseTime("past_format", 0.0, status="not_reached")], derive_seconds=11.0)
    text = plan.report()
    assert "where derive's seconds went:" in text
    assert "rate            8.5 s     120 steps  changed lr" in text
    assert "changed nothing (not reached)" in text
    assert "derive: 11.0 s wall, 10.5 s of it in the phases,\n    120 steps on the run's rows" in text
    back = Plan.from_json(plan.to_json())
    assert back.phases == plan.phases and back.derive_seconds == 11.0
    assert Plan.from_dict({"leadline_plan": 1, "values": {}}).phases == []  # an older plan has no table


def test_a_step_the_caller_fixes_shapes_the_rate_phases_and_the_length(clock):  # noqa: F811
    from leadline.lookahead.derive import derive

    pieces = _pieces(clock)
    shapes = []
    inner = pieces["pieces"].train_step_of

    def train_step_of(mb, accum):
        shapes.append((mb, accum))
        return inner(mb, accum)

    plan = derive(**{**pieces, "pieces": replace(pieces["pieces"], train_step_of=train_step_of)}, epochs=1.0, effort="full", rows_per_step=3)
    assert plan["tokens_per_step"].kind == "given" and plan.micro_batch * plan.grad_accum == 3
    per_row = plan.get("scored_tokens_per_row")
    assert plan.tokens_per_step == pytest.approx(3 * per_row)
    assert plan.total_steps == -(-plan.get("scored_tokens") // plan.tokens_per_step)  # one epoch at 3 rows a step
    assert (plan.micro_batch, plan.grad_accum) in shapes  # the look-ahead ran at the given step
    free = derive(**_pieces(clock), epochs=1.0, effort="full")
    assert free.micro_batch * free.grad_accum != 3  # the measured step differs: the argument moved it


def test_the_runs_own_steps_are_no_part_of_derives_seconds_and_every_line_fits_the_terminal():
    """The default run's table lists the run beside the opening; derive's line sums the opening
    alone (its wall time cannot be less than the phases it holds), and no line passes 100 columns."""
    plan = Plan(phases=[PhaseTime("memory", 0.5, 0, ("micro_batch",)),
                        PhaseTime("rate", 3.0, 20, (), step_seconds=2.2, reads=3, read_seconds=0.7),
                        PhaseTime("run", 9.5, 90)], derive_seconds=3.5)
    text = plan.phase_table()
    assert text.startswith("where the seconds went:")
    assert "derive: 3.5 s wall, 3.5 s of it in the phases,\n    20 steps on the run's rows (2.2 s), 3 held-out reads" in text
    assert "of it: steps 2.2 s, 3 held-out reads 0.7 s, the rest 0.1 s" in text
    assert all(len(line) <= 100 for line in text.splitlines()), text
