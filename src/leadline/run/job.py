"""The run's job: the rows prepared once (tokenized, split, profiled), the run's length, its warmup,
and what the fit and the run measure into it as they go (the micro-batch, its halvings)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.rate.guard import check_plan
from leadline.run.length import MAX_PASSES
from leadline.run.options import ROWS_PER_STEP, WARMUP_SHARE, RunOptions

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from leadline.corpus.rows import RowSource


def run_steps_of(rows: int, rows_per_step: int, total_steps: int | None, epochs: float | None) -> int:
    """The run's length: ``total_steps``, else ``epochs`` passes (one by default) over ``rows``.

    Examples:
        >>> run_steps_of(1600, 16, None, None), run_steps_of(800, 16, None, 3), run_steps_of(800, 16, 7, None)
        (100, 150, 7)
        >>> run_steps_of(8, 16, None, None)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: 8 training rows are fewer than one step of 16 rows; pass --rows-per-step 8 or less
    """
    if total_steps:
        return int(total_steps)
    if rows < rows_per_step:
        raise InputError(f"{rows} training rows are fewer than one step of {rows_per_step} rows; pass "
                         f"--rows-per-step {rows} or less")
    return max(1, math.floor((epochs or 1.0) * rows / rows_per_step))


@dataclass
class Job:
    """What the run is given and what it measured before its first step."""

    task: Any
    profile: Any
    params: list[Any]
    steps: int
    rows_per_step: int
    warmup: int
    trained_as: str
    step: Callable[[int], float] = field(default=lambda s: math.nan)
    micro_batch: int = 0
    tried: list[dict[str, Any]] = field(default_factory=list)
    fit_seconds: float = 0.0
    epochs: float | None = None
    check_rows: int | None = None  # the held-out rows the checks and the verdict read, where the rest trained
    joined: int = 0  # held-out rows that joined the training rows after the opening
    pass_steps: int = 0  # one pass's steps (after held-out rows joined)
    passes_left: int = 0  # passes the run may still add where its length was not given (run.length)
    passes_why: str = "given"  # why the run took the passes it took (run.length.stop_sentence)
    halved: list[dict[str, int]] = field(default_factory=list)  # the micro-batch halved mid-run: step, from, to


@dataclass
class Prepared:
    """The rows a run prepared (tokenized, split, profiled) and what they were prepared from."""

    task: Any
    profile: Any
    tokenizer: Any
    data: Any
    seed: int
    fields: dict[str, str] | None

    def fits(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, data: RowSource, seed: int,
             seq_len: int | None, fields: dict[str, str] | None) -> bool:
        """Whether these are the rows a run of ``model`` on ``data`` would prepare: the same model,
        tokenizer and data (the same object, or the same path), seed, fields and sequence length.

        Examples:
            >>> from types import SimpleNamespace
            >>> m, tok = object(), object()
            >>> p = Prepared(SimpleNamespace(model=m, seq_len=512), None, tok, "train.jsonl", 0, None)
            >>> p.fits(m, tok, "train.jsonl", 0, None, None), p.fits(m, tok, "train.jsonl", 0, 512, None)
            (True, True)
            >>> p.fits(m, tok, "other.jsonl", 0, None, None), p.fits(m, tok, "train.jsonl", 1, None, None)
            (False, False)
        """
        paths = isinstance(data, (str, os.PathLike)) and isinstance(self.data, (str, os.PathLike))
        same_data = data is self.data or (paths and os.fspath(data) == os.fspath(self.data))
        return (self.task.model is model and tokenizer is self.tokenizer and same_data and seed == self.seed
                and (fields or None) == (self.fields or None) and seq_len in (None, self.task.seq_len))


def prepare_job(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, data: RowSource, options: RunOptions,
                prepared: Prepared | None = None) -> Job:
    """The rows tokenized and split (or a race's ``prepared`` rows, where they fit and no test rows
    are asked for), the trained tensors, the run's length and warmup."""
    from leadline.run.task import prepare, trained_as_of, trained_named_weights

    o = options
    rps = int(o.rows_per_step) if o.rows_per_step is not None else ROWS_PER_STEP
    if (prepared is not None and not o.test_share and o.eval_data is None
            and prepared.fits(model, tokenizer, data, o.seed, o.seq_len, o.fields)):
        task, profile = replace(prepared.task, order=list(prepared.task.order)), prepared.profile
    else:
        task, profile = prepare(model, tokenizer, data, seq_len=o.seq_len, seed=o.seed, fields=o.fields,
                                test=float(o.test_share), eval_dataset=o.eval_data)
    steps = run_steps_of(len(task.order), rps, o.total_steps, o.epochs)
    job = Job(task, profile, [p for _, p in trained_named_weights(model)], steps, rps,
              max(1, round(WARMUP_SHARE * steps)), trained_as_of(model), epochs=o.epochs)
    if not o.total_steps and not o.epochs:  # no length given: pass by pass (leadline.run.length)
        job.passes_left, job.passes_why = MAX_PASSES - 1, "flat"
    return job


def join_held_out(job: Job, fixed_steps: bool) -> None:
    """The held-out rows past the checks' subset join the training rows: appended to the run's order
    (so they train late in its first pass, after every row the opening trained on), the run
    lengthened by their steps unless its length was given. The checks and the verdict read the
    subset alone from here on."""
    task = job.task
    rows, _ = check_plan(len(task.split.held_out), job.rows_per_step, job.steps)
    extra = list(task.split.held_out[rows:])
    job.check_rows = rows
    if not extra:
        return
    task.order.extend(extra)  # the run's step function reads this list: the rows join its draws
    job.joined = len(extra)
    if not fixed_steps:
        job.steps = run_steps_of(len(task.order), job.rows_per_step, None, job.epochs)
