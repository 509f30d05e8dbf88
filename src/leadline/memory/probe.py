"""One measured step at a shape, and the rules on shapes that the fit pre-flight and the ramp share.

:func:`probe` runs a training step once, reading the allocator's peak and its retries around it,
and returns a :class:`Rung` with the verdict :func:`verdict_of` gives (fits, squeezed, oom); an
out-of-memory error is a measurement, never an exception out of it. The pure rules on shapes:
:func:`confirmation_lengths` (the corpus's length mix a candidate is confirmed through),
:func:`largest_passing` (bisection over ascending candidates) and :func:`length_candidates` (the
lengths a longest-length search bisects over). The fit pre-flight (:mod:`leadline.memory.fit`)
and the ramp (:mod:`leadline.lookahead.memory.ramp`) are built on them.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from leadline.memory_readings import DeviceMemory, is_oom

if TYPE_CHECKING:
    from leadline.memory.step import StepTiming

VERDICTS = ("fits", "squeezed", "oom")


def verdict_of(oom: bool, retries: int) -> str:
    """``oom`` when the allocator refused, ``squeezed`` when it had to retry, else ``fits``.

    Examples:
        >>> verdict_of(False, 0), verdict_of(False, 2), verdict_of(True, 0)
        ('fits', 'squeezed', 'oom')
    """
    if oom:
        return "oom"
    return "squeezed" if retries > 0 else "fits"


@dataclass(frozen=True)
class Rung:
    """One measured step of the ramp (or of the fit pre-flight). Bytes and seconds.

    ``peak_bytes`` is the allocator's peak allocated bytes during the call (the host's
    resident high-water mark off CUDA), ``reserved_bytes`` its peak reserved, ``retries`` how
    often it emptied its cache and retried, ``verdict`` fits/squeezed/oom. ``phase``: search,
    confirm, mix, fit, rows, length (and scout, warmup).

    Examples:
        >>> rung = Rung(3, 512, 3_047_382_528, 3_300_000_000, 0, "fits", 0.21)
        >>> rung.phase, rung.repeats, rung.as_dict()["peak_bytes"]
        ('search', 1, 3047382528)
    """

    rows: int
    length: int
    peak_bytes: int | None
    reserved_bytes: int | None
    retries: int
    verdict: str
    seconds: float
    phase: str = "search"
    repeats: int = 1
    t_micro_seconds: float | None = None
    t_step_seconds: float | None = None
    rows_per_second: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def probe(step: Callable[..., StepTiming], memory: DeviceMemory, rows: int, length: int, repeats: int = 1,
          phase: str = "search", empty_cache_first: bool = True) -> tuple[Rung, StepTiming | None]:
    """Run ``step(rows, length, repeats)`` once, reading the peak and the allocator's retries
    around it. An OOM is caught and returned as a rung with verdict ``oom``; other errors rise.
    Returns the rung and the step's timing (None after an OOM).

    Examples:
        >>> from leadline.memory_readings import FixedMemory
        >>> Host = lambda: FixedMemory(total=8 * 10**9, free=7 * 10**9, held=10**9)  # the peak stays at what is held
        >>> from leadline.memory.step import StepTiming
        >>> def step(rows, length, repeats=1):  # 0.2 s a forward+backward
        ...     return StepTiming(rows, length, 0.2, 0.01)
        >>> rung, timing = probe(step, Host(), 4, 128)
        >>> rung.verdict, rung.peak_bytes, rung.rows_per_second
        ('fits', 1000000000, 20.0)
        >>> def refused(rows, length, repeats=1):
        ...     raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        >>> rung, timing = probe(refused, Host(), 4, 128)
        >>> rung.verdict, timing
        ('oom', None)
    """
    if empty_cache_first:
        memory.empty_cache()
    memory.synchronize()
    memory.reset_peak()
    retries0 = memory.alloc_retries()
    allocated0 = memory.allocated()
    t0 = time.perf_counter()
    timing = None
    oom = False
    try:
        timing = step(rows, length, repeats)
    except Exception as e:  # the allocator's refusal is a measurement; anything else is not
        if not is_oom(e):
            raise
        oom = True
    seconds = time.perf_counter() - t0
    peak, reserved = memory.peak_allocated(), memory.peak_reserved()
    retries = memory.alloc_retries() - retries0
    if oom:
        if memory.allocated() > allocated0:  # the refused step's frames still hold tensors in cycles
            gc.collect()
        memory.empty_cache()
    t_micro = getattr(timing, "t_micro_seconds", None)
    t_step = getattr(timing, "t_step_seconds", None)
    rps = rows / t_micro if t_micro else None
    rung = Rung(rows, length, peak, reserved, retries, verdict_of(oom, retries), seconds, phase,
                repeats, t_micro, t_step, rps)
    return rung, timing


def confirmation_lengths(length: int, lengths: Sequence[int] | None = None, mix_steps: int = 16) -> list[int]:
    """The lengths the candidate runs after its repeats at ``length``, in order, from an
    emptied cache: up to ``mix_steps // 2`` (at least one) of the corpus's ``lengths`` shorter
    than ``length``, picked at evenly spaced ranks from the shortest to the longest of them,
    longest first, each followed by ``length``: ``l1, L, l2, L, ..., ln, L`` with
    ``l1 >= l2 >= ... >= ln``; at most ``mix_steps`` steps (2 when ``mix_steps`` is 1).

    Why this order: the allocator retries on a full-length step whose cache a slightly shorter
    step laid out, which is how a run starts and how its cache is after every retry, while a
    cache that already holds a full-length layout hides that retry (measured: docs/memory.md,
    "Why the mix starts from an emptied cache with its longest length"). So the longest length
    below ``length`` goes first, straight after the emptied cache; the shorter ones follow,
    each with its own full-length step after it (a long step on a cache that short steps cut
    up). Lengths at ``length`` or over are not picked: the interleaved steps run it. Empty
    without a mix, or when no length is shorter than ``length``.

    Examples:
        >>> confirmation_lengths(512, [489, 512, 300, 100, 700], mix_steps=4)
        [489, 512, 100, 512]
        >>> confirmation_lengths(512, [489, 300, 100]), confirmation_lengths(512, None)
        ([489, 512, 300, 512, 100, 512], [])
    """
    if not lengths or mix_steps <= 0:
        return []
    short = sorted((max(1, int(n)) for n in lengths if int(n) < length), reverse=True)
    if not short:
        return []
    pairs = max(1, mix_steps // 2)
    if len(short) > pairs:
        if pairs == 1:
            short = short[:1]
        else:
            short = [short[round(i * (len(short) - 1) / (pairs - 1))] for i in range(pairs)]
    return [n for s in short for n in (s, length)]


def largest_passing(candidates: Sequence[int],
                    passes: Callable[[int], bool]) -> tuple[int | None, list[tuple[int, bool]]]:
    """The largest candidate that passes, by bisection over ascending ``candidates`` (passing is
    assumed monotone: if c passes, every smaller candidate passes). Returns it (None when none
    passes) and every ``(candidate, passed)`` tried, in order.

    Examples:
        >>> largest_passing([1, 2, 4, 8, 16, 32], lambda r: r <= 10)
        (8, [(4, True), (16, False), (8, True)])
        >>> largest_passing([1, 2], lambda r: False)
        (None, [(1, False)])
    """
    cands = sorted(set(int(c) for c in candidates))
    tried: list[tuple[int, bool]] = []
    lo, hi = -1, len(cands)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok = bool(passes(cands[mid]))
        tried.append((cands[mid], ok))
        if ok:
            lo = mid
        else:
            hi = mid
    return (cands[lo] if lo >= 0 else None), tried


def length_candidates(length: int, resolution: int | None = None) -> list[int]:
    """Lengths below ``length`` on a grid of ``resolution`` tokens (default: length // 32, at
    least 1): what the longest-length search bisects over.

    Examples:
        >>> length_candidates(10, 3), length_candidates(2048)[:3], len(length_candidates(2048))
        ([3, 6, 9], [64, 128, 192], 31)
    """
    step = max(1, resolution if resolution else length // 32)
    return [n for n in range(step, length, step)]
