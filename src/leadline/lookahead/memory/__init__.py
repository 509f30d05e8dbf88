"""The ramp: the micro-batch a training run fits, found with real training steps (derive()'s memory phase).

- :func:`ramp` -> :class:`RampResult` — the micro-batch from real steps: doubling, bisection,
  confirmation twice in a row and through the length mix; off CUDA, where rows per second
  stop improving within the RAM room. :class:`WontFit` when not even one row fits.
- :mod:`~leadline.lookahead.memory.decide` — the ramp's decisions as pure functions on numbers.

A measured step (:class:`~leadline.memory.probe.Rung`), the spill cap and the fit pre-flight are
the core's (:mod:`leadline.memory`). Importing this package loads no torch.
"""

from __future__ import annotations

from leadline.lookahead.memory.ramp import RampResult, WontFit, ramp
from leadline.memory.probe import Rung

__all__ = ["RampResult", "Rung", "WontFit", "ramp"]
