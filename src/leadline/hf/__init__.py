"""Hugging Face: derive a plan from a ``PreTrainedModel`` (PEFT or not) and a data set in any
corpus format, without hand-written adapters; apply it to ``TrainingArguments``; run the
schedule and the memory watch inside ``Trainer``.

    from leadline.hf import derive_for
    plan = derive_for(model, tokenizer, "train.jsonl", total_steps=300)
    args = training_arguments(plan, TrainingArguments(output_dir="out"))
    trainer = Trainer(model=model, args=args, ..., callbacks=[LeadlineCallback.for_plan(plan, ...)])

What shapes derive()'s phases (``effort="full"``: ``max_seconds``, ``held_out``,
``fit_rank``, ...) goes in ``derive_for(..., options=DeriveOptions(...))``.

One answer each (:mod:`leadline.hf.find`): ``find_batch_size(trainer).suggestion()``,
``find_lr(trainer).suggestion()``.
"""

from __future__ import annotations

from typing import Any

from leadline.hf.args import training_arguments
from leadline.hf.deriving import DeriveOptions, derive_for, derive_parts
from leadline.hf.find import FoundBatchSize, FoundRate, find_batch_size, find_lr
from leadline.hf.loading import load_model, load_tokenizer
from leadline.run.task import Task, prepare, tokens_to_steps, trained_as_of, trained_named_weights

__all__ = ["DeriveOptions", "FoundBatchSize", "FoundRate", "LeadlineCallback", "Task", "derive_for", "derive_parts",
           "find_batch_size", "find_lr", "load_model", "load_tokenizer", "prepare", "tokens_to_steps", "trained_as_of",
           "trained_named_weights", "training_arguments"]


def __getattr__(name: str) -> Any:
    # LeadlineCallback lives in its own module (it imports transformers' TrainerCallback).
    if name == "LeadlineCallback":
        from leadline.hf.callback import LeadlineCallback

        return LeadlineCallback
    raise AttributeError(f"module 'leadline.hf' has no attribute {name!r}")
