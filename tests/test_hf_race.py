"""The race effort from Python and inside Trainer: derive_for and find_lr race schedule-free
AdamW's rate and leave the model as it was; training_arguments maps the plan to Trainer's
schedule-free optimizer; LeadlineCallback keeps the averaged weights in every save and at the
end; the default effort is one string across the entry points."""

from __future__ import annotations

import argparse
import inspect
import random

import pytest

from helpers import DATA, make_model, make_tokenizer
from leadline.errors import InputError

pytest.importorskip("schedulefree")
torch = pytest.importorskip("torch")

ROWS = str(DATA / "prompt_completion.jsonl")  # 40 rows: 32 train, 4 held out, 4 test
STEPS = 20  # at 2 rows a step: each candidate races 2 steps


def _lora_model(tok):
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM")
    return get_peft_model(make_model(vocab_size=len(tok)), lora)


def _trained(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.fixture(scope="module")
def raced():
    """One race on a LoRA model, with what stood before it: the trained tensors, the RNG, the mode."""
    import numpy as np

    from leadline.hf import derive_for

    tok = make_tokenizer()
    model = _lora_model(tok)
    model.eval()
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    before, draws = _trained(model), (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    plan = derive_for(model, tok, ROWS, total_steps=STEPS, rows_per_step=2)
    after = (torch.rand(3), random.random(), np.random.rand())
    return model, tok, plan, before, draws, after


def test_derive_for_races_schedule_free_adamw_and_leaves_the_model_as_it_was(raced):
    model, _, plan, before, draws, after = raced
    assert plan.optimizer == "schedule_free_adamw"
    assert plan["lr"].kind == "measured" and plan.lr in (2.5e-3, 1e-2, 6.25e-4)
    assert "were not kept" in plan["lr"].source and plan["lr"].evidence["horizon_steps"] == 2
    assert plan.total_steps == STEPS and plan.micro_batch * plan.grad_accum == 2
    assert plan.warmup_steps == 1 and plan.weight_decay == 0.0 and plan.opening_steps == 2
    assert [p.phase for p in plan.phases] == ["memory", "rate"]  # no run's steps were taken
    assert plan["rows"].evidence["formats"] == {"prompt_completion": 40}
    assert plan["precision"].kind == "given"
    now = _trained(model)
    assert all(torch.equal(before[n], now[n]) for n in before)  # bit for bit
    assert all(p.grad is None for p in model.parameters())
    assert not model.training  # its eval mode, as given
    assert torch.equal(draws[0], after[0]) and draws[1:] == after[1:]  # the RNG streams where they were


def test_the_race_alone_writes_the_plan_alone(tmp_path):
    from leadline.run import RunOptions, race_only

    tok = make_tokenizer()
    model = _lora_model(tok)
    plan = race_only(model, tok, ROWS, RunOptions(total_steps=8, rows_per_step=4), out_dir=tmp_path)
    assert plan["lr"].kind == "constant" and plan.lr == 2.5e-3  # 8 steps are too short to race
    assert plan.opening_steps == 0 and [p.phase for p in plan.phases] == ["memory", "rate"] and "guard" not in plan
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_a_short_run_keeps_the_default_rate():
    from leadline.hf import derive_for

    tok = make_tokenizer()
    model = make_model(vocab_size=len(tok))  # no adapter: every weight, the full fine-tune's default
    before = _trained(model)
    plan = derive_for(model, tok, ROWS, total_steps=5, rows_per_step=4)
    assert plan["lr"].kind == "constant" and plan.lr == 2.5e-4 and plan.optimizer == "schedule_free_adamw"
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())


def test_training_arguments_run_the_plan_in_trainer(raced, tmp_path):
    from transformers import TrainingArguments
    from transformers.training_args import OptimizerNames

    from leadline.hf import training_arguments

    _, _, plan, *_ = raced
    args = training_arguments(plan, TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True))
    assert args.optim == OptimizerNames.SCHEDULE_FREE_ADAMW
    assert args.lr_scheduler_type == "constant"  # the warmup is the optimizer's own, not a second one
    assert args.learning_rate == plan.lr and args.warmup_steps == plan.warmup_steps and args.weight_decay == 0.0
    assert args.max_steps == STEPS and args.max_grad_norm == 0.0
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 2


