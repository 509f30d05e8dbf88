"""The plan inside Hugging Face Trainer: the schedule sets the rate and checks, the cap is lifted."""

from __future__ import annotations

import pytest

from helpers import DATA, FakeClock, install_clock, make_model, make_tokenizer


def _lora(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM"))


@pytest.fixture(scope="module")
def setup():
    tok = make_tokenizer()
    model = _lora(make_model(vocab_size=len(tok)))
    from leadline.hf import derive_for

    plan = derive_for(model, tok, str(DATA / "prompt_completion.jsonl"), total_steps=8, effort="full")
    return tok, model, plan


def test_trainer_runs_the_schedule(setup, tmp_path):
    import torch
    from torch.nn.modules import module as m
    from transformers import Trainer, TrainingArguments

    from leadline.corpus import collate, tokenize_rows
    from leadline.hf.callback import LeadlineCallback

    tok, model, plan = setup
    rows = list(tokenize_rows(str(DATA / "prompt_completion.jsonl"), tok))
    ds = [{"input_ids": r.input_ids, "labels": r.labels} for r in rows]

    def collator(feats):
        from leadline.corpus import TokenizedRow

        mb = collate([TokenizedRow.from_labels(f["input_ids"], f["labels"]) for f in feats], tok.pad_token_id)
        return mb.model_inputs()

    from leadline.hf import training_arguments

    args = training_arguments(plan, TrainingArguments(output_dir=str(tmp_path), report_to=[], logging_steps=100,
                                                      save_strategy="no", use_cpu=True, remove_unused_columns=False),
                              max_steps=8)
    assert args.learning_rate == plan.lr and args.lr_scheduler_type == "constant_with_warmup"
    cb = LeadlineCallback.for_plan(plan, model, tok, str(DATA / "prompt_completion.jsonl"))
    hooks_before = len(m._global_forward_pre_hooks)
    seen: list[float] = []

    class Spy(LeadlineCallback.__mro__[1]):  # a TrainerCallback reading the rate each step
        def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kw):
            seen.append(optimizer.param_groups[0]["lr"])

    trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=collator, callbacks=[cb, Spy()])
    trainer.train()
    ev = cb.evidence()
    assert ev is not None and ev["checks"], "the schedule never checked"
    assert ev["checks"][0]["step"] == 0
    assert "ending" in ev and ev["ending"] is not None
    # the warmup rises from alpha1 toward the plan's rate: the schedule, not Trainer's scheduler, set it
    assert seen and seen[0] == pytest.approx(cb.schedule.lr_at(0), rel=1e-6)
    assert len(m._global_forward_pre_hooks) == hooks_before
    assert all(torch.isfinite(p).all() for p in model.parameters())


def _trainer_pieces(tok, plan, tmp_path):
    """The tokenized rows, a collator that builds their labels, and the plan's 8-step arguments."""
    from transformers import TrainingArguments

    from leadline.corpus import TokenizedRow, collate, tokenize_rows
    from leadline.hf import training_arguments

    rows = list(tokenize_rows(str(DATA / "prompt_completion.jsonl"), tok))
    ds = [{"input_ids": r.input_ids, "labels": r.labels} for r in rows]

    def collator(feats):
        return collate([TokenizedRow.from_labels(f["input_ids"], f["labels"]) for f in feats],
                       tok.pad_token_id).model_inputs()

    args = training_arguments(plan, TrainingArguments(output_dir=str(tmp_path), report_to=[], logging_steps=100,
                                                      save_strategy="no", use_cpu=True, remove_unused_columns=False),
                              max_steps=8)
    return ds, collator, args


def test_the_ending_to_zero_inside_trainer_falls_to_zero_and_reruns_nothing(setup, tmp_path):
    from transformers import Trainer

    from leadline.hf.callback import LeadlineCallback

    tok, model, plan = setup
    ds, collator, args = _trainer_pieces(tok, plan, tmp_path)
    cb = LeadlineCallback.for_plan(plan, model, tok, str(DATA / "prompt_completion.jsonl"),
                                   ending="to_zero")
    calls: list[int] = []
    step_of = cb.train_step
    cb.train_step = lambda t: (calls.append(t), step_of(t))[1]  # the steps the schedule itself runs
    seen: list[float] = []

    class Spy(LeadlineCallback.__mro__[1]):
        def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kw):
            seen.append(optimizer.param_groups[0]["lr"])

    Trainer(model=model, args=args, train_dataset=ds, data_collator=collator, callbacks=[cb, Spy()]).train()
    from leadline.lookahead.rate.warmup import warmup_lr

    sched = cb.schedule
    assert sched.rollbacks == 0  # else the halvings below would differ
    c = sched.config
    want = [warmup_lr(t, c.lr, c.alpha1, c.warmup_steps) * (8 - t) / 8 for t in range(8)]
    assert seen == pytest.approx(want, rel=1e-6)  # Trainer's optimizer ran the schedule's falling rate
    assert cb.ending["kept"] == "to_zero" and calls == []  # no ending raced


