"""The one-liners: find_batch_size(trainer) runs derive's batch phases alone, find_lr(trainer)
the rate phases alone at the trainer's own batch; each answers with suggestion(), why() and
plot(), and leaves the model as it was."""

from __future__ import annotations

import pytest

from helpers import DATA, make_model, make_tokenizer

pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    tok = make_tokenizer()
    ds = datasets.load_dataset("json", data_files=str(DATA / "prompt_completion.jsonl"), split="train")
    cfg = SFTConfig(output_dir=str(tmp_path_factory.mktemp("out")), report_to=[], use_cpu=True, max_steps=6,
                    per_device_train_batch_size=3, gradient_accumulation_steps=2, dataset_num_proc=None,
                    activation_checkpointing=False)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM")
    return SFTTrainer(model=make_model(vocab_size=len(tok)), args=cfg, train_dataset=ds, processing_class=tok,
                      peft_config=lora)


def _weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_find_batch_size_runs_the_batch_phases_alone(trainer, tmp_path):
    from leadline.hf import FoundBatchSize, find_batch_size

    before = _weights(trainer.model)
    found = find_batch_size(trainer, progress=False)
    assert isinstance(found, FoundBatchSize)
    plan = found.plan
    assert found.suggestion() == plan.micro_batch >= 1
    assert found.rows_fit == plan.rows_fit >= found.suggestion()
    assert found.grad_accum == plan.grad_accum >= 1
    assert plan["rows_fit"].kind == "measured" and plan["noise_scale_tokens"].kind == "measured"
    assert "alpha1" not in plan and "lookahead_horizon_steps" not in plan  # no rate phase ran
    ran = {p.phase for p in plan.phases}
    assert {"noise", "memory", "step"} <= ran and not ran & {"first_step", "past_format", "rate"}
    why = found.why()
    assert why.startswith("micro_batch") and "rows_fit" in why and "evidence" in why
    svg = found.plot(tmp_path / "ramp.svg")
    if svg is not None:  # matplotlib is in the hf extra; without it there is nothing to draw
        assert svg.startswith("<svg") and (tmp_path / "ramp.svg").read_text() == svg
    after = _weights(trainer.model)
    assert all((after[n] == w).all() for n, w in before.items())
    assert repr(found) == f"FoundBatchSize(micro_batch={found.suggestion()!r})"


def test_find_lr_runs_the_rate_phases_at_the_trainers_batch(trainer, monkeypatch):
    from leadline.hf import FoundRate, find_lr
    from leadline.run.task import Task

    asked: list[tuple[int, int]] = []
    real = Task.train_step_of

    def spy(self, micro_batch, grad_accum):
        asked.append((micro_batch, grad_accum))
        return real(self, micro_batch, grad_accum)

    monkeypatch.setattr(Task, "train_step_of", spy)
    before = _weights(trainer.model)
    found = find_lr(trainer, effort="full", progress=False)
    assert isinstance(found, FoundRate)
    plan = found.plan
    assert asked and set(asked) == {(3, 2)}  # every step the rate phases ran was the trainer's
    assert plan["micro_batch"].kind == "given" and plan.micro_batch == 3 and plan.grad_accum == 2
    assert "rows_fit" not in plan and "noise_scale_tokens" not in plan  # no batch phase ran
    ran = {p.phase for p in plan.phases}
    assert {"first_step", "rate"} <= ran and not ran & {"noise", "memory", "step"}
    assert plan["alpha1"].kind == "measured" and found.alpha1 == plan.alpha1
    assert found.suggestion() == plan.lr > 0
    assert plan.total_steps == 6  # the trainer's max_steps
    assert found.why().startswith("lr") and "alpha1" in found.why()
    svg = found.plot()
    assert svg is None or svg.startswith("<svg")
    after = _weights(trainer.model)
    assert all((after[n] == w).all() for n, w in before.items())


def test_find_lr_without_a_trainer_needs_the_batch():
    from leadline.errors import InputError
    from leadline.hf import find_lr

    tok = make_tokenizer()
    with pytest.raises(InputError, match="micro_batch="):
        find_lr(make_model(vocab_size=len(tok)), tok, str(DATA / "text.jsonl"), effort="full")


def test_derive_parts_names_what_it_can_measure():
    from leadline.errors import InputError
    from leadline.hf import derive_parts

    tok = make_tokenizer()
    with pytest.raises(InputError, match="batch, rate"):
        derive_parts(make_model(vocab_size=len(tok)), tok, str(DATA / "text.jsonl"), measure=("memory",))