def test_one_default_effort_across_the_entry_points():
    from leadline.cli import derive as derive_command
    from leadline.cli import run as run_command
    from leadline.hf import derive_for, find_lr

    parsers = []
    for command in (run_command, derive_command):
        parser = argparse.ArgumentParser()
        command.add_arguments(parser)
        parsers.append(parser)
    defaults = {inspect.signature(derive_for).parameters["effort"].default,
                inspect.signature(find_lr).parameters["effort"].default, *(p.get_default("effort") for p in parsers)}
    assert defaults == {"race"}
    helps = [p.format_help() for p in parsers]
    assert all("(default race)" in " ".join(h.split()) for h in helps)  # --help states it, the same in both


def test_what_the_race_does_not_take_is_refused_before_any_work():
    from leadline.hf import DeriveOptions, derive_for, derive_parts, find_lr

    tok = make_tokenizer()
    model = _lora_model(tok)
    with pytest.raises(InputError, match=r"^max_seconds, step_for shape derive\(\)'s phases, .*effort='full'"):
        derive_for(model, tok, ROWS, options=DeriveOptions(max_seconds=30, step_for="time"))
    with pytest.raises(InputError, match=r"^held_out shapes derive\(\)'s phases"):
        derive_for(model, tok, ROWS, options=DeriveOptions(held_out=8))
    with pytest.raises(InputError, match=r"effort='fast' is not one of race, full"):
        derive_for(model, tok, ROWS, effort="fast")
    for call in (derive_for, find_lr, derive_parts):  # the removed effort: one sentence naming it and the fix
        with pytest.raises(InputError, match=r"^effort='quick' was removed: pass effort='race' \(the default\) or "
                                             r"'full'$"):
            call(model, tok, ROWS, effort="quick")
    with pytest.raises(InputError, match=r"derive_for\(\.\.\., effort='race'\)"):
        derive_parts(model, tok, ROWS, effort="race")
    with pytest.raises(InputError, match="rows_per_step=0 must be"):
        derive_for(model, tok, ROWS, rows_per_step=0)


# ---- inside SFTTrainer ---------------------------------------------------------------------
def _config(out, **kw):
    from trl import SFTConfig

    base = {"output_dir": str(out), "report_to": [], "use_cpu": True, "max_steps": STEPS, "logging_steps": 1,
            "save_strategy": "no", "dataset_num_proc": None, "seed": 0, "per_device_train_batch_size": 2}
    return SFTConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from peft import LoraConfig
    from trl import SFTTrainer

    tok = make_tokenizer()
    ds = datasets.load_dataset("json", data_files=ROWS, split="train")
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM")
    return SFTTrainer(model=make_model(vocab_size=len(tok)), args=_config(tmp_path_factory.mktemp("probe")),
                      train_dataset=ds, processing_class=tok, peft_config=lora)


class _Saves:
    """A TrainerCallback after leadline's: at each save, the optimizer's mode and the weights saved."""

    def __new__(cls):
        from transformers import TrainerCallback

        class Spy(TrainerCallback):
            def __init__(self):
                self.saved: dict[int, tuple[bool, dict]] = {}

            def on_save(self, args, state, control, model=None, optimizer=None, **kw):
                mode = getattr(optimizer, "optimizer", optimizer).param_groups[0]["train_mode"]
                self.saved[int(state.global_step)] = (mode, {n: p.detach().clone() for n, p in
                                                             model.named_parameters() if "lora_" in n})

        return Spy()