def test_a_longer_raced_ending_inside_trainer_reruns_its_share_of_the_run(setup, tmp_path):
    from transformers import Trainer

    from leadline.errors import InputError
    from leadline.hf.callback import LeadlineCallback

    tok, model, plan = setup
    ds, collator, args = _trainer_pieces(tok, plan, tmp_path)
    cb = LeadlineCallback.for_plan(plan, model, tok, str(DATA / "prompt_completion.jsonl"),
                                   ending_share=0.5)
    calls: list[int] = []
    step_of = cb.train_step
    cb.train_step = lambda t: (calls.append(t), step_of(t))[1]  # the steps the schedule itself runs
    Trainer(model=model, args=args, train_dataset=ds, data_collator=collator, callbacks=[cb]).train()
    assert calls == [4, 5, 6, 7] and len(cb.ending["decays"]) == 1  # the last half alone rerun (2h would be 2 steps)
    assert cb.ending["from_step"] == 4 and cb.ending["kept"] in ("decay", "constant")
    for kw in ({"ending_share": 1.2}, {"ending_share": 0.5, "ending": "to_zero"}):
        with pytest.raises(InputError, match="ending_share"):
            LeadlineCallback(plan, lambda: [1.0], lambda step: 0.0, **kw)


def test_a_plan_of_the_removed_quick_effort_is_one_sentence():
    from leadline.errors import InputError
    from leadline.hf.callback import LeadlineCallback
    from leadline.plan import Plan, Value

    plan = Plan()
    plan.set("lr", Value(1e-3, "constant", "the anchor"))
    plan.set("race_rates", Value([5e-4, 1e-3, 2e-3], "derived", "the anchor x 2^j"))
    with pytest.raises(InputError, match=r"^the plan is of the quick effort, which was removed; derive it again with "
                                         r"the race effort \(the default\) or full$"):
        LeadlineCallback(plan, lambda: [1.0], lambda step: 0.0)


def test_the_cap_is_lifted_when_training_raises(setup):
    """Trainer skips on_train_end on an exception: `with cb:` lifts the cap anyway."""
    from leadline.hf.callback import LeadlineCallback

    plan = setup[2]
    cb = LeadlineCallback(plan, lambda: [1.0, 1.0], lambda step: 0.0)

    class Handle:
        lifted = False

        def lift(self):
            Handle.lifted = True

    cb._cap_handle = Handle()
    with pytest.raises(RuntimeError), cb:
        raise RuntimeError("training failed")
    assert Handle.lifted and cb._cap_handle is None


def test_derive_for_counts_its_set_up_against_max_seconds(monkeypatch):
    import leadline.hf.deriving as hf
    import leadline.lookahead.model as model_pieces  # derive_for's full-effort set-up calls prepare from here

    clock = install_clock(monkeypatch, FakeClock(tick=1e-4))  # every reading 0.1 ms: the same timings on every machine
    tok = make_tokenizer()
    model = _lora(make_model(vocab_size=len(tok)))
    real = model_pieces.prepare

    def slow_prepare(*a, **k):  # a set-up that takes the whole budget
        clock.advance(1.2)
        return real(*a, **k)

    monkeypatch.setattr(model_pieces, "prepare", slow_prepare)
    plan = hf.derive_for(model, tok, str(DATA / "prompt_completion.jsonl"), total_steps=8, effort="full",
                         options=hf.DeriveOptions(max_seconds=1.0))
    assert any("not reached within max_seconds" in n for n in plan.notes), plan.notes


