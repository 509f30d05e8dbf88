"""One answer each, in the shape the ecosystem knows (Lightning's ``lr_find(...).suggestion()``,
accelerate's ``find_executable_batch_size``): the batch a trainer should run and the rate it
should run at, each a thin call over derive()'s own phases (:func:`leadline.hf.deriving.derive_parts`).

    from leadline.hf import find_batch_size, find_lr
    found = find_batch_size(trainer)          # the noise scale, the memory ramp, the step
    found.suggestion()                        # per_device_train_batch_size
    found.why(); found.plot("ramp.svg")
    rate = find_lr(trainer)                   # schedule-free AdamW's rate, raced at the trainer's batch
    trainer.args.learning_rate = rate.suggestion()   # a trainer with optim="schedule_free_adamw"

Each result holds the plan of the phases it ran (``found.plan``: every value with its source
and evidence, JSON like any plan), and leaves the model as it was.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.plan import Plan
from leadline.run.fit import halved

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase, Trainer, TrainingArguments

    from leadline.corpus.rows import RowSource

__all__ = ["FoundBatchSize", "FoundRate", "find_batch_size", "find_lr"]


@dataclass
class _Found:
    plan: Plan
    name: str
    plots: tuple[str, ...]

    def suggestion(self) -> Any:
        """The number found (``plan.get(name)``)."""
        return self.plan.get(self.name)

    def why(self) -> str:
        """The value's line, its cost and its whole evidence (:meth:`Plan.why`), for each
        number the answer rests on."""
        return "\n\n".join(self.plan.why(n) for n in self._shown())

    def _shown(self) -> list[str]:
        return [self.name]

    def plot(self, path: str | os.PathLike[str] | None = None) -> str | None:
        """The evidence drawn as an SVG (the report's figure), written to ``path`` when given;
        None when the evidence has no drawing or matplotlib is missing (``pip install
        'leadline[hf]'``)."""
        for name in self.plots:
            if name in self.plan:
                svg = _draw(self.plan[name].evidence, self.plan[name].value, path)
                if svg is not None:
                    return svg
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}={self.suggestion()!r})"


def _draw(evidence: Any, chosen: Any, path: str | os.PathLike[str] | None) -> str | None:
    """``evidence``'s figure with ``chosen`` marked, written to ``path`` when given."""
    from leadline.report.plots import render_svg

    svg = render_svg(evidence, chosen=chosen)
    if svg is not None and path is not None:
        Path(path).write_text(svg)
    return svg


@dataclass(repr=False)
class FoundBatchSize(_Found):
    """What :func:`find_batch_size` found. ``suggestion()`` is the micro-batch
    (``per_device_train_batch_size``): the rows the target step needs, at most the rows a
    training run fits; ``grad_accum`` makes up the step, ``rows_fit`` is the most rows that fit.

    ``why()`` gives each number's line, cost and evidence (:meth:`Plan.why`); ``plot(path)`` the
    ramp's figure as SVG with ``suggestion()`` marked as the one chosen (the ramp measured
    ``rows_fit``; the suggestion is the measured step's rows, at most it), None where the evidence
    has no drawing or matplotlib is missing.

    ``leadline run`` (:func:`leadline.run.one.run_in_one`) does not take the measured step: it
    keeps the recipe's 16 rows a step and its micro-batch is the most of them a forward and
    backward runs, halved to a divisor of the step at each out-of-memory error (off a CUDA card,
    the whole step). :meth:`run_micro_batch` applies that rule to this ramp's ``rows_fit``: the
    micro-batch the run would train at on this card, from the same measurement.

    Examples:
        >>> from leadline.plan import Plan, Value
        >>> plan = Plan()
        >>> plan.set("rows_fit", Value(12, "measured", "the memory ramp", seconds=4.2, unit="rows"))
        >>> plan.set("micro_batch", Value(8, "derived", "the rows the step needs, at most rows_fit", unit="rows"))
        >>> plan.set("grad_accum", Value(2, "derived", "ceil(rows a step / micro_batch)"))
        >>> found = FoundBatchSize(plan, "micro_batch", ("rows_fit", "micro_batch"))
        >>> found, found.suggestion(), found.grad_accum, found.rows_fit
        (FoundBatchSize(micro_batch=8), 8, 2, 12)
        >>> print(found.why().splitlines()[0])
        micro_batch = 8 rows  [derived] the rows the step needs, at most rows_fit
        >>> found.plot() is None  # no ramp's rungs recorded to draw
        True
        >>> found.run_micro_batch(), found.run_micro_batch(12)  # 16 rows a step: 16 > 12, halved to 8
        (8, 12)
    """

    def plot(self, path: str | os.PathLike[str] | None = None) -> str | None:
        """The ramp's figure with ``suggestion()`` marked, written to ``path`` when given; None
        when the plan has no ramp to draw or matplotlib is missing."""
        if "rows_fit" not in self.plan:
            return None
        return _draw(self.plan["rows_fit"].evidence, self.suggestion(), path)

    def run_micro_batch(self, rows_per_step: int = 16) -> int:
        """The micro-batch ``leadline run`` trains a step of ``rows_per_step`` rows at (its default
        16) by its rule, read from the ramp's ``rows_fit``: the whole step where it fits (or the
        ramp ran off a CUDA card, where the run takes the whole step), else the step halved to a
        divisor of it until it is at most ``rows_fit``, as the run halves at each out-of-memory error.
        """
        rows_per_step = int(rows_per_step)
        if rows_per_step < 1:
            raise InputError(f"rows_per_step must be a whole number of rows >= 1, got {rows_per_step}")
        ramp = self.plan["rows_fit"].evidence if "rows_fit" in self.plan else None
        device = ramp.get("device") if isinstance(ramp, dict) else None
        if device is not None and not str(device).startswith("cuda"):
            return rows_per_step
        mb, fit = rows_per_step, max(1, self.rows_fit)
        while mb > fit:
            mb = halved(mb, rows_per_step)
        return mb

    @property
    def grad_accum(self) -> int:
        """The micro-batches a step accumulates (1 when the plan has none)."""
        return int(self.plan.get("grad_accum", 1))

    @property
    def rows_fit(self) -> int:
        """The most rows a training run's micro-batch fits, measured by the memory ramp."""
        return int(self.plan.get("rows_fit"))

    def _shown(self) -> list[str]:
        return [n for n in ("micro_batch", "grad_accum", "rows_fit", "tokens_per_step", "noise_scale_tokens")
                if n in self.plan]


@dataclass(repr=False)
class FoundRate(_Found):
    """What :func:`find_lr` found. ``suggestion()`` is the learning rate; ``optimizer`` the
    optimizer it is the rate of. The race (``effort="race"``) is schedule-free AdamW's;
    the look-ahead's is AdamW's, with ``alpha1`` the first safe step it started from.

    Examples:
        >>> from leadline.plan import Plan, Value
        >>> plan = Plan()
        >>> plan.set("alpha1", Value(1e-3, "measured", "the first safe step"))
        >>> plan.set("lr", Value(4e-4, "measured", "the look-ahead"))
        >>> rate = FoundRate(plan, "lr", ("lr", "alpha1"))
        >>> rate, rate.suggestion(), rate.alpha1, rate.optimizer
        (FoundRate(lr=0.0004), 0.0004, 0.001, 'adamw')
    """

    @property
    def optimizer(self) -> str:
        """Trainer's ``optim`` family the rate is for: ``schedule_free_adamw`` for the race's
        plan, ``adamw`` otherwise."""
        return str(self.plan.get("optimizer", "adamw"))

    @property
    def alpha1(self) -> float | None:
        """The first safe step the search started from (None when not measured)."""
        return self.plan.get("alpha1")

    def _shown(self) -> list[str]:
        return [n for n in ("lr", "optimizer", "alpha1", "warmup_steps") if n in self.plan]


def find_batch_size(trainer: Trainer | torch.nn.Module, tokenizer: PreTrainedTokenizerBase | None = None,
                    train_dataset: RowSource | None = None, *, max_seconds: float | None = None,
                    progress: bool | None = None, seed: int = 0) -> FoundBatchSize:
    """The micro-batch and accumulation a trainer should run: derive's noise scale, memory
    ramp and step (B* = sqrt(B_noise x tokens per micro-batch x t_step / t_micro), McCandlish
    et al. 2018, <https://arxiv.org/abs/1812.06162>), on the trainer's own rows and model as it
    trains (gradient checkpointing, precision), nothing else.

    Args:
        trainer: a built ``Trainer``/``SFTTrainer``, or a model with ``tokenizer`` and
            ``train_dataset``.
        max_seconds: a bound on the whole search.
        progress: a bar over the phases (default: when stderr is a terminal).
        seed: the split and the row order.

    Returns:
        :class:`FoundBatchSize`; ``suggestion()`` is ``per_device_train_batch_size``.

    Raises:
        InputError: the search found no micro-batch (within ``max_seconds``).

    Examples:
        The batch phases time real steps (seconds even on a tiny model; :func:`find_lr` shows a
        run); a model given without its tokenizer and rows is refused before any work:

        >>> import torch
        >>> try:
        ...     find_batch_size(torch.nn.Linear(4, 2))
        ... except InputError as e:
        ...     print(e)
        derive_for needs a Trainer/SFTTrainer, or a model, its tokenizer and the train_dataset; got a model alone
    """
    from leadline.hf.deriving import DeriveOptions, derive_parts

    plan = derive_parts(trainer, tokenizer, train_dataset, measure=("batch",), progress=progress, seed=seed,
                        options=DeriveOptions(max_seconds=max_seconds), **_length_of(trainer))
    if "micro_batch" not in plan:
        raise InputError(_unfinished("find_batch_size", "micro_batch", plan, max_seconds))
    return FoundBatchSize(plan, "micro_batch", ("rows_fit", "micro_batch"))


def find_lr(trainer: Trainer | torch.nn.Module, tokenizer: PreTrainedTokenizerBase | None = None,
            train_dataset: RowSource | None = None, *, micro_batch: int | None = None, grad_accum: int | None = None,
            effort: str = "race", max_seconds: float | None = None, progress: bool | None = None,
            seed: int = 0) -> FoundRate:
    """The learning rate for the trainer's batch, for its run's length.

    ``effort="race"`` (the default, as ``derive_for``'s and ``leadline run``'s): schedule-free
    AdamW's rate, decided by the opening race (:func:`leadline.run.race_only`) at the trainer's
    ``per_device_train_batch_size`` x ``gradient_accumulation_steps`` rows a step (16 without a
    trainer or ``micro_batch``), the model left as it was. It is the rate of a run with ``optim="schedule_free_adamw"``,
    ``lr_scheduler_type="constant"`` and the plan's warmup
    (:func:`~leadline.hf.training_arguments` of ``rate.plan`` sets them all); a trainer whose
    ``optim`` is another is refused. ``effort="full"``: derive's first safe step (alpha1) and the
    look-ahead, the real optimizer (AdamW) run from the same weights on the same rows at
    alpha1 x 2^j, the held-out loss compared by a paired test, at the trainer's batch.

    Args:
        trainer: a built ``Trainer``/``SFTTrainer``, or a model with ``tokenizer`` and
            ``train_dataset``.
        micro_batch / grad_accum: the step's batch (default: the trainer's arguments; needed
            without a trainer).
        effort: ``"race"`` (schedule-free AdamW's rate) or ``"full"`` (the look-ahead).
        max_seconds: a bound on the whole search.

    Returns:
        :class:`FoundRate`; ``suggestion()`` is ``learning_rate``.

    Examples:
        The look-ahead on a tiny Llama and 20 rows, at 2 rows a step (seconds on a CPU core), the
        model left as it was:

        >>> import torch
        >>> from tokenizers import Tokenizer, models, pre_tokenizers
        >>> from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
        >>> words = ["<eos>", "<unk>", "the", "a", "cat", "dog", "sat", "on", "mat"]
        >>> wl = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
        >>> wl.pre_tokenizer = pre_tokenizers.Whitespace()
        >>> tokenizer = PreTrainedTokenizerFast(tokenizer_object=wl, eos_token="<eos>", pad_token="<eos>")
        >>> _ = torch.manual_seed(0)
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32,
        ...                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
        >>> rows = [{"text": f"{a} {b} sat on {c} mat"} for a in ("the", "a") for b in ("cat", "dog")
        ...         for c in ("the", "a", "cat", "dog", "mat")]
        >>> before = [p.detach().clone() for p in model.parameters()]
        >>> rate = find_lr(model, tokenizer, rows, micro_batch=2, effort="full", progress=False)
        >>> rate.plan["alpha1"].kind, rate.plan["micro_batch"].kind, rate.plan["lr"].kind
        ('measured', 'given', 'measured')
        >>> rate.suggestion() == rate.plan.lr
        True
        >>> all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        True
        >>> try:
        ...     find_lr(model, tokenizer, rows, effort="full")  # no trainer to read the batch from
        ... except InputError as e:
        ...     print(e)
        find_lr needs the step's batch: pass micro_batch= (and grad_accum=), or a Trainer whose arguments hold it
    """
    search = _RateSearch(micro_batch, grad_accum, effort, max_seconds, progress, seed)
    return _found_rate(trainer, tokenizer, train_dataset, search)


@dataclass(frozen=True)
class _RateSearch:
    """find_lr's keywords: the step's batch, the effort, the bound on time, the progress bar, the seed."""

    micro_batch: int | None
    grad_accum: int | None
    effort: str
    max_seconds: float | None
    progress: bool | None
    seed: int


def _found_rate(trainer: Any, tokenizer: Any, train_dataset: Any, search: _RateSearch) -> FoundRate:
    """find_lr's search: the opening race's rate, or derive's rate phases at the trainer's batch."""
    from leadline.hf.deriving import DeriveOptions, check_effort, derive_parts
    from leadline.hf.trainer import is_trainer

    check_effort(search.effort)
    args = trainer.args if is_trainer(trainer) else None
    if search.effort == "race":
        return _race_rate(trainer, tokenizer, train_dataset, args, search)
    batch = _step_batch(args, search.micro_batch, search.grad_accum)
    length = _length_of(trainer, batch[0] * batch[1])
    plan = derive_parts(trainer, tokenizer, train_dataset, measure=("rate",), batch=batch, effort=search.effort,
                        progress=search.progress, seed=search.seed,
                        options=DeriveOptions(max_seconds=search.max_seconds), **length)
    if "lr" not in plan:
        raise InputError(_unfinished("find_lr", "lr", plan, search.max_seconds))
    return FoundRate(plan, "lr", ("lr", "alpha1"))


def _step_batch(args: Any, micro_batch: int | None, grad_accum: int | None) -> tuple[int, int]:
    """``(micro_batch, grad_accum)``: as given, else the trainer's arguments' (accumulation 1
    without them); refused where no micro-batch is given or read."""
    micro_batch = micro_batch or (int(args.per_device_train_batch_size) if args is not None else None)
    grad_accum = grad_accum or (int(args.gradient_accumulation_steps) if args is not None else 1)
    if micro_batch is None:
        raise InputError("find_lr needs the step's batch: pass micro_batch= (and grad_accum=), or a Trainer whose "
                         "arguments hold it")
    return micro_batch, grad_accum


def _race_rate(trainer: Any, tokenizer: Any, train_dataset: Any, args: TrainingArguments | None,
               search: _RateSearch) -> FoundRate:
    """find_lr's race: derive_for's, at the trainer's rows a step, for a trainer that runs
    schedule-free AdamW."""
    from leadline.hf.deriving import DeriveOptions, derive_for

    optim = str(getattr(getattr(args, "optim", None), "value", getattr(args, "optim", None)))
    if args is not None and optim != "schedule_free_adamw":
        raise InputError(f"find_lr's race measures schedule-free AdamW's rate, and the trainer's optim is {optim!r}; "
                         "set optim='schedule_free_adamw' and lr_scheduler_type='constant' in its arguments "
                         "(training_arguments(plan, args) sets both), or pass effort='full' for an AdamW rate")
    micro_batch = search.micro_batch or (int(args.per_device_train_batch_size) if args is not None else None)
    grad_accum = search.grad_accum or (int(args.gradient_accumulation_steps) if args is not None else 1)
    rows_per_step = micro_batch * grad_accum if micro_batch else None
    plan = derive_for(trainer, tokenizer, train_dataset, effort="race", progress=search.progress, seed=search.seed,
                      rows_per_step=rows_per_step, options=DeriveOptions(max_seconds=search.max_seconds),
                      **_length_of(trainer, rows_per_step))
    return FoundRate(plan, "lr", ("lr",))


def _length_of(trainer: Any, rows_per_step: int | None = None) -> dict[str, Any]:
    """The run's length as derive takes it: a trainer's ``max_steps``; else, with the step's
    rows known, its epochs in steps as Trainer counts them (ceil(rows / micro-batch) batches an
    epoch, accumulated); else its epochs (one without a trainer)."""
    from leadline.hf.trainer import is_trainer

    if not is_trainer(trainer):
        return {}
    args = trainer.args
    if int(getattr(args, "max_steps", -1) or -1) > 0:
        return {"total_steps": int(args.max_steps)}
    epochs = float(args.num_train_epochs)
    if rows_per_step is None or trainer.train_dataset is None:
        return {"epochs": epochs}
    batches = math.ceil(len(trainer.train_dataset) / int(args.per_device_train_batch_size))
    return {"total_steps": max(1, math.ceil(epochs * batches / int(args.gradient_accumulation_steps)))}


def _unfinished(fn: str, name: str, plan: Plan, max_seconds: float | None) -> str:
    """The sentence a search that found no ``name`` raises, with the plan's last two notes."""
    cut = f" within max_seconds={max_seconds:g}" if max_seconds is not None else ""
    notes = "; ".join(plan.notes[-2:]) or "no phase reached it"
    return f"{fn} found no {name}{cut} ({notes}); give it more time or check the rows"
