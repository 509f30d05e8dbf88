"""What a built ``Trainer`` / TRL ``SFTTrainer`` will train on: its rows, labels and loss policy,
and whether its run turns gradient checkpointing on.

``derive_for(trainer)`` derives on these rows, so the plan is measured on exactly the
tokenization, truncation, packing and labels the trainer trains with (TRL's
``assistant_only_loss`` / ``completion_only_loss`` included), never on leadline's own reading
of the raw data.

Each row of the trainer's processed ``train_dataset`` goes through the trainer's own
``data_collator`` alone; its ``labels`` (-100 = not scored) are what the loss scores, counted
after the causal shift as everywhere in leadline. A packed row (TRL's ``packing=True``: one
sequence of several documents, collated padding-free) keeps its documents' boundaries as TRL
scores them: the first token of each document is not scored.

Pure reading: no model call, nothing trained; transformers is never imported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeGuard

from leadline.errors import InputError
from leadline.plan import Plan, Value

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, Trainer, TrainingArguments

POLICY_FIELDS = ("assistant_only_loss", "completion_only_loss", "packing")
"""The SFTConfig fields that decide which tokens the loss scores and how rows are laid out."""

_COLLATED = ("input_ids", "labels", "attention_mask", "seq_lengths", "position_ids",
             "completion_mask", "assistant_masks")
"""The columns a causal-LM collator reads; the others (TRL keeps ``messages``, ``prompt``,
``completion`` beside the tokens) are what Trainer's ``remove_unused_columns`` drops."""


def is_trainer(obj: object) -> TypeGuard[Trainer]:
    """A ``transformers.Trainer`` (TRL's trainers are subclasses), told by what it holds:
    ``model``, ``args``, ``train_dataset``, ``data_collator`` and ``create_optimizer``.

    Examples:
        >>> from types import SimpleNamespace
        >>> is_trainer(SimpleNamespace(model=None, args=None, train_dataset=None, data_collator=None,
        ...                            create_optimizer=None))
        True
        >>> is_trainer(SimpleNamespace(model=None, args=None))  # a model, or a half-built trainer
        False
    """
    return all(hasattr(obj, a) for a in ("model", "args", "train_dataset", "data_collator", "create_optimizer"))


def tokenizer_of(trainer: Trainer) -> PreTrainedTokenizerBase:
    """The trainer's tokenizer: its ``processing_class``, else its collator's; one sentence when
    it holds neither.

    Examples:
        >>> from types import SimpleNamespace
        >>> tokenizer_of(SimpleNamespace(processing_class=None, data_collator=SimpleNamespace(tokenizer="tok")))
        'tok'
        >>> try:
        ...     tokenizer_of(SimpleNamespace(processing_class=None, data_collator=None))
        ... except InputError as e:
        ...     print(e)
        the trainer holds no tokenizer (processing_class is None and its collator has none); pass ...
    """
    tok = getattr(trainer, "processing_class", None) or getattr(trainer.data_collator, "tokenizer", None)
    if tok is None:
        raise InputError("the trainer holds no tokenizer (processing_class is None and its collator has none); "
                         "pass processing_class=tokenizer to the Trainer or tokenizer= to derive_for")
    return tok


def loss_policy_of(trainer: Trainer) -> dict[str, Any]:
    """The trainer's loss policy as data: its class, TRL's policy fields (None for a plain
    Trainer) and ``max_length``.

    Examples:
        >>> from types import SimpleNamespace
        >>> class SFTTrainer:
        ...     args = SimpleNamespace(assistant_only_loss=True, completion_only_loss=None, packing=False,
        ...                            max_length=512)
        >>> policy = loss_policy_of(SFTTrainer())
        >>> policy["trainer"], policy["assistant_only_loss"], policy["packing"], policy["max_length"]
        ('SFTTrainer', True, False, 512)
        >>> loss_policy_of(SimpleNamespace(args=SimpleNamespace()))["assistant_only_loss"] is None  # a plain Trainer
        True
    """
    args = trainer.args
    policy: dict[str, Any] = {"trainer": type(trainer).__name__}
    for name in (*POLICY_FIELDS, "max_length"):
        policy[name] = getattr(args, name, None)
    if policy["completion_only_loss"] is None and hasattr(trainer, "completion_only_loss"):
        policy["completion_only_loss"] = trainer.completion_only_loss  # TRL resolves None from the data's format
    return policy


