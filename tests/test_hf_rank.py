"""derive_for(..., options=DeriveOptions(fit_rank=True)): the largest LoRA rank whose real step fits
at the plan's shape, measured on a probe adapter beside the model's own, which is left exactly as it was."""

from __future__ import annotations

import pytest

from helpers import DATA, make_model, make_tokenizer
from leadline import InputError, Plan, Value
from leadline.lookahead.digest import tensors_digest

pytest.importorskip("peft")


def _lora(model, r: int = 4):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM"))


def _state(model):
    return (tensors_digest(list(model.parameters())), sorted(model.peft_config), model.active_adapter,
            {n: p.requires_grad for n, p in model.named_parameters()}, model.training)


def test_derive_for_measures_the_rank_at_the_plans_shape_and_leaves_the_adapter_as_it_was():
    from leadline.hf import DeriveOptions, derive_for
    from leadline.lookahead.fit_rank import RANKS

    tok = make_tokenizer()
    model = _lora(make_model(vocab_size=len(tok)))
    model.eval()
    before = _state(model)
    plan = derive_for(model, tok, str(DATA / "prompt_completion.jsonl"), total_steps=8, effort="full",
                      options=DeriveOptions(fit_rank=True))
    v = plan["lora_rank_fit"]
    assert v.kind == "measured" and v.value in RANKS
    tried = v.evidence["tried"]
    fitted = [t["rank"] for t in tried if t["verdict"] == "fits"]
    assert tried and v.value == max(fitted) and all(t["verdict"] != "fits" for t in tried if t["rank"] > v.value)
    assert all(t["peak_bytes"] for t in tried if t["verdict"] == "fits")  # each rank's real step measured
    assert f"{plan.micro_batch} rows" in v.source or f"{plan.micro_batch} row" in v.source
    assert "the plan trains rank 4" in v.source
    assert _state(model) == before  # the own adapter, its flags and the eval mode as they were; no probe left


def test_a_card_nothing_fits_on_says_so_and_still_puts_everything_back():
    from leadline.lookahead.fit_rank import rank_fit_for

    model = _lora(make_model())
    model.eval()
    before = _state(model)
    found = rank_fit_for(model, 2, 16, ranks=(1, 2, 4), card_bytes=1)
    assert found.rank is None and found.tried and all(t["verdict"] != "fits" for t in found.tried)
    assert "no LoRA rank tried fits" in found.as_values()["lora_rank"].source
    assert _state(model) == before  # the eval mode included


def test_fit_rank_is_refused_for_a_model_without_lora_before_anything_runs():
    from leadline.hf import DeriveOptions, derive_for

    tok = make_tokenizer()
    with pytest.raises(InputError, match="fit_rank needs a PEFT model with a LoRA adapter"):
        derive_for(make_model(vocab_size=len(tok)), tok, str(DATA / "missing.jsonl"), effort="full",
                   options=DeriveOptions(fit_rank=True))


def test_too_little_time_left_is_a_note_not_a_measurement():
    from leadline.lookahead.fit_rank import fit_rank_values

    plan = Plan()
    for name, value in {"micro_batch": 2, "seq_len": 16, "t_micro_seconds": 1.0, "t_step_seconds": 0.5}.items():
        plan.set(name, Value(value, "measured", "for the test"))
    model = _lora(make_model())
    assert fit_rank_values(plan, model, seconds_left=3.0) == {}
    assert any("fit_rank: not measured" in n and "max_seconds" in n for n in plan.notes)
    empty = Plan()
    assert fit_rank_values(empty, model) == {} and "no micro_batch" in empty.notes[-1]


def test_a_plan_for_float32_adapters_on_a_bfloat16_model_names_the_gap_and_a_float32_model_does_not():
    import torch

    from leadline.hf import derive_for

    tok = make_tokenizer()
    bf16 = _lora(make_model(vocab_size=len(tok)).to(torch.bfloat16))
    assert next(p for n, p in bf16.named_parameters() if "lora_" in n).dtype == torch.float32  # PEFT's default
    plan = derive_for(bf16, tok, str(DATA / "prompt_completion.jsonl"), total_steps=8, effort="full")
    notes = [n for n in plan.notes if "LoRA adapters are float32 on a bfloat16 model" in n]
    assert len(notes) == 1 and "lora_adapter_dtype_cpu.py" in notes[0]
    plan = derive_for(_lora(make_model(vocab_size=len(tok))), tok, str(DATA / "prompt_completion.jsonl"), total_steps=8, effort="full")
    assert not [n for n in plan.notes if "adapters are float32" in n]
