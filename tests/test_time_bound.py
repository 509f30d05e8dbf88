"""max_seconds before the first read or step: the memory phase's timings stand in for the
work not yet done, so derive does not start a first held-out read that cannot fit."""

from __future__ import annotations

import pytest

from leadline.corpus.splits import split_rows
from leadline.lookahead.budget import OutOfTime
from leadline.lookahead.derive.timed import held_estimate, step_estimate, timed_reads, timed_steps
from leadline.lookahead.runner import PhaseRunner
from leadline.plan import Plan, Skipped, Value


def _plan(t_micro: float = 2.0, rows_fit: int = 4, t_step: float = 0.5) -> Plan:
    plan = Plan()
    plan.set("t_micro_seconds", Value(t_micro, "measured", "memory phase", unit="s"))
    plan.set("rows_fit", Value(rows_fit, "measured", "memory phase", unit="rows"))
    plan.set("t_step_seconds", Value(t_step, "measured", "memory phase", unit="s"))
    return plan


def _reader(rows: int, calls: list[int]):
    def read():
        calls.append(1)
        return [1.0] * rows

    read.rows = rows
    return read


def test_the_first_read_is_estimated_from_the_memory_phase():
    # 2 s for 4 rows forward+backward: 0.5 s a row, a forward half that: 40 rows read in 10 s
    assert held_estimate(_plan(), _reader(40, []))() == pytest.approx(10.0)
    assert step_estimate(_plan())(4, 3) == pytest.approx(0.5 * 12 + 0.5)
    # nothing timed, or a reader that does not say its rows: no estimate, as before
    assert held_estimate(Plan(), _reader(40, []))() == 0.0
    assert held_estimate(_plan(), lambda: [1.0])() == 0.0


def test_a_first_read_that_cannot_fit_is_not_started(fake_clock):
    runner = PhaseRunner(Plan(), max_seconds=20.0, started=fake_clock() - 8.0)  # 12 s left
    calls: list[int] = []
    reader = _reader(40, calls)
    held = timed_reads(reader, runner.ensure, held_estimate(_plan(), reader))  # 10 s estimated, 15 with the margin
    with pytest.raises(OutOfTime):
        held()
    assert calls == []
    # the same read with the budget to spare runs
    roomy = PhaseRunner(Plan(), max_seconds=100.0)
    assert len(timed_reads(reader, roomy.ensure, held_estimate(_plan(), reader))()) == 40 and calls == [1]


def test_a_first_step_that_cannot_fit_is_not_started_and_shapes_are_timed_apart(fake_clock):
    runner = PhaseRunner(Plan(), max_seconds=20.0, started=fake_clock() - 8.0)
    taken: list[tuple[int, int]] = []

    def train_step_of(mb, accum):
        return lambda t: taken.append((mb, accum))

    of = timed_steps(train_step_of, runner.ensure, step_estimate(_plan()))
    of(1, 1)(0)  # 0.5 + 0.5 s estimated: runs
    with pytest.raises(OutOfTime):
        of(8, 2)(0)  # 16 rows: 8.5 s estimated, 12.75 with the margin, against 12 left: not started
    assert taken == [(1, 1)]


def test_split_reader_says_its_rows():
    split = split_rows(50, held_out=7, test=5, seed=0)
    assert split.reader(object(), list(range(50)), "held_out").rows == 7


def test_a_ramp_that_cannot_end_is_not_started(fake_clock):
    from types import SimpleNamespace

    from leadline.lookahead.derive.phases import memory
    from leadline.lookahead.derive.strategy import OneProcess

    plan = Plan()
    plan.set("seq_len", Value(32, "measured", "corpus", unit="tokens"))
    calls: list[tuple] = []

    def step_fn(rows, length, repeats=1):
        calls.append((rows, length))
        raise AssertionError("the ramp must not start")

    step_fn.device = "cpu"
    noise = SimpleNamespace(k=2, seconds=20.0)  # 10 s a draw: the least ramp about 20 s
    runner = PhaseRunner(plan, max_seconds=40.0, started=fake_clock() - 15.0)  # 25 s left, 30 needed with the margin
    with pytest.raises(OutOfTime):
        memory(step_fn, plan, None, None, noise, OneProcess(), runner=runner)
    assert calls == []


