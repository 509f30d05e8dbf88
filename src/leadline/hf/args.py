"""A plan as Hugging Face ``TrainingArguments`` / TRL ``SFTConfig`` fields.

Pure mapping: no transformers import until an ``args`` object is given.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.plan import Plan

if TYPE_CHECKING:
    from transformers import TrainingArguments

# plan value -> TrainingArguments field
_FIELDS = {
    "micro_batch": "per_device_train_batch_size",
    "grad_accum": "gradient_accumulation_steps",
    "lr": "learning_rate",
    "warmup_steps": "warmup_steps",
    "weight_decay": "weight_decay",
    "total_steps": "max_steps",
}
SCHEDULE_FREE = "schedule_free_adamw"
"""A race plan's ``optimizer``, and Trainer's ``optim`` name for schedule-free AdamW."""


def training_fields(plan: Plan) -> dict[str, Any]:
    """The TrainingArguments fields the plan decides, by name, with the plan's numbers.

    The schedule: a plan whose ending is decided by LookaheadSchedule (the default) maps to
    ``constant_with_warmup`` — the LeadlineCallback then checks, rolls back and decides the
    ending inside Trainer; a plan that measured a decayed ending maps to ``linear``. Trainer's
    warmup rises from zero; the plan's rises from alpha1, which only the LeadlineCallback (it
    sets the rate before every step) runs. A plan whose rate is at or below alpha1 has
    ``warmup_steps`` 0, so Trainer adds none.

    A race plan (``optimizer`` ``schedule_free_adamw``, derive_for's default effort) maps to
    ``optim="schedule_free_adamw"`` and ``lr_scheduler_type="constant"``: Trainer hands
    ``warmup_steps`` and ``weight_decay`` to ``schedulefree.AdamWScheduleFree`` itself, which
    warms the rate up inside its step, so the constant scheduler adds no second warmup; and
    ``max_grad_norm=0`` (no clipping), as the race's steps ran. The run then steps as the race's
    candidates stepped (betas, eps, ``r`` and ``weight_lr_power`` at Trainer's and schedulefree's
    shared defaults).

    Raises:
        InputError: the plan holds none of the fields (nothing derived yet).

    Examples:
        >>> from leadline import Plan, Value
        >>> plan = Plan()
        >>> plan.set("micro_batch", Value(4, "measured", "the ramp"))
        >>> plan.set("lr", Value(3e-4, "measured", "the look-ahead"))
        >>> training_fields(plan)
        {'per_device_train_batch_size': 4, 'learning_rate': 0.0003, 'lr_scheduler_type': 'constant_with_warmup'}
        >>> plan.set("ending", Value("linear", "measured", "the raced ending"))
        >>> training_fields(plan)["lr_scheduler_type"]
        'linear'
        >>> race = Plan()
        >>> race.set("optimizer", Value("schedule_free_adamw", "constant", "schedule-free AdamW"))
        >>> race.set("lr", Value(1e-2, "measured", "won the opening race"))
        >>> race.set("warmup_steps", Value(4, "constant", "2% of the run"))
        >>> fields = training_fields(race)
        >>> fields["optim"], fields["lr_scheduler_type"], fields["warmup_steps"], fields["max_grad_norm"]
        ('schedule_free_adamw', 'constant', 4, 0.0)
    """
    out: dict[str, Any] = {}
    for name, field in _FIELDS.items():
        if name in plan:
            v = plan[name].value
            out[field] = int(v) if field in ("per_device_train_batch_size", "gradient_accumulation_steps",
                                             "warmup_steps", "max_steps") else float(v)
    if "betas" in plan:
        b1, b2 = plan["betas"].value
        out["adam_beta1"], out["adam_beta2"] = float(b1), float(b2)
    if not out:
        raise InputError("the plan holds none of micro_batch, grad_accum, lr, warmup_steps, weight_decay, betas; "
                         "derive one first")
    if plan.get("optimizer") == SCHEDULE_FREE:
        out.update(optim=SCHEDULE_FREE, lr_scheduler_type="constant", max_grad_norm=0.0)
        return out
    ending = plan.get("ending", "lookahead")
    out["lr_scheduler_type"] = "linear" if ending == "linear" else "constant_with_warmup"
    return out


def sft_fields(plan: Plan) -> dict[str, Any]:
    """The TRL ``SFTConfig`` fields the plan was derived with: ``max_length`` (the plan's
    ``seq_len``: SFTTrainer truncates there), and the loss policy and packing
    (:func:`leadline.hf.trainer.policy_of_plan`: the trainer's when the plan was derived on one,
    else what leadline's reading of the rows scored — the assistant turns of ``messages`` rows,
    the completion of prompt/completion rows).

    Examples:
        >>> from leadline import Plan, Value
        >>> plan = Plan()
        >>> sft_fields(plan)
        {}
        >>> plan.set("seq_len", Value(512, "measured", "the corpus's lengths"))
        >>> plan.set("rows", Value(24, "measured", "the rows read", evidence={"formats": {"messages": 24}}))
        >>> sft_fields(plan)
        {'max_length': 512, 'packing': False, 'assistant_only_loss': True}
    """
    from leadline.hf.trainer import policy_of_plan

    out: dict[str, Any] = {}
    if "seq_len" in plan:
        out["max_length"] = int(plan["seq_len"].value)
    if "loss_policy" in plan or "rows" in plan:
        out.update({k: v for k, v in policy_of_plan(plan).items() if v is not None})
    return out


def training_arguments(plan: Plan, args: TrainingArguments | None = None,
                       **overrides: object) -> TrainingArguments | dict[str, Any]:
    """``args`` (a TrainingArguments or TRL SFTConfig) with the plan's fields filled in; a
    new object, ``args`` itself is not changed. Without ``args``, the fields as a dict.
    Keyword ``overrides`` win over the plan.

    An SFTConfig also gets :func:`sft_fields` (``max_length``, ``assistant_only_loss``,
    ``completion_only_loss``, ``packing``); a plain TrainingArguments, which has none of them,
    does not.

    Examples:
        >>> from leadline import Plan, Value
        >>> from transformers import TrainingArguments
        >>> plan = Plan()
        >>> plan.set("micro_batch", Value(4, "measured", "the ramp"))
        >>> plan.set("lr", Value(3e-4, "measured", "the look-ahead"))
        >>> fields = training_arguments(plan, max_steps=100)  # no args: the fields as a dict
        >>> fields["per_device_train_batch_size"], fields["learning_rate"], fields["max_steps"]
        (4, 0.0003, 100)
        >>> args = TrainingArguments(output_dir="out", report_to=[])
        >>> new = training_arguments(plan, args, max_steps=100)
        >>> new.per_device_train_batch_size, new.learning_rate, new.max_steps, args.learning_rate
        (4, 0.0003, 100, 5e-05)
        >>> try:
        ...     training_arguments(plan, {"learning_rate": 1e-3})
        ... except InputError as e:
        ...     print(e)
        training_arguments needs a TrainingArguments/SFTConfig, got dict
    """
    fields = {**training_fields(plan), **sft_fields(plan), **overrides}
    if args is None:
        return fields
    if dataclasses.is_dataclass(args):
        known = {f.name for f in dataclasses.fields(args)}
        sft_only = set(sft_fields(plan)) - set(overrides)
        fields = {k: v for k, v in fields.items() if k in known or k not in sft_only}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise InputError(f"{type(args).__name__} has no field(s) {', '.join(unknown)}; pass TrainingArguments or "
                             "SFTConfig")
        return dataclasses.replace(args, **fields)
    raise InputError(f"training_arguments needs a TrainingArguments/SFTConfig, got {type(args).__name__}")
