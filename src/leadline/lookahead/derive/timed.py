"""The time budget held inside a phase: train steps and held-out reads that check, before each
one, that one more as long as the last fits in derive's max_seconds, and the estimates that stand
in for the first one from the memory phase's timings (the noise probe's draws where max_seconds
cut that phase)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from leadline.lookahead.pieces import CountedReader
from leadline.plan import Plan


class CountedSteps:
    """``train_step_of`` whose steps are counted: :attr:`steps` is how many ``train_step(t)``
    calls (the run's training steps on its rows) every step function it made has taken, and
    :attr:`seconds` their wall time.

    Examples:
        >>> of = CountedSteps(lambda mb, accum: (lambda t: float(t)))
        >>> s = of(4, 2); _ = s(0), s(1)
        >>> of.steps
        2
    """

    def __init__(self, train_step_of: Callable[[int, int], Callable[[int], Any]]) -> None:
        self.train_step_of = train_step_of
        self.steps = 0
        self.seconds = 0.0

    def __call__(self, micro_batch: int, grad_accum: int) -> Callable[[int], Any]:
        inner = self.train_step_of(micro_batch, grad_accum)

        def step(t: int) -> Any:
            self.steps += 1
            t0 = time.perf_counter()
            try:
                return inner(t)
            finally:
                self.seconds += time.perf_counter() - t0

        return step


class CountedReads:
    """The held-out reader, its reads counted (:attr:`reads`) and timed (:attr:`seconds`); it
    keeps the reader's ``rows`` where the reader says them.

    Examples:
        >>> read = CountedReads(lambda: [1.0, 2.0])
        >>> _ = read(), read()
        >>> read.reads
        2
    """

    def __init__(self, held_out: Callable[[], Sequence[float]]) -> None:
        self.held_out = held_out
        self.reads = 0
        self.seconds = 0.0
        if isinstance(held_out, CountedReader):
            self.rows = held_out.rows

    def __call__(self) -> Sequence[float]:
        self.reads += 1
        t0 = time.perf_counter()
        try:
            return self.held_out()
        finally:
            self.seconds += time.perf_counter() - t0


def timed_steps(train_step_of: Callable[[int, int], Callable[[int], Any]], ensure: Callable[[float], None],
           estimate: Callable[[int, int], float] | None = None) -> Callable[[int, int], Callable[[int], Any]]:
    """train_step_of whose steps first check that one more step, as long as the last one took,
    fits in derive's time budget: max_seconds bounds a running look-ahead. Before the first
    step, ``estimate(micro_batch, grad_accum)`` (from the memory phase's timings) stands in for
    the step not yet taken."""
    last: dict[tuple[int, int], float] = {}  # per shape: a burn-in step does not time the plan's

    def of(micro_batch: int, grad_accum: int) -> Callable[[int], Any]:
        inner, shape = train_step_of(micro_batch, grad_accum), (micro_batch, grad_accum)

        def step(t: int) -> Any:
            ensure(last[shape] if shape in last else (estimate(micro_batch, grad_accum) if estimate else 0.0))
            t0 = time.perf_counter()
            try:
                return inner(t)
            finally:
                last[shape] = time.perf_counter() - t0

        return step

    return of


def timed_reads(held_out: Callable[[], Sequence[float]], ensure: Callable[[float], None],
                estimate: Callable[[], float] | None = None) -> Callable[[], Sequence[float]]:
    """The held-out reader, checking before each read that one more read, as long as the last
    one took, fits in derive's time budget; ``estimate()`` stands in for the first read."""
    last: list[float | None] = [None]

    def read() -> Sequence[float]:
        ensure(last[0] if last[0] is not None else (estimate() if estimate else 0.0))
        t0 = time.perf_counter()
        try:
            return held_out()
        finally:
            last[0] = time.perf_counter() - t0

    return read


def _seconds_per_row(plan: Plan, fallback: float | None = None) -> float | None:
    """One row's forward+backward at the planned length, from the memory phase's t_micro; where
    that phase did not time it, ``fallback`` (the noise probe's seconds a row)."""
    t, rows = plan.get("t_micro_seconds"), plan.get("rows_fit")
    if not isinstance(t, (int, float)) or not isinstance(rows, (int, float)) or rows < 1:
        return fallback
    return float(t) / float(rows)


def step_estimate(plan: Plan, fallback: float | None = None) -> Callable[[int, int], float]:
    """The seconds a training step of micro_batch x grad_accum rows should take, from the
    memory phase's per-row forward+backward (else ``fallback``, seconds a row) and the optimizer
    update (0 when nothing was measured)."""
    def est(micro_batch: int, grad_accum: int) -> float:
        per_row, t_step = _seconds_per_row(plan, fallback), plan.get("t_step_seconds")
        upd = float(t_step) if isinstance(t_step, (int, float)) else 0.0
        return 0.0 if per_row is None else per_row * micro_batch * grad_accum + upd
    return est


def held_estimate(plan: Plan, held_out: Callable[[], Sequence[float]],
                  fallback: float | None = None) -> Callable[[], float]:
    """The seconds one held-out read should take: its rows (the reader's ``rows``) forward only,
    taken as half a forward+backward (LoRA's backward skips the frozen weights' gradients, so
    half is the cautious share), a row's forward+backward from the memory phase, else
    ``fallback``. 0 when the reader does not say its rows or nothing was timed."""
    def est() -> float:
        per_row = _seconds_per_row(plan, fallback)
        n = held_out.rows if isinstance(held_out, CountedReader) else None
        return 0.0 if per_row is None or not isinstance(n, int) else 0.5 * per_row * n
    return est