def test_a_phase_that_needs_an_unresolved_value_is_skipped_with_a_note():
    plan = Plan()
    plan.set("noise_scale_tokens", Value(None, "measured", "the noise scale did not resolve (stopped: time)", unit="scored tokens"))
    runner = PhaseRunner(plan, max_seconds=100.0)
    ran: list[int] = []
    assert runner.run("step", lambda: ran.append(1) or {}, needs=("noise_scale_tokens",)) is None
    assert ran == [] and plan.skipped == [Skipped("step", "needs", needs=("noise_scale_tokens",))]
    assert plan.notes == ["step: not run, it needs noise_scale_tokens, which no earlier phase produced or resolved"]


def test_training_a_plan_cut_short_names_the_cut_and_the_fix():
    from leadline.errors import InputError
    from leadline.train import train_with_plan

    plan = Plan()
    plan.set("lr", Value(4.6e-4, "constant", "the anchor", unit="per step"))
    plan.skipped.append(Skipped("step", "not_reached", max_seconds=40.0))
    with pytest.raises(InputError, match=r"no micro_batch: its derive ran out of time \(step: not reached within max_seconds=40\); derive again with a larger --max-seconds"):
        train_with_plan(None, None, [], plan)
    with pytest.raises(InputError, match="derive it with `leadline derive`"):
        train_with_plan(None, None, [], Plan())


def test_without_the_memory_phase_the_noise_draws_stand_in_for_the_first_estimates():
    from types import SimpleNamespace

    from leadline.lookahead.derive.recipe import _draw_row_seconds

    # 4 draws of 2 rows in 8 s: a row's forward+backward 1 s; a 40-row read forward only 20 s
    per_row = _draw_row_seconds(SimpleNamespace(k=4, seconds=8.0), SimpleNamespace(rows_per_draw=2))
    assert per_row == pytest.approx(1.0)
    assert held_estimate(Plan(), _reader(40, []), per_row)() == pytest.approx(20.0)
    assert step_estimate(Plan(), per_row)(4, 3) == pytest.approx(12.0)
    assert held_estimate(_plan(), _reader(40, []), per_row)() == pytest.approx(10.0)  # the ramp's timings first
    assert _draw_row_seconds(SimpleNamespace(k=4, seconds=8.0), object()) is None  # no rows a draw: no stand-in
    assert _draw_row_seconds(None, SimpleNamespace(rows_per_draw=2)) is None


def test_a_first_read_is_not_started_past_the_budget_when_the_memory_phase_was_cut(monkeypatch):
    """max_seconds spent in the noise and the ramp: the first step's first held-out read, which by
    the noise draws would take far longer than what is left, is not started (with no estimate, a
    CPU derive bounded at 15 s would start a 17 s read)."""
    from peft import LoraConfig, get_peft_model

    import leadline.hf.deriving as hf
    from helpers import DATA, FakeClock, install_clock, make_model, make_tokenizer
    from leadline.lookahead.budget import OutOfTime
    from leadline.lookahead.derive import phases

    def cut(*a, **k):
        raise OutOfTime

    monkeypatch.setattr(phases, "memory", cut)
    monkeypatch.setattr(phases, "draw_seconds", lambda noise: 50.0)  # a draw as slow as an 8B model's
    install_clock(monkeypatch, FakeClock(tick=1e-4))  # every reading 0.1 ms: the same budget left on every machine
    tok = make_tokenizer()
    model = get_peft_model(make_model(vocab_size=len(tok)), LoraConfig(r=4, target_modules="all-linear",
                                                                        task_type="CAUSAL_LM"))
    plan = hf.derive_for(model, tok, str(DATA / "prompt_completion.jsonl"), total_steps=8, effort="full",
                         options=hf.DeriveOptions(max_seconds=60.0))
    first = next(t for t in plan.phases if t.phase == "first_step")
    assert first.status == "cut" and first.reads == 0 and first.seconds < 5.0
    assert any(n.startswith("first_step: cut by max_seconds=60") for n in plan.notes), plan.notes
