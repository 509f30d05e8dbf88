"""The rank the memory holds: the largest LoRA rank whose real training step fits.

The rank is what the memory holds: ``signal_rank`` (the rank the gradient's
signal needs) is not the rank to train at; this bisects over the ranks a caller can build and
runs each one's real step through :func:`~leadline.memory.fit.measure_fit`.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.memory.fit import _shape, measure_fit
from leadline.memory.probe import largest_passing
from leadline.memory.step import ClosableStep, device_of
from leadline.memory_readings import DeviceMemory, memory_for
from leadline.plan import Value

if TYPE_CHECKING:
    from leadline.memory.step import StepTiming


# ---- the rank the memory holds ------------------------------------------------------------
@dataclass
class RankFit:
    """The largest LoRA rank whose real step fits at ``rows`` x ``length``, and every rank tried.

    Examples:
        >>> fit = RankFit(64, 8, 2048, "cuda:0", [{"rank": 16, "verdict": "fits"}, {"rank": 128, "verdict": "oom"}])
        >>> value = fit.as_values()["lora_rank"]
        >>> value.value, value.kind
        (64, 'measured')
        >>> print(RankFit(None, 8, 2048, "cuda:0").as_values()["lora_rank"].source)
        no LoRA rank tried fits a training step of 8 rows x 2048 tokens on cuda:0
    """

    rank: int | None
    rows: int
    length: int
    device: str
    tried: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def as_values(self) -> dict[str, Value]:
        if self.rank is None:
            source = f"no LoRA rank tried fits a training step of {_shape(self.rows, self.length)} on {self.device}"
        else:
            source = (f"the largest LoRA rank whose real training step of {_shape(self.rows, self.length)} fits on "
                      f"{self.device}, by bisection over the ranks tried")
        return {"lora_rank": Value(self.rank, "measured", source, {"tried": self.tried}, self.seconds)}


def rank_to_fit(
    step_at_rank: Callable[[int], Callable[..., StepTiming]],
    rows: int,
    length: int,
    *,
    ranks: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
    memory: DeviceMemory | None = None,
    card_bytes: int | None = None,
) -> RankFit:
    """The largest rank in ``ranks`` whose real training step fits (``measure_fit`` verdict
    ``fits``), by bisection (memory grows with the rank).

    ``step_at_rank(r)`` builds the run's :class:`~leadline.memory.step.TrainingStep` at rank r
    (the adapters and a fresh optimizer); when the object it returns has ``close()``, that is
    called after the measurement (remove the adapters there).

    Examples:
        Off CUDA, on a host with 8 GB of room, a step whose peak is 1 GB plus 0.1 GB a rank:

        >>> from leadline.memory_readings import FixedMemory
        >>> from leadline.memory.step import StepTiming
        >>> host = FixedMemory(total=8 * 10**9, free=7 * 10**9, held=10**9)  # a step sets host.peak
        >>> def step_at_rank(rank):
        ...     def step(rows, length, repeats=1):
        ...         host.peak = 10**9 + rank * 10**8
        ...         return StepTiming(rows, length, 0.1, 0.01)
        ...     return step
        >>> fit = rank_to_fit(step_at_rank, 4, 128, memory=host)
        >>> fit.rank, [(t["rank"], t["verdict"]) for t in fit.tried]
        (64, [(16, 'fits'), (64, 'fits'), (128, 'over')])
    """
    if not ranks:
        raise InputError("rank_to_fit needs at least one rank to try; pass ranks=(4, 8, 16, ...)")
    t0 = time.perf_counter()
    tried: list[dict[str, Any]] = []
    device = "unknown"

    def passes(r: int) -> bool:
        nonlocal device
        step = step_at_rank(r)
        try:
            mem = memory if memory is not None else memory_for(device_of(step), card_bytes=card_bytes)
            device = mem.device
            res = measure_fit(step, rows, length, memory=mem, suggest=False)
        finally:
            if isinstance(step, ClosableStep):
                step.close()
            del step
            gc.collect()
        tried.append({"rank": r, "verdict": res.verdict, "peak_bytes": res.peak_bytes, "seconds": res.seconds})
        mem.empty_cache()
        return res.fits

    best, _ = largest_passing(ranks, passes)
    return RankFit(best, rows, length, device, tried, time.perf_counter() - t0)
