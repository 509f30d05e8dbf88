"""The fit pre-flight: measure the real peak at the configured shape instead of predicting it.

:func:`measure_fit` runs the run's own training step (:class:`~leadline.memory.step.TrainingStep`)
at ``rows`` x ``length`` under the spill cap and compares what the allocator did with the room
(free + held). The gate reads allocated bytes and the allocator's retries, not reserved bytes:
reserved overshoots what must fit by a factor that is not a constant (measured: docs/memory.md).
A refusal is one sentence naming the measured peak, the room and what would fit, each
alternative measured too (the most rows at that length, the longest length at those rows; the
CLI adds gradient checkpointing and a lower LoRA rank).

A shape whose estimate (:func:`estimate_step_bytes`) is more than ``max_over`` (4) times the
room is refused before the card is touched. Off CUDA nothing caps the process, so a shape
whose estimate exceeds the room is refused unrun, and a shape of several rows is scouted at
one row first and refused when the peak extrapolated from it exceeds the room.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.memory.cap import forbid_spill
from leadline.memory.fit_result import FIT_VERDICTS, LONG_RUN_DRIFT, FitResult, _shape, fit_sentence
from leadline.memory.probe import Rung, confirmation_lengths, largest_passing, length_candidates, probe
from leadline.memory.step import ModelStep, StepTiming, device_of
from leadline.memory_readings import DeviceMemory, format_bytes, memory_for

if TYPE_CHECKING:
    import torch

__all__ = ["FIT_VERDICTS", "LONG_RUN_DRIFT", "FitResult", "estimate_step_bytes", "fit_sentence", "measure_fit"]


def measure_fit(step: Callable[..., StepTiming], rows: int, length: int, *, memory: DeviceMemory | None = None,
                card_bytes: int | None = None, estimate: Callable[[int, int], int | None] | None = None,
                suggest: bool = True, repeats: int = 2, max_over: float = 4.0, lengths: Sequence[int] | None = None,
                mix_steps: int = 16) -> FitResult:
    """Measure whether a training step of ``rows`` x ``length`` fits, and what would if not.

    Args:
        step, rows, length: the run's :class:`~leadline.memory.step.TrainingStep`, at the configured shape.
        memory: the readings (default: the step's device); card_bytes: a smaller card (off CUDA, a RAM limit).
        estimate: ``(rows, length) -> bytes`` (default for a step with a ``model``: :func:`estimate_step_bytes`):
            a shape estimated over ``max_over`` x the room (1x off CUDA) is not run.
        suggest: when it does not fit, measure the most rows at that length and the longest
            length at those rows (bisection, each candidate ``repeats`` steps in a row).
        repeats: steps in a row at the shape (>= 2: the steady state every later step sees).
        lengths, mix_steps: the corpus's row lengths. On CUDA a shape that ran its repeats then
            runs at most ``mix_steps`` steps of the ramp's confirmation
            (:func:`~leadline.memory.probe.confirmation_lengths`; why: docs/memory.md); the
            verdict is then that of the first step that retried or ran out.

    Returns:
        :class:`FitResult`; ``.sentence`` is the verdict in one sentence.

    Examples:
        Off CUDA, on a host with 8 GB of room, a step whose peak is 1 GB plus 1 MB a token:

        >>> import textwrap
        >>> from leadline.memory_readings import FixedMemory
        >>> from leadline.memory.step import StepTiming
        >>> host = FixedMemory(total=8 * 10**9, free=7 * 10**9, held=10**9)  # a step sets host.peak
        >>> def step(rows, length, repeats=1):
        ...     host.peak = 10**9 + rows * length * 10**6
        ...     return StepTiming(rows, length, 0.1, 0.01)
        >>> fit = measure_fit(step, 32, 128, memory=host)
        >>> fit.verdict, fit.peak_bytes, fit.room_bytes
        ('fits', 5096000000, 8000000000)
        >>> fit = measure_fit(step, 64, 128, memory=host)
        >>> fit.verdict, [(a["rows"], a["length"]) for a in fit.alternatives]
        ('over', [(54, 128), (64, 108)])
        >>> print(textwrap.fill(fit.sentence, 100))
        refused: a training step of 64 rows x 128 tokens would peak near 9.19 GB (extrapolated from 1 row x
        128 tokens measured at 1.13 GB and 2 rows x 128 tokens measured at 1.26 GB) against 8.00 GB of RAM
        room on cpu; what would fit: 54 rows x 128 tokens (measured 7.91 GB) or 64 rows x 108 tokens
        (measured 7.91 GB) (not measured: gradient checkpointing or a lower LoRA rank)
    """
    rows, length = _checked_shape(rows, length)
    mem = memory if memory is not None else memory_for(device_of(step), card_bytes=card_bytes)
    repeats = max(2, int(repeats))
    estimate = estimate if estimate is not None else _model_estimate(step)
    t0 = time.perf_counter()
    with forbid_spill(memory=mem) as cap:
        room = cap.watch.read("fit")["cap_bytes"] if cap.watch is not None else mem.room()
        guard = _Guard(room, max_over if mem.on_cuda else 1.0, estimate)
        result = FitResult(rows, length, mem.device, "too_large", room, max_over=max_over,
                           estimate_bytes=estimate(rows, length) if estimate is not None else None)
        if guard.allows(rows, length):
            _measure_shape(result, step, mem, guard, repeats, lengths, mix_steps)
        if not result.fits and suggest:
            _suggest(result, step, mem, guard, repeats)
    result.seconds = time.perf_counter() - t0
    return result


def _checked_shape(rows: int, length: int) -> tuple[int, int]:
    rows, length = int(rows), int(length)
    if rows < 1 or length < 1:
        raise InputError(f"measure_fit needs rows >= 1 and length >= 1, got rows={rows}, length={length}")
    return rows, length


def _model_estimate(step: Callable[..., StepTiming]) -> Callable[[int, int], int | None] | None:
    """:func:`estimate_step_bytes` bound to the step's model, for a step that exposes one."""
    if isinstance(step, ModelStep) and step.model is not None:
        model = step.model
        return lambda r, n: estimate_step_bytes(model, r, n)
    return None


def _measure_shape(result: FitResult, step: Callable[..., StepTiming], mem: DeviceMemory, guard: _Guard,
                   repeats: int, lengths: Sequence[int] | None, mix_steps: int) -> None:
    """The configured shape run (off CUDA scouted first), and on CUDA confirmed over the mix:
    ``result``'s verdict and peak."""
    rows, length = result.rows, result.length
    if not mem.on_cuda and rows > 1:
        result.rungs.extend(guard.scout(step, mem, rows, length))
    if not guard.allows(rows, length):
        result.verdict = "over"
        result.peak_bytes = int(guard.predicted(rows, length) or 0)
        return
    rung = _run(result, step, mem, rows, length, repeats, "fit")
    result.peak_bytes, result.reserved_bytes, result.retries = rung.peak_bytes, rung.reserved_bytes, rung.retries
    result.verdict = rung.verdict
    if rung.verdict == "fits" and mem.on_cuda:
        _confirm_mix(result, step, mem, rows, length, confirmation_lengths(length, lengths, mix_steps))
    if rung.verdict == "fits" and not mem.on_cuda and (rung.peak_bytes or 0) > guard.room:
        result.verdict = "over"


@dataclass
class _Guard:
    """Which shapes may run: the estimate within ``factor`` x the room, and off CUDA the line
    from the scout, ``base + per_row x rows x length / scout_length``, within it (linear in
    the length: above the truth for shorter lengths when attention grows faster)."""

    room: int
    factor: float
    estimate: Callable[[int, int], int | None] | None
    line: tuple[int, float, int] | None = None

    def predicted(self, rows: int, length: int) -> float | None:
        if self.line is None:
            return None
        base, per_row, at = self.line
        return base + per_row * rows * length / at

    def allows(self, rows: int, length: int) -> bool:
        est = self.estimate(rows, length) if self.estimate is not None else None
        if est is not None and est > self.room * self.factor:
            return False
        pred = self.predicted(rows, length)
        return pred is None or pred <= self.room

    def scout(self, step: Any, mem: DeviceMemory, rows: int, length: int) -> list[Rung]:
        """Off CUDA: one row (and two, when the shape has more) at ``length``; the line through
        the two peaks (through the resident set before and the one peak when there is one)."""
        base = mem.reserved()
        one, _ = probe(step, mem, 1, length, 1, "scout", False)
        rungs = [one]
        if one.verdict != "fits":
            self.line = (base, float(self.room), length)
            return rungs
        p1 = float(one.peak_bytes or base)
        if rows > 2:
            two, _ = probe(step, mem, 2, length, 1, "scout", False)
            rungs.append(two)
            if two.verdict == "fits":
                per_row = max(0.0, float(two.peak_bytes or p1) - p1)
                self.line = (int(p1 - per_row), per_row, length)
                return rungs
        self.line = (base, max(0.0, p1 - base), length)
        return rungs


def _confirm_mix(result: FitResult, step: Any, mem: DeviceMemory, rows: int, length: int, mix: Sequence[int]) -> None:
    """The ramp's confirmation through the length mix, from an emptied cache: the first step
    that retries or runs out sets the verdict; the peak is the highest any step reached."""
    if not mix:
        return
    mem.empty_cache()
    for n in mix:
        rung, _ = probe(step, mem, rows, n, 1, "mix", False)
        result.rungs.append(rung)
        result.peak_bytes = max(result.peak_bytes or 0, rung.peak_bytes or 0)
        result.reserved_bytes = max(result.reserved_bytes or 0, rung.reserved_bytes or 0)
        result.retries += rung.retries
        if rung.verdict != "fits":
            result.verdict = rung.verdict
            return


def _run(result: FitResult, step: Any, mem: DeviceMemory, rows: int, length: int, repeats: int, phase: str) -> Rung:
    rung, _ = probe(step, mem, rows, length, repeats, phase, True)
    result.rungs.append(rung)
    return rung


def _most_allowed(guard: _Guard, rows: int, length: int) -> int:
    """The most rows up to ``rows`` the guard allows at ``length``, by bisection (the guard's
    bound grows with the rows), so a batch of a million rows costs twenty estimates, not a million."""
    lo, hi = 0, rows
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if guard.allows(mid, length):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _suggest(result: FitResult, step: Any, mem: DeviceMemory, guard: _Guard, repeats: int) -> None:
    """The most rows at the length and the longest length at the rows, each by bisection over
    the candidates the guard allows, each candidate a real run of ``repeats`` steps."""
    rows, length, room = result.rows, result.length, result.room_bytes or 0
    result.suggested = True
    peaks: dict[tuple[int, int], int | None] = {}

    def passes(r: int, n: int, phase: str) -> bool:
        rung = _run(result, step, mem, r, n, repeats, phase)
        peaks[(r, n)] = rung.peak_bytes
        return rung.verdict == "fits" and (mem.on_cuda or (rung.peak_bytes or 0) <= room)

    if rows > 1:
        cands = list(range(1, _most_allowed(guard, rows - 1, length) + 1))
        best = largest_passing(cands, lambda r: passes(r, length, "rows"))[0] if cands else None
        if best is not None:
            result.add_alternative("rows", f"{_shape(best, length)} (measured {format_bytes(peaks[(best, length)])})",
                                   True, rows=best, length=length, peak_bytes=peaks[(best, length)])
        else:
            result.add_alternative("rows", f"not even 1 row at {length} tokens", False, rows=0, length=length)
    lens = [n for n in length_candidates(length) if guard.allows(rows, n)]
    best_len = largest_passing(lens, lambda n: passes(rows, n, "length"))[0] if lens else None
    if best_len is not None:
        result.add_alternative("length", f"{_shape(rows, best_len)} (measured {format_bytes(peaks[(rows, best_len)])})",
                               True, rows=rows, length=best_len, peak_bytes=peaks[(rows, best_len)])
    else:
        shortest = length_candidates(length)[:1] or [length]
        result.add_alternative("length", f"not {rows} rows even at {shortest[0]} tokens", False, rows=rows,
                               length=shortest[0])
    gc.collect()
    mem.empty_cache()


# ---- the estimate that guards the card ---------------------------------------------------
def estimate_step_bytes(model: torch.nn.Module, rows: int, length: int, *, optimizer_states: int = 2) -> int | None:
    """A rough estimate of a training step's peak, used only to refuse absurd shapes unrun.

    weights + gradients of the trained parameters + ``optimizer_states`` states per trained
    parameter (Adam: 2), each at the parameter's size, + activations at 34 bytes per token per
    hidden unit per layer in 16-bit (17 elements; Korthikanti et al. 2022, "Reducing
    Activation Recomputation in Large Transformer Models", without the attention-score term
    that fused attention does not store) + the logits at the model's width plus their float32
    copy and its gradient (rows x length x vocab x (element + 8) bytes). None without a
    config giving hidden_size, num_hidden_layers and vocab_size.

    Examples:
        A float32 ``Linear(4, 2)`` (10 parameters, 40 bytes) read as 1 layer of width 4 and a
        vocabulary of 8, at 2 rows x 3 tokens: 40 + 40 x 3 + 17 x 4 x 6 x 4 + 6 x 8 x 12.

        >>> import torch
        >>> from types import SimpleNamespace
        >>> model = torch.nn.Linear(4, 2)
        >>> model.config = SimpleNamespace(hidden_size=4, num_hidden_layers=1, vocab_size=8)
        >>> estimate_step_bytes(model, 2, 3), 40 + 40 * 3 + 17 * 4 * 6 * 4 + 6 * 8 * 12
        (2368, 2368)
        >>> estimate_step_bytes(torch.nn.Linear(4, 2), 2, 3) is None  # no config
        True
    """
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config()
    hidden = getattr(cfg, "hidden_size", None)
    layers = getattr(cfg, "num_hidden_layers", None)
    vocab = getattr(cfg, "vocab_size", None)
    if not (hidden and layers and vocab):
        return None
    params = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    trained = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    floats = [p.element_size() for p in params if p.is_floating_point()]
    elem = floats[0] if floats else 4
    tokens = rows * length
    activations = layers * 17 * elem * tokens * hidden
    logits = tokens * vocab * (elem + 8)
    return int(weights + trained * (1 + optimizer_states) + activations + logits)