def test_a_budget_spent_by_the_ramp_still_gives_a_batch_from_the_ramps_timings(monkeypatch):
    """An 8B model's ramp can take all of max_seconds: the step is then arithmetic on the ramp's
    own timings (no pairs timed), so the plan still has micro_batch, grad_accum and
    tokens_per_step that can train, and says the timed phases after it were not reached."""
    import leadline.hf.deriving as hf
    from leadline.lookahead.derive import phases

    clock = install_clock(monkeypatch, FakeClock(tick=1e-4))  # every reading 0.1 ms: the same timings on every machine
    tok = make_tokenizer()
    model = _lora(make_model(vocab_size=len(tok)))
    real = phases.memory
    budget = 6.0

    def slow_memory(*a, **k):  # the ramp ends past the budget
        out = real(*a, **k)
        clock.advance(budget)
        return out

    monkeypatch.setattr(phases, "memory", slow_memory)
    plan = hf.derive_for(model, tok, str(DATA / "prompt_completion.jsonl"), total_steps=8, effort="full",
                         options=hf.DeriveOptions(max_seconds=budget))
    assert plan.rows_fit >= 1 and 1 <= plan.micro_batch <= plan.rows_fit and plan.grad_accum >= 1
    assert plan["tokens_per_step"].kind != "constant" and "timed_in_turn" not in plan["tokens_per_step"].evidence
    assert next(t for t in plan.phases if t.phase == "step").status == "done"
    assert any(n.startswith("first_step: not reached within max_seconds") for n in plan.notes), plan.notes
    assert any(n.startswith("step: max_seconds=6 was spent before it") for n in plan.notes), plan.notes


# ---- a race plan: the guard of leadline run inside Trainer ---------------------------------
RACE_STEPS = 60  # 2 rows a step on 4 held-out rows: checks at 15, 30 and 45, and the end at 60


def _race_plan():
    """A race plan (schedule-free AdamW) as derive_for writes one, without its race."""
    from leadline.plan import Plan, Value

    plan = Plan()
    plan.set("optimizer", Value("schedule_free_adamw", "constant", "schedule-free AdamW"))
    plan.set("lr", Value(2.5e-3, "constant", "the default"))
    plan.set("warmup_steps", Value(1, "constant", "2% of the run"))
    plan.set("weight_decay", Value(0.0, "constant", "0"))
    plan.set("micro_batch", Value(2, "derived", "the step's rows"))
    plan.set("grad_accum", Value(1, "derived", "one micro-batch a step"))
    plan.set("total_steps", Value(RACE_STEPS, "derived", "the run's length"))
    return plan


def _race_trainer(tmp_path, tok, plan, callbacks, start, **kw):
    """A Trainer over the 40 rows at 2 a step, from the LoRA tensors ``start``, running ``plan``."""
    import torch
    from transformers import Trainer, TrainingArguments

    from leadline.hf import training_arguments

    model = _lora(make_model(vocab_size=len(tok)))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in start:
                p.copy_(start[n])
    ds, collator, _ = _trainer_pieces(tok, plan, tmp_path)
    base = {"output_dir": str(tmp_path), "report_to": [], "logging_steps": 100, "save_strategy": "no",
            "use_cpu": True, "remove_unused_columns": False, "seed": 0}
    args = training_arguments(plan, TrainingArguments(**{**base, **kw}))
    return Trainer(model=model, args=args, train_dataset=ds, data_collator=collator, callbacks=callbacks)


@pytest.fixture(scope="module")
def race_start():
    tok = make_tokenizer()
    model = _lora(make_model(vocab_size=len(tok)))
    return tok, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _readings(values):
    """A held-out reader returning ``values``' readings in turn, four rows each (a little spread)."""
    it = iter(values)

    def read():
        value = next(it)
        return [value + j / 100 for j in range(4)]

    return read


def test_the_guard_checks_inside_trainer_and_leaves_a_run_without_rollback_as_it_was(race_start, tmp_path):
    """Every check better than the last: the checks are leadline run's, none rolls back, and the final
    weights are those of the same run without the guard, bit for bit."""
    import torch

    from leadline.hf.callback import LeadlineCallback

    tok, start = race_start
    plain = _race_trainer(tmp_path / "plain", tok, _race_plan(), [LeadlineCallback(_race_plan())], start)
    plain.train()
    plan = _race_plan()
    cb = LeadlineCallback(plan, held_out_losses=_readings([2.0, 1.5, 1.4, 1.3, 1.2]))
    guarded = _race_trainer(tmp_path / "guarded", tok, plan, [cb], start)
    with cb:
        guarded.train()
    assert [(c["step"], c["action"]) for c in cb.checks] == [(0, "start"), (15, "best"), (30, "best"),
                                                              (45, "best"), (60, "final")]
    ev = plan["guard"].evidence
    assert ev["plot"] == "checks" and ev["checks"] == cb.checks and ev["kept_step"] == 60 and ev["rows"] == 4
    assert ev["outcome"] == "improved" and ev["held_out_before"]["rows"] == 4 and plan["guard"].value == 0
    assert cb.evidence()["guard"]["outcome"] == "improved"
    a = dict(plain.model.named_parameters())
    trained = [(n, p) for n, p in guarded.model.named_parameters() if p.requires_grad]
    assert trained and all(torch.equal(p, a[n]) for n, p in trained)


