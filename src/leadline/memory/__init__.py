"""Memory: the spill cap and its watch, the fit pre-flight, the training step they measure.

- :class:`TrainingStep` — one real training step at a shape (optimizer state and gradient
  buffers in the peak, learning rate 0, the optimizer handed back fresh), timed; a
  :class:`Rung` is one such step measured (:mod:`leadline.memory.probe`).
- :func:`forbid_spill` / :func:`lift_cap` / :class:`SpillWatch` / :func:`watched` — the cap
  at free + held, moved before every outermost forward and after every optimizer step.
- :func:`measure_fit` -> :class:`FitResult`, :func:`rank_to_fit` -> :class:`RankFit` — the
  measured pre-flight and the largest LoRA rank the memory holds.

The ramp (the micro-batch a training run fits, found with real steps) is the look-ahead effort's:
:mod:`leadline.lookahead.memory`. Importing this package loads no torch; the functions load it when they run.
"""

from __future__ import annotations

from leadline.memory.cap import (
    RoomShrank,
    SpillCap,
    SpillWatch,
    WatchReport,
    forbid_spill,
    lift_cap,
    watched,
)
from leadline.memory.fit import FitResult, estimate_step_bytes, measure_fit
from leadline.memory.probe import Rung
from leadline.memory.rank import RankFit, rank_to_fit
from leadline.memory.step import StepTiming, TrainingStep

__all__ = [
    "FitResult",
    "RankFit",
    "RoomShrank",
    "Rung",
    "SpillCap",
    "SpillWatch",
    "StepTiming",
    "TrainingStep",
    "WatchReport",
    "estimate_step_bytes",
    "forbid_spill",
    "lift_cap",
    "measure_fit",
    "rank_to_fit",
    "watched",
]