def trainer_rows(trainer: Trainer) -> list[dict[str, list[int]]]:
    """The trainer's processed rows as ``{"input_ids", "labels"}``, collated one at a time by
    the trainer's own collator (see the module docstring); rows with nothing to score (a packed
    sequence of prompts alone) are left out: they add no gradient.

    Examples:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> def collator(rows):
        ...     return {k: torch.tensor([r[k] for r in rows]) for k in ("input_ids", "labels")}
        >>> rows = [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]},
        ...         {"input_ids": [8, 9], "labels": [-100, -100]}]  # nothing to score
        >>> trainer = SimpleNamespace(train_dataset=rows, data_collator=collator)
        >>> trainer_rows(trainer)
        [{'input_ids': [5, 6, 7], 'labels': [-100, 6, 7]}]
    """
    ds = trainer.train_dataset
    if ds is None:
        raise InputError("the trainer has no train_dataset; pass train_dataset= to the Trainer/SFTTrainer before "
                         "derive_for(trainer)")
    columns = list(getattr(ds, "column_names", None) or (ds[0].keys() if len(ds) else []))
    if "input_ids" not in columns:
        raise InputError("the trainer's train_dataset has no input_ids (columns: "
                         f"{', '.join(map(str, columns)) or 'none'}); "
                         "give SFTTrainer text, prompt/completion or messages rows, or tokenize the rows for Trainer")
    keep = [c for c in columns if c in _COLLATED]
    out: list[dict[str, list[int]]] = []
    for i in range(len(ds)):
        row = ds[i]
        batch = trainer.data_collator([{k: row[k] for k in keep}])
        if "labels" not in batch:
            raise InputError(f"the trainer's data_collator ({type(trainer.data_collator).__name__}) builds no labels; "
                             "use DataCollatorForLanguageModeling(tokenizer, mlm=False) or give the rows a labels "
                             "column")
        ids = batch["input_ids"][0].tolist()
        labels = batch["labels"][0].tolist()
        if "attention_mask" in batch:  # right padding (pad_to_multiple_of) holds nothing to score
            n = int(batch["attention_mask"][0].sum())
            ids, labels = ids[:n], labels[:n]
        if any(t != -100 for t in labels[1:]):  # a row with nothing to score (a packed run of prompts) adds no gradient
            out.append({"input_ids": ids, "labels": labels})
    if not out:
        raise InputError("the trainer's train_dataset has no row with a label to score; check its loss policy "
                         "(assistant_only_loss needs {% generation %} in the chat template) or give it rows")
    return out


def policy_value(policy: dict[str, Any], scored_tokens: int, rows: int) -> Value:
    """``loss_policy``: what the trainer's labels score, given by the trainer.

    Examples:
        >>> policy = {"trainer": "SFTTrainer", "assistant_only_loss": True, "completion_only_loss": None,
        ...           "packing": False, "max_length": 512}
        >>> v = policy_value(policy, 1200, 24)
        >>> v.kind, v.evidence["scored_tokens"]
        ('given', 1200)
        >>> print(v.source)
        the labels SFTTrainer builds (assistant_only_loss=True, packing=False): 1,200 scored tokens on 24 rows, ...
    """
    shown = ", ".join(f"{k}={policy[k]!r}" for k in POLICY_FIELDS if policy.get(k) is not None)
    return Value(policy, "given",
                 f"the labels {policy['trainer']} builds ({shown or 'labels as the collator makes them'}): "
                 f"{scored_tokens:,} scored tokens on {rows:,} rows, each row collated by the trainer's own collator",
                 evidence={**policy, "scored_tokens": scored_tokens, "rows": rows})