def test_a_fault_is_rolled_back_and_trainer_logs_the_lowered_rate(race_start, tmp_path):
    """One step at 10^4 times the rate: the guard reads the damage on the held-out rows (the plan's real
    reader), puts step 15's check back, halves the rate; Trainer's log shows the rate each step used."""
    import math

    from transformers import TrainerCallback

    from leadline.hf.callback import LeadlineCallback

    tok, start = race_start
    plan = _race_plan()
    used: dict[int, float] = {}

    class Fault(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kw):
            used[int(state.global_step)] = float(optimizer.param_groups[0]["lr"])
            if state.global_step == 20:
                for g in optimizer.param_groups:
                    g["lr"] *= 1e4

        def on_optimizer_step(self, args, state, control, optimizer=None, **kw):
            if state.global_step == 20:
                for g in optimizer.param_groups:
                    g["lr"] /= 1e4

    trainer = _race_trainer(tmp_path, tok, plan, [Fault()], start, logging_steps=1)
    cb = LeadlineCallback.for_plan(plan, trainer.model, tok, str(DATA / "prompt_completion.jsonl"))
    trainer.add_callback(cb)
    with cb:
        trainer.train()
    rolled = [c for c in cb.checks if c["action"] == "rollback"]
    assert len(rolled) == 1 and rolled[0]["to_step"] == 15 and 20 < rolled[0]["step"] <= 30, cb.checks
    assert rolled[0]["lr"] == pytest.approx(plan.lr / 2, rel=1e-12)
    logged = {int(r["step"]) - 1: r["learning_rate"] for r in trainer.state.log_history if "learning_rate" in r}
    assert sorted(logged) == list(range(RACE_STEPS))
    for step in range(RACE_STEPS):
        assert logged[step] == pytest.approx(used[step], rel=1e-12), step  # the rate logged is the rate used
    after = rolled[0]["step"]  # the rollback came at this step's end: every later step ran at half the rate
    assert all(logged[s] == pytest.approx(plan.lr / 2, rel=1e-12) for s in range(after, RACE_STEPS))
    assert all(logged[s] == pytest.approx(plan.lr, rel=1e-12) for s in range(after))
    assert all(math.isfinite(p.detach().abs().max().item()) for p in trainer.model.parameters())
    assert plan["guard"].value == 1 and plan["guard"].evidence["outcome"] in ("improved", "no_better_than_start")


def test_a_stop_puts_the_best_check_back_before_trainer_saves(race_start, tmp_path):
    """Step 30 reads worse than step 15 (a rollback), step 45 again: with one rollback allowed the run
    stops at 45 with step 15's averaged weights in the model, in the checkpoint Trainer saves there
    and in ``save_model``."""
    import torch
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    from leadline.hf.callback import LeadlineCallback

    tok, start = race_start
    plan = _race_plan()
    cb = LeadlineCallback(plan, held_out_losses=_readings([2.0, 1.0, 3.0, 3.0, 1.1]), max_rollbacks=1)
    at_15: dict[str, torch.Tensor] = {}

    class Averaged(TrainerCallback):  # after leadline's: step 15's averaged weights, read as eval() sets them
        def on_step_end(self, args, state, control, model=None, optimizer=None, **kw):
            if state.global_step == 15:
                optimizer.eval()
                at_15.update({n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n})
                optimizer.train()

    trainer = _race_trainer(tmp_path, tok, plan, [cb, Averaged()], start, save_strategy="steps", save_steps=45)
    with cb:
        trainer.train()
    assert [(c["step"], c["action"]) for c in cb.checks] == [(0, "start"), (15, "best"), (30, "rollback"),
                                                              (45, "stop")]
    assert trainer.state.global_step == 45 and plan["guard"].evidence["kept_step"] == 15
    assert plan["guard"].evidence["outcome"] == "improved"
    live = {n: p.detach() for n, p in trainer.model.named_parameters() if "lora_" in n}
    assert len(at_15) == len(live) > 0 and all(torch.equal(live[n], w) for n, w in at_15.items())
    trainer.save_model(str(tmp_path / "final"))
    for folder in (tmp_path / "checkpoint-45", tmp_path / "final"):
        saved = load_file(str(folder / "adapter_model.safetensors"))
        named = {n.replace(".default", ""): w for n, w in at_15.items()}
        assert len(saved) == len(named) and all(torch.equal(saved[n], named[n]) for n in saved), folder
