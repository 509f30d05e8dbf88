"""What a user passes to derive(): the rows (:class:`Corpus`), the model's pieces (:class:`Pieces`),
and each piece's contract named once as a :class:`typing.Protocol`.

- :class:`GradientSource` — ``grad_fn(i) -> (gradient, scored_tokens)`` or None when the data
  ran out (the noise phase). Optional parts, each its own protocol: :class:`CountedSource` (the
  rows a draw reads), :class:`ResizableSource`
  (draws of more rows past the format), :class:`ShardedSource` (ranks that hold shards of one
  gradient: sums all-reduced, stops agreed, whole-tensor norms), :class:`SelfMeasuringSource`
  (a source that runs the noise phase itself: DDP's all-reduce).
- :class:`~leadline.memory.step.TimedStep` — ``step_fn(rows, length, repeats=1) -> StepTiming`` on
  ``device`` (the memory phase; with the other training-step contracts in the core's
  :mod:`leadline.memory.step`); :class:`LockstepStep` the sharded model's ramp with every rank in step.
- :class:`HeldOutReader` — ``held_out_losses() -> [loss per row]`` on fixed rows;
  :class:`CountedReader` says how many rows it reads (for the time bound's first estimate).

:class:`~leadline.lookahead.noise.ModelGradFn`, :class:`~leadline.lookahead.distributed.ShardedGradFn`,
:class:`~leadline.memory.TrainingStep` and the Hugging Face task's readers satisfy them; so does a
plain function with the attributes set. Loads no torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class GradientSource(Protocol):
    """``grad_fn(i) -> (gradient, scored_tokens)``: micro-batch i's gradient of the mean loss
    over its scored tokens (a tensor or a list of tensors), or None when the data ran out."""

    def __call__(self, i: int) -> tuple[Any, int] | None: ...


@runtime_checkable
class CountedSource(Protocol):
    """A gradient source that says how many rows one draw reads."""

    rows_per_draw: int


@runtime_checkable
class ResizableSource(Protocol):
    """A gradient source that draws ``rows_per_draw`` rows at a time and can draw more: ``with_rows``
    returns the same source over draws of ``rows`` rows (a :class:`CountedSource`)."""

    rows_per_draw: int

    def with_rows(self, rows: int) -> GradientSource: ...


@runtime_checkable
class ShardedSource(Protocol):
    """A gradient source whose ranks each hold a shard of one gradient (FSDP)."""

    def reduce_sums(self, sums: Any) -> None: ...

    def agree_stop(self, stopping: bool) -> bool: ...

    def weight_norms(self, named: Iterable[tuple[str, Any]]) -> dict[str, tuple[float, int]]: ...


@runtime_checkable
class SelfMeasuringSource(Protocol):
    """A gradient source that measures the noise scale itself (DDP's all-reduce): ``measure``
    returns a :class:`~leadline.lookahead.noise.NoiseScale` whose values say where they were read."""

    def measure(self, budget_s: float | None = None) -> Any: ...


@runtime_checkable
class LockstepStep(Protocol):
    """A training step through a sharded model: the ramp with every rank in step."""

    def lockstep_memory(self, length: int, *, lengths: Sequence[int] | None = None, max_rows: int | None = None,
                        start_rows: int = 1, should_stop: Any = None) -> tuple[Any, Mapping[str, Any]]: ...


@runtime_checkable
class HeldOutReader(Protocol):
    """``held_out_losses() -> [loss per row]``: the mean loss of each fixed held-out row."""

    def __call__(self) -> Sequence[float]: ...


@runtime_checkable
class CountedReader(Protocol):
    """A held-out reader that says how many rows one read reads."""

    rows: int

    def __call__(self) -> Sequence[float]: ...


@runtime_checkable
class HasOptimizer(Protocol):
    """A training step that owns its optimizer (derive restores it with the rest)."""

    optimizer: Any


def optimizer_of(step_fn: Any) -> Any:
    """The optimizer a training step owns, None where it owns none."""
    return step_fn.optimizer if isinstance(step_fn, HasOptimizer) else None


@dataclass(frozen=True)
class Corpus:
    """The training rows derive() profiles (the corpus phase) and how the run reads them.

    Attributes:
        data: a jsonl path, or the rows in memory (any corpus format, or tokenized rows).
        tokenizer: the run's tokenizer (not needed for tokenized rows or a profile).
        seq_len / quantile: the run's length, or the quantile of row lengths it is cut at
            (:func:`~leadline.corpus.profile_corpus`); ``seq_len`` alone stands where no rows are given.
        lengths: the rows' lengths in the order the run reads them (the ramp runs through them).
        profile: a :class:`~leadline.corpus.CorpusProfile` made already for the same rows: read,
            not made again.
        held_out: the split the caller made (``plan.held_out``).

    Examples:
        >>> Corpus([{"text": "a b"}], seq_len=64).seq_len
        64
        >>> Corpus().given
        False
    """

    data: str | os.PathLike[str] | Sequence[Any] | None = None
    tokenizer: Any = None
    seq_len: int | None = None
    quantile: float | None = None
    lengths: Sequence[int] | None = None
    profile: Any = None
    held_out: Mapping[str, Any] | None = None

    @property
    def given(self) -> bool:
        """Whether there are rows (or their profile) to measure."""
        return self.data is not None or self.profile is not None


@dataclass(frozen=True)
class Pieces:
    """The model's pieces derive() measures with. Each is optional: a phase runs when the pieces
    it needs are given (the noise: ``gradients``; the memory and the step: ``step``; the first
    step and the rate: ``weights``, ``optimizer``, ``train_step_of`` and ``held_out_losses``).

    Attributes:
        step: a :class:`~leadline.memory.step.TimedStep` (e.g. :class:`~leadline.memory.TrainingStep`).
        gradients: a :class:`GradientSource` (e.g. :class:`~leadline.lookahead.noise.ModelGradFn`).
        weights: ``(name, tensor)`` of the trained tensors.
        trained_as: ``"factors"`` (LoRA/PiSSA) or ``"weights"`` (a full fine-tune, a new head).
        optimizer: the run's optimizer over the trained tensors, fresh (handed back without
            state and with its settings restored).
        train_step_of: ``train_step_of(micro_batch, grad_accum) -> train_step(step)`` doing that
            step's forward+backward.
        held_out_losses: a :class:`HeldOutReader` on fixed held-out rows.
        loss_resolution: the share of the held-out loss below which a change is rounding
            (default float32's; ``leadline.run.precision.BF16_RESOLUTION`` for a bf16 forward).
        device: the accelerator (default: the step's).
        model_info: the model's record for the plan.

    Examples:
        >>> Pieces().measures
        ()
        >>> def held_out_losses():
        ...     return [1.0, 2.0]
        >>> Pieces(weights=[("w", object())], optimizer=object(), train_step_of=lambda m, a: None,
        ...        held_out_losses=held_out_losses).measures
        ('rate',)
    """

    step: Any = None
    gradients: Any = None
    weights: Sequence[tuple[str, Any]] = ()
    trained_as: str = "factors"
    optimizer: Any = None
    train_step_of: Callable[[int, int], Callable[[int], Any]] | None = None
    held_out_losses: Callable[[], Sequence[float]] | None = None
    loss_resolution: float | None = None
    device: Any = None
    model_info: Mapping[str, Any] | None = None

    @property
    def measures(self) -> tuple[str, ...]:
        """What these pieces can measure: ``"noise"``, ``"memory"`` (with the step where the
        noise is measured too) and ``"rate"`` (alpha1 and the rate)."""
        rate = (self.optimizer is not None and self.train_step_of is not None
                and self.held_out_losses is not None and bool(self.weights))
        return tuple(name for name, given in (("noise", self.gradients is not None), ("memory", self.step is not None),
                                              ("rate", rate)) if given)
