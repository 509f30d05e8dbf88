import pytest

from leadline import InputError, Plan, Value
from leadline.hf import training_arguments


def _plan():
    p = Plan()
    p.set("micro_batch", Value(3, "measured", "the ramp"))
    p.set("grad_accum", Value(5, "derived", "ceil(tokens_per_step / tokens per micro-batch)"))
    p.set("lr", Value(3.2e-4, "measured", "the look-ahead"))
    p.set("warmup_steps", Value(10, "derived", "1/(1-beta1)"))
    p.set("weight_decay", Value(0.0, "derived", "decay within the run pulls weights to zero"))
    p.set("betas", Value([0.9, 0.999], "constant", "the optimizer's defaults"))
    return p


def test_fields_from_plan():
    f = training_arguments(_plan())
    assert f == {
        "per_device_train_batch_size": 3, "gradient_accumulation_steps": 5, "learning_rate": 3.2e-4,
        "warmup_steps": 10, "weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.999,
        "lr_scheduler_type": "constant_with_warmup",
    }


def test_fills_real_training_arguments(tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), learning_rate=1e-3, per_device_train_batch_size=8, report_to=[])
    new = training_arguments(_plan(), args, max_steps=7)
    assert new.per_device_train_batch_size == 3 and new.gradient_accumulation_steps == 5
    assert new.learning_rate == 3.2e-4 and new.max_steps == 7 and new.warmup_steps == 10
    assert args.learning_rate == 1e-3  # the original is untouched


def test_empty_plan_is_refused():
    with pytest.raises(InputError, match="derive one first"):
        training_arguments(Plan())
