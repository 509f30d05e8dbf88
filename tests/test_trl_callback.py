"""The plan inside SFTTrainer: the logged rate is the rate used, the last checkpoint is the
model leadline kept, and a plan for another loss is refused."""

from __future__ import annotations

import pytest

from helpers import DATA, make_model, make_tokenizer

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

STEPS = 8


def _lora():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM")


def _config(out, **kw):
    from trl import SFTConfig

    base = {"output_dir": str(out), "report_to": [], "use_cpu": True, "max_steps": STEPS, "logging_steps": 1,
            "save_strategy": "no", "dataset_num_proc": None, "seed": 0}
    return SFTConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def derived(tmp_path_factory):
    from trl import SFTTrainer

    from leadline.hf import derive_for

    tok = make_tokenizer()
    ds = datasets.load_dataset("json", data_files=str(DATA / "prompt_completion.jsonl"), split="train")
    probe = SFTTrainer(model=make_model(vocab_size=len(tok)), args=_config(tmp_path_factory.mktemp("probe")),
                       train_dataset=ds, processing_class=tok, peft_config=_lora())
    plan = derive_for(probe, effort="full")
    start = {k: v.detach().clone() for k, v in probe.model.named_parameters() if v.requires_grad}
    return probe, plan, ds, start


def _trainer(derived, out, callbacks, **kw):
    from trl import SFTTrainer

    from leadline.hf import training_arguments

    probe, plan, ds, start = derived
    model = probe.model
    with __import__("torch").no_grad():  # every test starts from the same adapters
        for n, p in model.named_parameters():
            if n in start:
                p.copy_(start[n])
    args = training_arguments(plan, _config(out, **kw), max_steps=STEPS)
    return SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=probe.processing_class, callbacks=callbacks)


class _Rates:
    """A TrainerCallback reading the optimizer's rate as each step uses it."""

    def __new__(cls):
        from transformers import TrainerCallback

        class Spy(TrainerCallback):
            def __init__(self):
                self.used: dict[int, float] = {}
                self.weights_at_start = None

            def on_train_begin(self, args, state, control, model=None, **kw):
                self.weights_at_start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

            def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kw):
                self.used[int(state.global_step)] = float(optimizer.param_groups[0]["lr"])

        return Spy()


class _LastStep:
    """A TrainerCallback, placed before leadline's, keeping the weights Trainer's last step left."""

    def __new__(cls):
        from transformers import TrainerCallback

        class Last(TrainerCallback):
            def __init__(self):
                self.weights: dict = {}

            def on_step_end(self, args, state, control, model=None, **kw):
                if state.global_step == state.max_steps:
                    self.weights = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}

        return Last()


def test_sft_config_carries_the_plan(derived, tmp_path):
    from leadline.hf import training_arguments

    _, plan, _, _ = derived
    args = training_arguments(plan, _config(tmp_path, max_length=1024))
    assert args.max_length == plan.seq_len < 1024
    assert args.per_device_train_batch_size == plan.micro_batch and args.gradient_accumulation_steps == plan.grad_accum
    assert args.learning_rate == plan.lr and args.completion_only_loss is True and args.packing is False
    assert plan["loss_policy"].value["completion_only_loss"] is True


@pytest.fixture(scope="module")
def run(derived, tmp_path_factory):
    """One SFTTrainer run under the plan, saving at its last step, whose third check reads far
    worse: the schedule must roll back and halve the rate."""
    from leadline.hf import LeadlineCallback

    probe, plan, _, _ = derived
    out = tmp_path_factory.mktemp("run")
    cb = LeadlineCallback.for_plan(plan, probe)
    real, reads = cb.held_out_losses, []

    def held_out():
        losses = list(real())
        reads.append(1)
        return [v + 5.0 for v in losses] if len(reads) == 3 else losses

    cb.held_out_losses = held_out
    spy, last = _Rates(), _LastStep()
    trainer = _trainer(derived, out, [last, cb, spy], save_strategy="steps", save_steps=STEPS)
    with cb:
        trainer.train()
    return trainer, cb, spy, out, last


def test_logged_rate_is_the_rate_used_across_a_rollback(derived, run):
    trainer, cb, spy = run[:3]
    plan = derived[1]
    assert cb.schedule.rollbacks >= 1
    logged = {int(r["step"]) - 1: r["learning_rate"] for r in trainer.state.log_history if "learning_rate" in r}
    assert sorted(logged) == list(range(STEPS))
    for step in range(STEPS):
        assert logged[step] == pytest.approx(spy.used[step], rel=1e-12), step
    rolled = next(c["step"] for c in cb.schedule.checks if c["action"] == "rollback")
    assert logged[rolled] == pytest.approx(plan.lr / 2, rel=1e-9)  # the halved rate is what Trainer shows
    assert logged[0] == pytest.approx(plan.lr, rel=1e-9)
    assert not type(trainer.lr_scheduler).__name__.startswith("LeadlineDriven")  # Trainer's scheduler is given back


def test_the_last_checkpoint_is_the_model_kept(run):
    from safetensors.torch import load_file

    trainer, cb, _, out, trainer_end = run
    assert cb.schedule.finished and cb.ending["kept"] in ("decay", "constant")
    saved = load_file(str(out / f"checkpoint-{STEPS}" / "adapter_model.safetensors"))
    live = {n: p.detach() for n, p in trainer.model.named_parameters() if "lora_" in n}
    assert len(saved) == len(live) > 0
    for name, tensor in saved.items():
        match = [v for n, v in live.items() if n.replace(".default", "").endswith(name.split("base_model.model.", 1)[-1])]
        assert len(match) == 1, name
        assert (match[0] == tensor).all(), name
    # the ending changed the adapters after Trainer's last step, and the save came after it
    assert cb.ending["kept"] == "decay"
    before = trainer_end.weights
    assert any(not (before[n] == v).all() for n, v in live.items())


def test_a_plan_for_another_loss_is_refused(derived, tmp_path):
    from leadline.errors import InputError
    from leadline.hf import LeadlineCallback

    probe, plan, _, _ = derived
    cb = LeadlineCallback.for_plan(plan, probe)
    trainer = _trainer(derived, tmp_path, [cb], completion_only_loss=False)
    trainer.args.completion_only_loss = False
    with pytest.raises(InputError, match="completion_only_loss"), cb:
        trainer.train()