def _adapter(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def _same(saved: dict, weights: dict) -> bool:
    """The adapter file's tensors (PEFT drops the adapter's name from the keys) equal the model's."""
    named = {n.replace(".default", ""): w for n, w in weights.items()}
    return len(saved) == len(named) and all(torch.equal(saved[n], named[n]) for n in saved)


def test_trainer_saves_the_averaged_weights_with_the_callback(probe, tmp_path):
    from trl import SFTTrainer

    from leadline.hf import LeadlineCallback, derive_for, training_arguments

    plan = derive_for(probe, rows_per_step=2, seed=0)
    assert plan.optimizer == "schedule_free_adamw" and plan["loss_policy"].value["trainer"] == "SFTTrainer"
    cb, spy = LeadlineCallback.for_plan(plan, probe), _Saves()
    assert cb.schedule_free and cb.schedule is None  # a race plan runs no schedule; its reader serves the guard
    assert cb.held_out_losses is not None and len(cb.held_out_losses()) == len(plan.held_out["held_out"])
    args = training_arguments(plan, _config(tmp_path, save_strategy="steps", save_steps=10))
    trainer = SFTTrainer(model=probe.model, args=args, train_dataset=probe.train_dataset,
                         processing_class=probe.processing_class, callbacks=[cb, spy])
    with cb:
        trainer.train()
    opt = trainer.optimizer.optimizer
    assert type(opt).__name__ == "AdamWScheduleFree"
    group = opt.param_groups[0]
    assert group["lr"] == plan.lr and group["warmup_steps"] == plan.warmup_steps and group["weight_decay"] == 0.0
    assert sorted(spy.saved) == [10, STEPS]
    for step, (train_mode, weights) in spy.saved.items():
        assert train_mode is False  # saved at the averaged weights
        assert _same(_adapter(tmp_path / f"checkpoint-{step}"), weights)
    assert group["train_mode"] is False  # the model after train() holds the averaged weights
    guard = cb.evidence()["guard"]
    assert guard["outcome"] == "improved" and plan["guard"].evidence == guard
    final = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    trainer.save_model(str(tmp_path / "final"))
    assert _same(_adapter(tmp_path / "final"), final)
    opt.train()  # the training weights differ from the averaged ones: the saves were not of them
    assert any(not torch.equal(final[n], p) for n, p in trainer.model.named_parameters() if n in final)


def test_without_the_callback_trainer_saves_the_training_weights(probe, tmp_path):
    """What the callback adds: Trainer alone saves in train mode (transformers' own handling covers
    evaluation only)."""
    from trl import SFTTrainer

    from leadline.hf import training_arguments
    from leadline.plan import Plan, Value

    plan = Plan()
    plan.set("optimizer", Value("schedule_free_adamw", "constant", "schedule-free AdamW"))
    plan.set("lr", Value(2.5e-3, "constant", "the default"))
    plan.set("warmup_steps", Value(1, "constant", "2% of the run"))
    spy = _Saves()
    args = training_arguments(plan, _config(tmp_path, max_steps=2, save_strategy="steps", save_steps=1))
    trainer = SFTTrainer(model=probe.model, args=args, train_dataset=probe.train_dataset,
                         processing_class=probe.processing_class, callbacks=[spy])
    trainer.train()
    assert [mode for mode, _ in spy.saved.values()] == [True, True]


def test_a_trainer_that_does_not_run_the_plan_is_refused(probe, tmp_path):
    from types import SimpleNamespace

    from leadline.hf import LeadlineCallback, find_lr
    from leadline.plan import Plan, Value

    with pytest.raises(InputError, match=r"trainer's optim is 'adamw_torch.*effort='full'"):
        find_lr(probe)  # an AdamW trainer: the race's rate is not its rate
    plan = Plan()
    plan.set("optimizer", Value("schedule_free_adamw", "constant", "schedule-free AdamW"))
    plan.set("lr", Value(2.5e-3, "constant", "the default"))
    cb = LeadlineCallback(plan)
    model = torch.nn.Linear(2, 2)
    adamw = torch.optim.AdamW(model.parameters())
    with pytest.raises(InputError, match="Trainer built AdamW; build the args with training_arguments"):
        cb.on_train_begin(SimpleNamespace(lr_scheduler_type="constant"), None, None, model=model, optimizer=adamw,
                          lr_scheduler=object())
    import schedulefree

    sf = schedulefree.AdamWScheduleFree(model.parameters())
    with pytest.raises(InputError, match="lr_scheduler_type='linear' would schedule the rate"):
        cb.on_train_begin(SimpleNamespace(lr_scheduler_type="linear"), None, None, model=model, optimizer=sf,
                          lr_scheduler=object())
    with pytest.raises(InputError, match="leave them out"):
        LeadlineCallback(plan, ending="to_zero")
