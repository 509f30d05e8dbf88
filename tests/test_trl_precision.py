"""derive_for measures the model as it trains: bf16, a bitsandbytes 4-bit/8-bit base under
LoRA (QLoRA), gradient checkpointing; the plan's ``precision`` says so."""

from __future__ import annotations

import pytest

from helpers import DATA, make_model, make_tokenizer


def _lora(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM"))


def _four_bit(model):
    """The tiny model carrying a 4-bit bitsandbytes config, as from_pretrained(quantization_config=...)
    leaves it (its weights stay float here: bitsandbytes' 4-bit path needs CUDA)."""
    import torch
    from transformers import BitsAndBytesConfig

    model.config.quantization_config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                          bnb_4bit_compute_dtype=torch.bfloat16)
    return model


def test_reads_float32_bf16_and_checkpointing():
    import torch

    from leadline.run.precision import precision_of

    tok = make_tokenizer()
    p = precision_of(_lora(make_model(vocab_size=len(tok))))
    assert (p.dtype, p.quantization, p.compute_dtype, p.checkpointing, p.adapter) == ("float32", None, "float32", False, True)
    base = make_model(vocab_size=len(tok)).to(torch.bfloat16)
    base.gradient_checkpointing_enable()
    p = precision_of(_lora(base))
    assert p.dtype == "bfloat16" and p.half and p.checkpointing
    full = precision_of(make_model(vocab_size=len(tok)).to(torch.bfloat16))  # a full fine-tune: every weight trained
    assert full.dtype == "bfloat16" and not full.adapter


def test_a_four_bit_base_is_read_with_its_compute_dtype():
    from leadline.run.precision import BF16_RESOLUTION, precision_of
    from leadline.run.task import loss_resolution

    model = _lora(_four_bit(make_model()))
    p = precision_of(model)
    assert p.quantization == "4-bit nf4" and p.compute_dtype == "bfloat16" and p.adapter
    assert loss_resolution(model) == BF16_RESOLUTION  # the rate phases read the loss at bf16's grain
    assert "4-bit nf4" in p.as_value().source


def test_a_quantized_base_without_adapter_or_off_cuda_is_one_sentence():
    from leadline.errors import InputError
    from leadline.hf import derive_for

    tok = make_tokenizer()
    with pytest.raises(InputError, match="has no adapter"):
        derive_for(_four_bit(make_model(vocab_size=len(tok))), tok, str(DATA / "text.jsonl"))
    with pytest.raises(InputError, match="CUDA GPU"):
        derive_for(_lora(_four_bit(make_model(vocab_size=len(tok)))), tok, str(DATA / "text.jsonl"))


def test_checkpointing_on_a_model_without_it_is_one_sentence():
    from leadline.errors import InputError
    from leadline.run.precision import checkpointing

    model = make_model()
    model.supports_gradient_checkpointing = False
    with pytest.raises(InputError, match="does not support gradient checkpointing"), checkpointing(model, True):
        pass


def test_a_trainer_with_checkpointing_is_measured_with_it_on_in_bf16(tmp_path, monkeypatch):
    """SFTTrainer on a bf16 base with LoRA and gradient_checkpointing=True: derive runs the
    checkpointed forward, the plan says bf16 and checkpointing, and the model is put back."""
    pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    import torch
    import transformers.modeling_utils as mu
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from leadline.hf import derive_for

    calls = []
    real = mu.checkpoint  # what gradient_checkpointing_enable hands the layers

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(mu, "checkpoint", counted)
    tok = make_tokenizer()
    ds = datasets.load_dataset("json", data_files=str(DATA / "prompt_completion.jsonl"), split="train")
    cfg = SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_steps=8, dataset_num_proc=None,
                    bf16=True, gradient_checkpointing=True)
    trainer = SFTTrainer(model=make_model(vocab_size=len(tok)).to(torch.bfloat16), args=cfg, train_dataset=ds,
                         processing_class=tok, peft_config=LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    on_before = bool(trainer.model.is_gradient_checkpointing)
    assert not on_before  # Trainer turns it on in train(), not before
    plan = derive_for(trainer, effort="full")
    prec = plan["precision"].value
    assert prec["dtype"] == "bfloat16" and prec["checkpointing"] is True and prec["adapter"] is True
    assert calls, "derive never ran a checkpointed forward"
    assert bool(trainer.model.is_gradient_checkpointing) == on_before  # put back as Trainer left it
    assert plan.micro_batch >= 1 and plan.lr > 0


@pytest.mark.gpu
def test_qlora_four_bit_base_on_cuda(tmp_path):
    """The real QLoRA path: a 4-bit nf4 base (bitsandbytes) under LoRA, gradient checkpointing
    on, derived on the GPU."""
    pytest.importorskip("bitsandbytes")
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from helpers import save_model_dir
    from leadline.hf import derive_for

    folder = save_model_dir(tmp_path / "tiny")
    tok = make_tokenizer()
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=q, device_map="cuda")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = _lora(model)
    plan = derive_for(model, tok, str(DATA / "prompt_completion.jsonl"), total_steps=8)
    prec = plan["precision"].value
    assert prec["quantization"] == "4-bit nf4" and prec["compute_dtype"] == "bfloat16" and prec["checkpointing"]
    assert plan.micro_batch >= 1 and plan.lr > 0