def policy_of_plan(plan: Plan) -> dict[str, Any]:
    """The SFTConfig loss policy the plan was derived with: the trainer's (``loss_policy``),
    or, for a plan derived on raw rows, the one leadline's reading of the rows amounts to
    (messages: the assistant turns; prompt/completion: the completion; text: everything).

    Examples:
        >>> plan = Plan()
        >>> plan.set("rows", Value(24, "measured", "the rows read", evidence={"formats": {"messages": 24}}))
        >>> policy_of_plan(plan)
        {'packing': False, 'assistant_only_loss': True}
        >>> plan.set("loss_policy", Value({"trainer": "SFTTrainer", "assistant_only_loss": False,
        ...                                "completion_only_loss": True, "packing": True}, "given", "the trainer"))
        >>> policy_of_plan(plan)
        {'assistant_only_loss': False, 'completion_only_loss': True, 'packing': True}
    """
    if "loss_policy" in plan:
        return {k: plan["loss_policy"].value.get(k) for k in POLICY_FIELDS}
    formats = plan["rows"].evidence.get("formats", {}) if "rows" in plan else {}
    policy: dict[str, Any] = {"packing": False}
    if formats.get("messages"):
        policy["assistant_only_loss"] = True
    if formats.get("prompt_completion") or formats.get("chat_prompt_completion"):
        policy["completion_only_loss"] = True
    return policy


def check_policy(plan: Plan, args: TrainingArguments) -> None:
    """One sentence when ``args`` (an SFTConfig) trains another loss than the plan was derived for.

    A field ``args`` lacks (a plain TrainingArguments) is not checked, nor TRL's
    ``completion_only_loss=None`` (the completion where the rows have one, as the plan read them).

    Examples:
        >>> from types import SimpleNamespace
        >>> plan = Plan()
        >>> plan.set("rows", Value(24, "measured", "the rows read", evidence={"formats": {"messages": 24}}))
        >>> check_policy(plan, SimpleNamespace(assistant_only_loss=True, packing=False))  # the plan's policy
        >>> try:
        ...     check_policy(plan, SimpleNamespace(assistant_only_loss=False, packing=False))
        ... except InputError as e:
        ...     print(e)
        the plan was derived with assistant_only_loss=True but the trainer's args have assistant_only_loss=False; ...
    """
    want = policy_of_plan(plan)
    for name, value in want.items():
        if value is None or not hasattr(args, name):
            continue
        have = getattr(args, name)
        if name == "completion_only_loss" and have is None:
            continue  # TRL's default: the completion when the rows have one, as the plan read them
        if bool(have) != bool(value):
            raise InputError(f"the plan was derived with {name}={value!r} but the trainer's args have {name}={have!r}; "
                             "build the args with training_arguments(plan, args) or derive again on this trainer")


def trainer_checkpointing(trainer: Trainer) -> tuple[bool, dict[str, Any] | None]:
    """Whether the trainer's run turns gradient checkpointing on (Trainer does it in train()),
    and the kwargs it passes, less the ones Trainer takes for itself (``every_n_layers``,
    ``offload``, ``selective``).

    Examples:
        >>> from types import SimpleNamespace
        >>> args = SimpleNamespace(gradient_checkpointing=True,
        ...                        gradient_checkpointing_kwargs={"use_reentrant": False, "offload": True})
        >>> trainer_checkpointing(SimpleNamespace(args=args))
        (True, {'use_reentrant': False})
        >>> trainer_checkpointing(SimpleNamespace(args=SimpleNamespace()))
        (False, None)
    """
    args = trainer.args
    on = bool(getattr(args, "activation_checkpointing", False) or getattr(args, "gradient_checkpointing", False))
    kw = dict(getattr(args, "activation_checkpointing_kwargs", None)
              or getattr(args, "gradient_checkpointing_kwargs", None) or {})
    for k in ("every_n_layers", "offload", "selective"):
        kw.pop(k, None)
    return on, kw or None
