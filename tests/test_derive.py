"""derive() end to end on the tiny Llama, and the promise that it leaves no trace."""

from __future__ import annotations

import json
import random

import pytest

from helpers import DATA
from leadline import InputError, Plan, Value
from leadline.lookahead.digest import tensors_digest
from leadline.lookahead.pieces import Corpus, Pieces


def _lora(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM"))


def _global_hooks() -> tuple[int, int, int]:
    import torch
    from torch.nn.modules import module as m
    from torch.optim import optimizer as o

    return (len(m._global_forward_pre_hooks), len(m._global_forward_hooks),
            len(o._global_optimizer_post_hooks) + len(o._global_optimizer_pre_hooks) + 0 * torch.zeros(0).numel())


@pytest.fixture(scope="module")
def derived(tmp_path_factory):
    """One derive_for on the tiny LoRA model, with everything it should leave untouched recorded."""
    import torch

    from helpers import make_model, make_tokenizer
    from leadline.hf import DeriveOptions, derive_for

    tok = make_tokenizer()
    model = _lora(make_model(vocab_size=len(tok)))
    torch.manual_seed(123)
    random.seed(5)
    before = {
        "digest": tensors_digest(list(model.parameters())),
        "rng": torch.random.get_rng_state().clone(),
        "py": random.getstate(),
        "hooks": _global_hooks(),
        "training": model.training,
    }
    events: list[dict] = []
    # enough rows for a burn-in past the format and a reading on rows past it (docs/noise.md): the shipped rows, repeated
    lines = (DATA / "prompt_completion.jsonl").read_text().splitlines()
    data = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    data.write_text("\n".join((lines * (1 + 400 // len(lines)))[:400]) + "\n")
    plan = derive_for(model, tok, str(data), total_steps=12, effort="full",
                      options=DeriveOptions(on_progress=events.append))
    after = {
        "digest": tensors_digest(list(model.parameters())),
        "rng": torch.random.get_rng_state().clone(),
        "py": random.getstate(),
        "hooks": _global_hooks(),
        "training": model.training,
        "grads": [p.grad for p in model.parameters()],
    }
    return plan, before, after, events


def test_plan_has_every_phase(derived):
    plan, _, _, events = derived
    for name in ("seq_len", "scored_tokens", "noise_scale_tokens", "rows_fit", "t_micro_seconds", "t_step_seconds",
                 "tokens_per_step", "micro_batch", "grad_accum", "alpha1", "lr", "warmup_steps", "weight_decay", "total_steps"):
        assert name in plan, f"{name} missing from the plan: {list(plan)}"
    assert plan.micro_batch <= plan.rows_fit
    # full effort: the look-ahead's rate, or the anchor (a constant, and listed as one) where it was cut short
    assert "lookahead_horizon_steps" in plan and "race_rates" not in plan
    if plan["lr"].kind == "constant":
        assert plan.lr == plan.lr_anchor and plan["lr"].source.startswith("the anchor") and "lr" in plan.constants()
    else:
        assert plan["lr"].kind == "measured" and plan["lr"].source.startswith("look-ahead")
    assert plan["rate_divisor"].kind == "constant" and "rate_divisor" in plan.constants()
    done = [e["phase"] for e in events if e["status"] == "done"]
    assert done[:3] == ["corpus", "noise", "memory"]
    assert "past_format" in done and "noise_scale_past_format_tokens" in plan
    # the late reading draws the burn-in's rows at a time (the same on every card: accumulated where fewer fit),
    # never fewer than the step-0 probe's 2
    ev = plan["noise_scale_past_format_tokens"].evidence
    assert ev["rows_per_draw"] == max(2, ev["rows_per_step"]) and ev["rows_per_step"] >= plan.rows_fit
    assert plan.model["trained_as"] == "factors" and plan.model["trained_parameters"] > 0
    assert plan.data["sha256"] and plan.machine["torch"]


def test_held_out_rows_come_back_as_data(derived):
    plan = derived[0]
    h = plan.held_out
    assert h["held_out"] and h["test"] and h["train"]
    assert not set(h["held_out"]) & set(h["test"]) and not set(h["train"]) & set(h["held_out"])
    assert sorted(h["train"] + h["held_out"] + h["test"]) == list(range(plan.rows))


def test_derive_leaves_no_trace(derived):
    import torch

    _, before, after, _ = derived
    assert after["digest"] == before["digest"], "weights changed"
    assert torch.equal(after["rng"], before["rng"]), "torch RNG not restored"
    assert after["py"] == before["py"], "Python RNG not restored"
    assert after["hooks"] == before["hooks"], "global hooks left behind"
    assert after["training"] == before["training"]
    assert all(g is None for g in after["grads"])


def test_plan_round_trips_and_reports(derived, tmp_path):
    plan = derived[0]
    plan.to_json(tmp_path / "p.json")
    assert Plan.from_json(tmp_path / "p.json") == plan
    from leadline.report.html import write_html

    page = write_html(plan, tmp_path / "r.html").read_text()
    assert page.count("<svg") >= 4  # ramp, noise probe, first step, past the format
    from leadline.report.plots import render_svg

    assert "<svg" in (render_svg(plan["noise_scale_past_format_tokens"].evidence) or "")


# ---- the guard, phase by phase, on a cheap generic derive ------------------------------
def _toy():
    import torch

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 4))
    xs = torch.randn(64, 4)
    true = torch.randn(8, 4)
    ys = xs @ true.T
    hx = torch.randn(16, 4)
    held = (hx, hx @ true.T)
    opt = torch.optim.AdamW([w], lr=1e-3)

    def train_step_of(mb, accum):
        def step(t):
            i = (t * mb) % 56
            loss = ((xs[i:i + mb] @ w.T - ys[i:i + mb]) ** 2).mean()
            loss.backward()
            return float(loss)

        return step

    def held_out():
        with torch.no_grad():
            return [float(v) for v in ((held[0] @ w.T - held[1]) ** 2).mean(dim=1)]

    return w, opt, train_step_of, held_out


PHASES = ["anchor", "first_step", "rate", "warmup"]


@pytest.mark.parametrize("phase", PHASES)
def test_exception_in_any_phase_restores_everything(phase, monkeypatch):
    import torch

    import leadline.lookahead.derive as d
    from leadline.lookahead.derive import phases

    w, opt, train_step_of, held_out = _toy()
    digest = tensors_digest([w])
    rng = torch.random.get_rng_state().clone()
    real = getattr(phases, phase)

    def broken(*a, **k):
        with torch.no_grad():
            w.add_(1.0)
        torch.rand(3)
        opt.param_groups[0]["lr"] = 99.0
        if phase != "warmup":
            real(*a, **k)
        raise RuntimeError(f"boom in {phase}")

    monkeypatch.setattr(phases, phase, broken)
    with pytest.raises(RuntimeError, match="boom"):
        d.derive(pieces=Pieces(weights=[("w", w)], trained_as="weights", optimizer=opt, train_step_of=train_step_of, held_out_losses=held_out), total_steps=20)
    assert tensors_digest([w]) == digest
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert opt.param_groups[0]["lr"] == 1e-3 and not opt.state


def test_generic_derive_measures_the_rate_on_a_toy():
    w, opt, train_step_of, held_out = _toy()
    from leadline.lookahead.derive import derive

    plan = derive(pieces=Pieces(weights=[("w", w)], trained_as="weights", optimizer=opt, train_step_of=train_step_of, held_out_losses=held_out), total_steps=20)
    assert plan["alpha1"].kind == "measured" and plan.alpha1 > 0
    assert "lr" in plan and plan.warmup_steps == 0
    assert plan["warmup_steps"].kind == ("constant" if plan.lr > plan.alpha1 else "derived")


def test_resume_continues_after_a_kill(tmp_path, monkeypatch):
    import leadline.lookahead.derive as d
    from leadline.lookahead.derive import phases

    w, opt, train_step_of, held_out = _toy()
    resume = tmp_path / "derive.json"
    real = phases.rate

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(phases, "rate", killed)
    with pytest.raises(KeyboardInterrupt):
        d.derive(pieces=Pieces(weights=[("w", w)], trained_as="weights", optimizer=opt, train_step_of=train_step_of, held_out_losses=held_out), total_steps=20, resume=resume)
    saved = json.loads(resume.read_text())
    assert saved["finished"] == ["first_step", "anchor"]
    monkeypatch.setattr(phases, "rate", real)
    calls = []
    real_first = phases.first_step
    monkeypatch.setattr(phases, "first_step", lambda *a, **k: calls.append(1) or {})
    events: list[dict] = []
    plan = d.derive(pieces=Pieces(weights=[("w", w)], trained_as="weights", optimizer=opt, train_step_of=train_step_of, held_out_losses=held_out), total_steps=20, resume=resume, on_progress=events.append)
    assert not calls, "a finished phase ran again"
    assert {"phase": "first_step", "status": "resumed"}.items() <= next(e for e in events if e["phase"] == "first_step").items()
    assert "alpha1" in plan and "lr" in plan
    assert not resume.exists()
    # the resumed plan is the uninterrupted one: same numbers, phase by phase (the toy is deterministic)
    monkeypatch.setattr(phases, "first_step", real_first)
    w2, opt2, step_of2, held2 = _toy()
    whole = d.derive(pieces=Pieces(weights=[("w", w2)], trained_as="weights", optimizer=opt2, train_step_of=step_of2, held_out_losses=held2), total_steps=20)
    assert {n: plan[n].value for n in plan} == {n: whole[n].value for n in whole}


def test_max_seconds_lists_what_it_did_not_reach(monkeypatch, fake_clock):
    import leadline.lookahead.derive as d
    from leadline.lookahead.derive import phases

    w, opt, train_step_of, held_out = _toy()
    real = phases.first_step

    def slow(*a, **k):
        out = real(*a, **k)
        fake_clock.advance(0.3)
        return out

    monkeypatch.setattr(phases, "first_step", slow)
    plan = d.derive(pieces=Pieces(weights=[("w", w)], trained_as="weights", optimizer=opt, train_step_of=train_step_of, held_out_losses=held_out), total_steps=20, max_seconds=0.2)
    assert any("rate: not reached within max_seconds" in n for n in plan.notes)
    # the anchor is arithmetic and runs past the budget; the lower of alpha1 and it stands in for the rate not reached
    assert "lr_anchor" in plan and plan.lr == min(plan.alpha1, plan.lr_anchor)


def test_max_seconds_counts_from_started_when_given(fake_clock):
    import leadline.lookahead.derive as d

    w, opt, train_step_of, held_out = _toy()
    # a wrapper's set-up already spent the budget: no timed phase starts, the arithmetic still runs
    plan = d.derive(pieces=Pieces(weights=[("w", w)], trained_as="weights", optimizer=opt, train_step_of=train_step_of, held_out_losses=held_out), total_steps=20, max_seconds=5, started=fake_clock() - 6)
    assert any("first_step: not reached within max_seconds" in n for n in plan.notes)
    assert "alpha1" not in plan and "lr_anchor" in plan


def test_bad_arguments_are_one_sentence():
    from leadline.lookahead.derive import derive

    with pytest.raises(InputError, match="effort"):
        derive(effort="fast")
    with pytest.raises(InputError, match=r"^effort='quick' was removed: derive\(\) runs the full effort"):
        derive(effort="quick")
    with pytest.raises(InputError, match="trained_as"):
        derive(pieces=Pieces(trained_as="adapters"))
    with pytest.raises(InputError, match="total_steps or epochs"):
        derive(total_steps=3, epochs=1)
    with pytest.raises(InputError, match="max_seconds"):
        derive(max_seconds=0)


def _slowed(train_step_of, seconds, clock):
    """train_step_of whose every step first moves ``clock`` by ``seconds`` (a slow card, for max_seconds)."""

    def of(mb, accum):
        inner = train_step_of(mb, accum)

        def step(t):
            clock.advance(seconds)
            return inner(t)

        return step

    return of


def test_max_seconds_cuts_a_running_lookahead_and_restores_state(monkeypatch, fake_clock):
    import torch

    import leadline.lookahead.derive as d

    w, opt, train_step_of, held_out = _toy()
    digest = tensors_digest([w])

    slow_step_of = _slowed(train_step_of, 0.01, fake_clock)
    t0 = fake_clock()
    plan = d.derive(pieces=Pieces(weights=[("w", w)], trained_as="weights", optimizer=opt, train_step_of=slow_step_of, held_out_losses=held_out), total_steps=400, effort="full", max_seconds=1.5)
    took = fake_clock() - t0
    assert took <= 1.5, f"max_seconds=1.5 was not a bound: derive took {took:.2f} s"
    # the look-ahead read at least its first horizon, short of its 50-step minimum (400 / 8): the
    # rate is the lower of what it read and the anchor, and the plan keeps what it read either way
    assert "max_seconds: cut inside" in plan["lr"].source, plan["lr"].source
    read = plan["lookahead_horizon_steps"].value
    assert read < 50
    la = plan["lr"].evidence.get("lookahead", plan["lr"].evidence)
    assert la["horizons"] and plan.lr == min(la["chosen_lr"], plan.lr_anchor)
    if plan.lr == plan.lr_anchor:
        assert plan["lr"].kind == "constant" and f"at {read} steps, before its 50-step minimum horizon" in plan["lr"].source
    else:
        assert plan["lr"].kind == "measured"
    assert tensors_digest([w]) == digest and not opt.state
    assert torch.isfinite(torch.tensor(plan.lr))


def test_a_short_run_reads_fewer_rates_around_the_anchor_from_its_minimum_horizon():
    import leadline.lookahead.derive as d

    w, opt, train_step_of, held_out = _toy()
    # 24 steps: the default grid (5 rates) cannot reach the 16-step minimum horizon on 2 x 24 steps
    plan = d.derive(pieces=Pieces(weights=[("w", w)], trained_as="weights", optimizer=opt, train_step_of=train_step_of, held_out_losses=held_out), total_steps=24, effort="full")
    assert plan["lookahead_horizon_steps"].value >= 16
    lr = plan["lr"]
    assert lr.kind == "measured" and "a short run: 24 steps" in lr.source and "3 rates around the anchor" in lr.source, lr.source
    rates = sorted(lr.evidence["rates"])
    assert len(rates) >= 3 and max(rates) <= plan.alpha1 * (1 + 1e-9)
    assert rates[0] <= plan.lr_anchor <= rates[-1]  # around the anchor
    assert lr.evidence["steps_used"] <= 48


def test_a_lookahead_its_budget_stops_before_the_minimum_horizon_gives_the_lower_of_its_answer_and_the_anchor():
    from types import SimpleNamespace

    from leadline.lookahead.rate.policy import cut_rate

    plan = Plan()
    plan.set("lr_anchor", Value(4.57e-4, "constant", "rewrite / 32"))
    # the H200's 37-step plan: the budget stopped the look-ahead at 10 steps, its answer 4.82e-3
    la = SimpleNamespace(lr=4.82e-3, horizon_steps=10, stop="budget", stopped_because="budget: horizon 20 needed 40 more steps, 24 left",
                         evidence=lambda: {"plot": "lookahead"})
    out = cut_rate(plan, la, 37)["lr"]
    assert out.value == 4.57e-4 and out.kind == "constant"
    assert "its step budget stopped the look-ahead at 10 steps, before its 16-step minimum horizon" in out.source
    assert cut_rate(plan, SimpleNamespace(lr=4.82e-3, horizon_steps=16, stop="budget", stopped_because="budget", evidence=dict), 37) == {}
    assert cut_rate(plan, SimpleNamespace(lr=3e-4, horizon_steps=10, stop="budget", stopped_because="budget", evidence=dict), 37) == {}


def test_a_lookahead_cut_before_its_first_horizon_falls_back_to_the_lower_of_alpha1_and_the_anchor(fake_clock):
    import leadline.lookahead.derive as d

    w, opt, train_step_of, held_out = _toy()

    slow_step_of = _slowed(train_step_of, 0.05, fake_clock)
    plan = d.derive(pieces=Pieces(weights=[("w", w)], trained_as="weights", optimizer=opt, train_step_of=slow_step_of, held_out_losses=held_out), total_steps=400, effort="full", max_seconds=0.6)
    assert any("rate: cut by max_seconds" in n for n in plan.notes), plan.notes
    assert plan.lr == min(plan.alpha1, plan.lr_anchor)
    if plan.lr_anchor < plan.alpha1:  # alpha1 is the best single step, not a rate to hold
        assert plan["lr"].kind == "constant" and "the look-ahead did not finish" in plan["lr"].source
    else:
        assert plan["lr"].kind == "measured"


def test_warmup_is_in_the_plan_even_when_time_ran_out(monkeypatch, fake_clock):
    import leadline.lookahead.derive as d
    from leadline.lookahead.derive import phases

    w, opt, train_step_of, held_out = _toy()
    real = phases.first_step
    monkeypatch.setattr(phases, "first_step", lambda *a, **k: (fake_clock.advance(0.3), real(*a, **k))[1])
    plan = d.derive(pieces=Pieces(weights=[("w", w)], trained_as="weights", optimizer=opt, train_step_of=train_step_of, held_out_losses=held_out), total_steps=20, max_seconds=0.1)
    assert "warmup_steps" in plan and "weight_decay" in plan


def test_killed_inside_the_lookahead_resumes_to_the_uninterrupted_plan(tmp_path):
    from leadline.lookahead.derive import derive

    def run(resume=None, kill_at=None):
        w, opt, step_of, held = _toy()
        calls = {"n": 0}

        def killing_step_of(mb, accum):
            inner = step_of(mb, accum)

            def step(t):
                calls["n"] += 1
                if kill_at is not None and calls["n"] == kill_at:
                    raise KeyboardInterrupt
                return inner(t)

            return step

        return derive(pieces=Pieces(weights=[("w", w)], trained_as="weights", optimizer=opt, train_step_of=killing_step_of, held_out_losses=held), total_steps=40, effort="full", resume=resume), calls["n"]

    whole, n_calls = run()
    assert n_calls > 10, "the look-ahead ran too few steps for the test to kill it inside"
    resume = tmp_path / "derive.json"
    with pytest.raises(KeyboardInterrupt):
        run(resume=resume, kill_at=n_calls - 3)  # late: inside the look-ahead
    assert "rate" not in json.loads(resume.read_text())["finished"]
    resumed, _ = run(resume=resume)
    assert {n: resumed[n].value for n in resumed} == {n: whole[n].value for n in whole}
    assert resumed["lr"].evidence == whole["lr"].evidence


def test_full_effort_on_the_tiny_model_runs_the_lookahead():
    from helpers import make_model, make_tokenizer
    from leadline.hf import derive_for

    tok = make_tokenizer()
    model = _lora(make_model(vocab_size=len(tok)))
    digest = tensors_digest(list(model.parameters()))
    plan = derive_for(model, tok, str(DATA / "prompt_completion.jsonl"), total_steps=64, effort="full")
    assert plan["lr"].kind == "measured" and plan["lr"].source.startswith("look-ahead:")
    assert plan["lr"].evidence["plot"] == "lookahead" and plan["lr"].evidence["horizons"]
    assert tensors_digest(list(model.parameters())) == digest


def test_a_resume_file_from_another_run_is_refused(tmp_path, monkeypatch):
    import leadline.lookahead.derive as d
    from leadline.lookahead.derive import phases

    w, opt, train_step_of, held_out = _toy()
    resume = tmp_path / "derive.json"
    monkeypatch.setattr(phases, "rate", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        d.derive(pieces=Pieces(weights=[("w", w)], trained_as="weights", optimizer=opt, train_step_of=train_step_of, held_out_losses=held_out), total_steps=20, resume=resume)
    saved = resume.read_text()
    with pytest.raises(InputError, match=r"different run \(total_steps differ\)"):
        d.derive(pieces=Pieces(weights=[("w", w)], trained_as="weights", optimizer=opt, train_step_of=train_step_of, held_out_losses=held_out), total_steps=30, resume=resume)
    assert resume.read_text() == saved  # refused before anything was written


def test_prior_plan_is_checked_not_rederived():
    from leadline.lookahead.derive import derive

    w, opt, train_step_of, held_out = _toy()
    first = derive(pieces=Pieces(weights=[("w", w)], trained_as="weights", optimizer=opt, train_step_of=train_step_of, held_out_losses=held_out), total_steps=20, effort="full")
    again = derive(pieces=Pieces(weights=[("w", w)], trained_as="weights", optimizer=opt, train_step_of=train_step_of, held_out_losses=held_out), total_steps=20, effort="full", prior=first)
    assert again.lr == first.lr and "prior plan's rate, kept" in again["lr"].source
    assert again["alpha1"].kind == "measured"


def test_max_seconds_stops_before_a_read_that_would_not_fit(fake_clock):
    """A held-out read that takes 0.3 s: derive does not start one it has no time left for, so
    it ends within max_seconds (before the fix it overran by up to one read)."""
    from leadline.lookahead.derive import derive

    w, opt, train_step_of, held_out = _toy()

    def slow_read():
        fake_clock.advance(0.3)
        return held_out()

    t0 = fake_clock()
    plan = derive(pieces=Pieces(weights=[("w", w)], trained_as="weights", optimizer=opt, train_step_of=train_step_of, held_out_losses=slow_read), total_steps=400, effort="full", max_seconds=1.0)
    took = fake_clock() - t0
    assert 0 < took <= 1.0, f"derive took {took:.2f} s against max_seconds 1.0"
    assert any("max_seconds" in n for n in plan.notes), plan.notes


def _grown_past_format(monkeypatch, rung_seconds, step_for="rows"):
    """The past_format phase with a reading that grew to 200 tokens, a first ramp that stopped at its
    upper limit of 4 rows, and a fake ramp whose every rung takes ``rung_seconds``."""
    from types import SimpleNamespace

    import torch

    import leadline.lookahead.memory as memory
    import leadline.lookahead.noise.past_format as pfm
    from leadline.lookahead.derive import phases
    from leadline.lookahead.runner import PhaseRunner
    from leadline.plan import Plan, Value

    plan = Plan()
    plan.set("noise_scale_tokens", Value(3.0, "measured", "step 0", {"se_tokens": 0.5}, unit="scored tokens"))
    plan.set("rows_fit", Value(4, "measured", "ramp", {"stop": "upper_limit", "stopped_because": "reached the upper limit of 4 rows"}, unit="rows"))
    for name, v in (("scored_tokens_per_row", 2.0), ("alpha1", 0.01), ("seq_len", 32), ("rows", 400),
                    ("t_micro_seconds", 0.2), ("t_step_seconds", 0.01), ("scored_tokens", 800)):
        plan.set(name, Value(v, "measured", "given here"))
    pf = SimpleNamespace(grew=True, noise=200.0, b_noise_tokens=200.0, se_tokens=20.0,
                         as_values=lambda: {"noise_scale_past_format_tokens": Value(200.0, "measured", "read", {"plot": "past_format"})})
    monkeypatch.setattr(pfm, "noise_past_format", lambda *a, **k: pf)
    ramps = []

    def fake_ramp(step, length, *, lengths=None, max_rows=None, start_rows=1, on_rung=None, **kw):
        ramps.append((start_rows, max_rows))
        if on_rung is not None:
            on_rung(SimpleNamespace(seconds=rung_seconds))
        return SimpleNamespace(as_values=lambda: {"micro_batch": Value(max_rows, "measured", "fake ramp", unit="rows")})

    monkeypatch.setattr(memory, "ramp", fake_ramp)
    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([w])
    # one row 0.19 s, the rows that fit 0.2 s (the plan's t_micro), the update 0.01 s (its t_step)
    step_fn = lambda rows, length, repeats=1: SimpleNamespace(micro_seconds=[0.19 if rows == 1 else 0.2] * repeats,  # noqa: E731
                                                              step_seconds=[0.01] * repeats)
    runner = PhaseRunner(plan, max_seconds=30.0)
    before = (dict(plan.values), list(plan.notes))
    burned = phases.past_format([w], opt, lambda mb, acc: (lambda t: 0.0), object(), step_fn, plan, None, None,
                                runner, step_for=step_for)
    assert (plan.values, plan.notes) == before  # the phase returns what it decided and changes nothing
    for name, v in burned.as_values().items():  # applied as derive() applies it: the values, then the notes
        plan.set(name, v)
    plan.notes.extend(burned.notes)
    return plan, burned.as_values(), ramps


def _step_rows_at_four(step_for):
    """The rows the grown reading's step wants, timed at the 4 rows the first ramp kept."""
    from leadline.lookahead.noise.step import tokens_per_step

    return tokens_per_step(200.0, rows_fit=4, tokens_per_micro_batch=8.0, t_step_seconds=0.01, t_micro_seconds=0.2,
                           corpus_scored_tokens=800, t_micro_one_row_seconds=[0.19] * 3,
                           step_for=step_for).inputs["rows_wanted"]


@pytest.mark.parametrize("step_for", ["rows", "time"])
def test_a_grown_reading_ramps_on_as_far_as_the_step_takes(monkeypatch, step_for):
    """The noise's upper edge is ceil((200 + 20) / 2) = 110 rows; the step timed at the 4 rows measured
    wants fewer (at most B_noise's 100 rows), and the ramp goes on only that far."""
    wanted = _step_rows_at_four(step_for)
    assert 4 < wanted < 110
    plan, out, ramps = _grown_past_format(monkeypatch, rung_seconds=0.01, step_for=step_for)
    assert ramps == [(4, wanted)]
    assert out["rows_fit"].value == wanted and plan.rows_fit == wanted
    assert out["tokens_per_step"].value > 3.0 * 2  # taken from the grown reading, not step 0's
    assert any(n.startswith(f"past_format: the step takes {wanted} rows") and "not the 110" in n for n in plan.notes)


def test_a_step_within_the_rows_measured_ramps_no_further(monkeypatch):
    """A step that wants no more rows than the first ramp kept: no rung is run past the format."""
    import leadline.lookahead.noise.step as st

    real = st.rows_step_rule
    monkeypatch.setattr(st, "rows_step_rule", lambda *a, **k: {**real(*a, **k), "rows": 3})
    plan, out, ramps = _grown_past_format(monkeypatch, rung_seconds=0.01)
    assert ramps == [] and "rows_fit" not in out and plan.rows_fit == 4
    assert out["micro_batch"].value * out["grad_accum"].value == 3


def test_a_reramp_cut_by_max_seconds_keeps_the_rows_it_had(monkeypatch):
    plan, out, ramps = _grown_past_format(monkeypatch, rung_seconds=1e6)  # no second rung of that length fits in 30 s
    assert ramps == [(4, _step_rows_at_four("rows"))] and "rows_fit" not in out and plan.rows_fit == 4
    assert any("cut by max_seconds" in n and "the 4 rows kept" in n for n in plan.notes), plan.notes
    assert out["micro_batch"].value <= 4 and "tokens_per_step" in out  # grad_accum makes up the step


def test_under_max_seconds_the_ramp_leaves_time_for_the_phases_after_it(fake_clock):
    """A slow card: every ramp rung takes 0.15 s and rows per second keep improving. Under
    max_seconds=3 the ramp stops within its share of the time (0.3 of what is left) and keeps
    what it measured, and the phases after it still run (before the share, a CPU derive's ramp
    took the whole budget)."""
    from leadline.lookahead.derive import derive
    from test_memory_fakes import FakeHost, FakeHostStep

    w, opt, train_step_of, held_out = _toy()
    fake = FakeHostStep(FakeHost(room=10**12), seconds_of=lambda r: 0.1 + 0.001 * r)  # rows/s improve to ~1000 rows

    def slow(rows, length, repeats=1):
        fake_clock.advance(0.15)
        return fake(rows, length, repeats=repeats)

    slow.device = "cpu"
    t0 = fake_clock()
    plan = derive(Corpus(seq_len=16), Pieces(weights=[("w", w)], trained_as="weights", optimizer=opt, train_step_of=train_step_of, held_out_losses=held_out, step=slow), total_steps=50, max_seconds=3.0)
    assert plan["rows_fit"].evidence["stopped_because"].startswith("max_seconds")
    assert 1 < plan.rows_fit < 1024 and len(fake.calls) <= 1 + 0.3 * 3.0 / 0.15 + 1
    assert "alpha1" in plan and "lr" in plan  # the phases after the ramp ran
    assert fake_clock() - t0 <= 3.0


@pytest.mark.parametrize("train_rows, burns_in", [(287, False), (288, True)])
def test_past_the_format_a_corpus_too_small_for_a_burn_in_and_a_reading_after_it_is_not_burned_in(
        monkeypatch, train_rows, burns_in):
    """A source that draws the run's rows finds none left past the burn-in's when the rows cannot
    hold one round of it (10 steps of 16 rows) and the probe's 8 draws of 16 rows past them: 288
    rows. Below that the phase trains nothing and says why; from it on, it burns in."""
    from types import SimpleNamespace

    import torch

    import leadline.lookahead.noise.past_format as pfm
    from leadline.lookahead.derive import phases
    from leadline.lookahead.runner import PhaseRunner
    from leadline.plan import Plan, Value

    plan = Plan()
    plan.set("noise_scale_tokens", Value(30.0, "measured", "step 0", {"se_tokens": 2.0}, unit="scored tokens"))
    plan.set("rows_fit", Value(16, "measured", "ramp", {"stop": "upper_limit"}, unit="rows"))
    for name, v in (("scored_tokens_per_row", 2.0), ("alpha1", 0.01), ("seq_len", 32), ("rows", train_rows)):
        plan.set(name, Value(v, "measured", "given here"))
    called = []
    unresolved = SimpleNamespace(grew=False, noise=None, as_values=lambda: {
        "noise_scale_past_format_tokens": Value(None, "measured", "read", {"plot": "past_format"})})
    monkeypatch.setattr(pfm, "noise_past_format", lambda *a, **k: called.append(k["max_steps"]) or unresolved)
    source = SimpleNamespace(rows_per_draw=16)  # a CountedSource: it draws 16 of the run's rows at a time
    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([w])
    out = phases.past_format([w], opt, lambda mb, acc: (lambda t: 0.0), source, None, plan, None, None,
                             PhaseRunner(plan, max_seconds=None)).as_values()
    assert bool(called) == burns_in
    v = out["noise_scale_past_format_tokens"]
    assert v.value is None
    if not burns_in:
        assert v.source.startswith(f"not read: the {train_rows} training rows cannot hold a round of the burn-in "
                                   "(10 steps of 16 rows) and the probe's 8 draws of 16 rows")
        assert v.evidence["rows_needed"] == 288 and v.kind == "derived"  # arithmetic on the rows: nothing was read


def test_from_leadline_import_derive_calls_derive_once_the_package_is_imported():
    import leadline.lookahead.derive.recipe  # noqa: F401  (Python now sets the package as leadline.lookahead.derive)
    from leadline import Corpus, derive
    from leadline.lookahead.distributed import scale_out
    from leadline.plan import Plan

    assert derive(Corpus(seq_len=64), total_steps=10).total_steps == 10
    with pytest.raises(InputError):  # the function's own check of its plan, reached through the name
        scale_out(Plan())