def test_cli_load_in_4bit_off_cuda_is_one_sentence(tmp_path, capsys):
    from helpers import save_model_dir
    from leadline.cli import main

    folder = save_model_dir(tmp_path / "tiny")
    capsys.readouterr()  # saving the model writes a bar
    out = tmp_path / "plan.json"
    base = ["derive", "--model", str(folder), "--data", str(DATA / "text.jsonl"), "--steps", "8", "--device", "cpu", "--out", str(out)]
    assert main([*base, "--load-in-4bit"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--load-in-4bit" in err and ("CUDA GPU" in err or "bitsandbytes" in err) and len(err.splitlines()) == 1
    assert main([*base, "--load-in-8bit", "--full"]) == 2
    assert "not --full" in capsys.readouterr().err
    assert not out.exists()


def test_cli_gradient_checkpointing_is_measured_and_recorded(tmp_path):
    from helpers import save_model_dir
    from leadline import Plan
    from leadline.cli import main

    folder = save_model_dir(tmp_path / "tiny")
    out = tmp_path / "plan.json"
    assert main(["derive", "--model", str(folder), "--data", str(DATA / "prompt_completion.jsonl"), "--steps", "8",
                 "--device", "cpu", "--lora-rank", "4", "--gradient-checkpointing", "--effort", "full",
                 "--out", str(out)]) == 0
    plan = Plan.from_json(out)
    prec = plan["precision"].value
    assert prec["checkpointing"] is True and prec["quantization"] is None and prec["adapter"] is True
    assert plan["rows_fit_without_checkpointing"].kind == "measured"  # what checkpointing buys, side by side


def test_rows_fit_with_and_without_checkpointing_side_by_side(tmp_path, monkeypatch):
    """A run with checkpointing on: the plan's rows_fit is the ramp with it on, and
    rows_fit_without_checkpointing the same ramp with it off, up to rows_fit; the model's
    checkpointing and weights are put back. A run without it gets no second ramp."""
    pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from leadline.hf import find_batch_size
    from leadline.run.precision import precision_of
    from leadline.run.task import Task

    seen: list[bool] = []
    real = Task.loss_of

    def spy(self, b, length):  # the ramp's steps, with the checkpointing they ran under
        seen.append(precision_of(self.model).checkpointing)
        return real(self, b, length)

    monkeypatch.setattr(Task, "loss_of", spy)
    tok = make_tokenizer()
    ds = datasets.load_dataset("json", data_files=str(DATA / "prompt_completion.jsonl"), split="train")

    def trainer(on):
        cfg = SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_steps=8, dataset_num_proc=None,
                        activation_checkpointing=on)
        return SFTTrainer(model=make_model(vocab_size=len(tok)), args=cfg, train_dataset=ds, processing_class=tok,
                          peft_config=LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))

    t = trainer(True)
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    plan = find_batch_size(t, progress=False).plan
    off = plan["rows_fit_without_checkpointing"]
    assert off.kind == "measured" and 1 <= off.value <= plan.rows_fit
    assert off.evidence["rows_fit_with_checkpointing"] == plan.rows_fit and off.evidence["plot"] == "ramp"
    assert True in seen and seen[-1] is False  # the ramp with it on, then the one with it off, last
    assert not precision_of(t.model).checkpointing  # put back as Trainer left it (on only in train())
    assert all((p == before[n]).all() for n, p in t.model.named_parameters())
    seen.clear()
    plan = find_batch_size(trainer(False), progress=False).plan
    assert "rows_fit_without_checkpointing" not in plan and seen and not any(seen)


def test_rows_fit_without_checkpointing_is_zero_when_nothing_fits_without_it(tmp_path, monkeypatch):
    """A model that fits only with checkpointing (an 8B QLoRA at 1,024 tokens on 24 GB): the
    ramp with it off meets an OOM at one row. derive still returns its plan, with
    rows_fit_without_checkpointing 0 measured and the ramp's sentence, not a WontFit."""
    pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    import torch
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from leadline.hf import find_batch_size
    from leadline.run.precision import precision_of
    from leadline.run.task import Task

    real = Task.loss_of

    def oom_unchecked(self, b, length):  # the allocator refuses every step without checkpointing
        if not precision_of(self.model).checkpointing:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, b, length)

    monkeypatch.setattr(Task, "loss_of", oom_unchecked)
    tok = make_tokenizer()
    ds = datasets.load_dataset("json", data_files=str(DATA / "prompt_completion.jsonl"), split="train")
    cfg = SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_steps=8, dataset_num_proc=None,
                    activation_checkpointing=True)
    t = SFTTrainer(model=make_model(vocab_size=len(tok)), args=cfg, train_dataset=ds, processing_class=tok,
                   peft_config=LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    plan = find_batch_size(t, progress=False).plan
    off = plan["rows_fit_without_checkpointing"]
    assert off.kind == "measured" and off.value == 0 and plan.rows_fit >= 1
    assert "not even 1 row" in off.source and off.evidence["rows_fit_with_checkpointing"] == plan.rows_fit
    assert any(r["verdict"] == "oom" for r in off.evidence["rungs"])
