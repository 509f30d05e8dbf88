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

    plan = derive_for(model, tok, str(DATA / "prompt_completion.jsonl"), total_steps=8, effort="quick")
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
    cb = LeadlineCallback.for_plan(plan, model, tok, str(DATA / "prompt_completion.jsonl"), race=False,
                                   ending="to_zero")
    calls: list[int] = []
    step_of = cb.train_step
    cb.train_step = lambda t: (calls.append(t), step_of(t))[1]  # the steps the schedule itself runs
    seen: list[float] = []

    class Spy(LeadlineCallback.__mro__[1]):
        def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kw):
            seen.append(optimizer.param_groups[0]["lr"])

    Trainer(model=model, args=args, train_dataset=ds, data_collator=collator, callbacks=[cb, Spy()]).train()
    from leadline.rate.warmup import warmup_lr

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
    cb = LeadlineCallback.for_plan(plan, model, tok, str(DATA / "prompt_completion.jsonl"), race=False,
                                   ending_share=0.5)
    calls: list[int] = []
    step_of = cb.train_step
    cb.train_step = lambda t: (calls.append(t), step_of(t))[1]  # the steps the schedule itself runs
    Trainer(model=model, args=args, train_dataset=ds, data_collator=collator, callbacks=[cb]).train()
    assert calls == [4, 5, 6, 7] and len(cb.ending["decays"]) == 1  # the last half alone rerun (2h would be 2 steps)
    assert cb.ending["from_step"] == 4 and cb.ending["kept"] in ("decay", "constant")
    for kw in ({"ending_share": 1.2, "race": False}, {"ending_share": 0.5, "race": False, "ending": "to_zero"},
               {"ending_share": 0.5}):  # the last: a quick plan races its rates, the schedule's ending is not run
        with pytest.raises(InputError, match="ending_share"):
            LeadlineCallback(plan, lambda: [1.0], lambda step: 0.0, **kw)


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
    import leadline.hf.deriving as hf  # derive_for's set-up calls prepare from here

    clock = install_clock(monkeypatch, FakeClock(tick=1e-4))  # every reading 0.1 ms: the same timings on every machine
    tok = make_tokenizer()
    model = _lora(make_model(vocab_size=len(tok)))
    real = hf.prepare

    def slow_prepare(*a, **k):  # a set-up that takes the whole budget
        clock.advance(1.2)
        return real(*a, **k)

    monkeypatch.setattr(hf, "prepare", slow_prepare)
    plan = hf.derive_for(model, tok, str(DATA / "prompt_completion.jsonl"), total_steps=8, effort="quick",
                         options=hf.DeriveOptions(max_seconds=1.0))
    assert any("not reached within max_seconds" in n for n in plan.notes), plan.notes


def test_a_budget_spent_by_the_ramp_still_gives_a_batch_from_the_ramps_timings(monkeypatch):
    """An 8B model's ramp can take all of max_seconds: the step is then arithmetic on the ramp's
    own timings (no pairs timed), so the plan still has micro_batch, grad_accum and
    tokens_per_step that can train, and says the timed phases after it were not reached."""
    import leadline.hf.deriving as hf
    from leadline.derive import phases

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
    plan = hf.derive_for(model, tok, str(DATA / "prompt_completion.jsonl"), total_steps=8, effort="quick",
                         options=hf.DeriveOptions(max_seconds=budget))
    assert plan.rows_fit >= 1 and 1 <= plan.micro_batch <= plan.rows_fit and plan.grad_accum >= 1
    assert plan["tokens_per_step"].kind != "constant" and "timed_in_turn" not in plan["tokens_per_step"].evidence
    assert next(t for t in plan.phases if t.phase == "step").status == "done"
    assert any(n.startswith("first_step: not reached within max_seconds") for n in plan.notes), plan.notes
    assert any(n.startswith("step: max_seconds=6 was spent before it") for n in plan.notes), plan.notes
