"""The gradient noise scale, tokens per step, and the noise read inside the loop.

- :func:`measure_noise_scale` / :class:`ModelGradFn` / :class:`NoiseScale`: the probe
  (McCandlish et al., 2018, B_noise = tr(Σ)/|G|², unequal scored tokens per micro-batch).
- :func:`tokens_per_step`: B* = sqrt(B_noise × m × t_step / t_micro), the micro-batch cut to
  it, grad_accum; :func:`steps_and_tokens`: the arithmetic at batch B
  (how far more GPUs pay: :func:`leadline.lookahead.distributed.scale_out`).
- :class:`NoiseMonitor` / :class:`Controller`: the noise from an accumulating loop's own
  micro-batches.
- The estimator as pure math: :class:`Draw`, :class:`NoiseSums`, :class:`NoiseEstimate`,
  :func:`noise_scale_from_draws`, :func:`mccandlish_two_batch`.

``import leadline.lookahead.noise`` loads no torch; the drivers import it when they run.
"""

from __future__ import annotations

from leadline.lookahead.noise.estimator import (
    Draw,
    NoiseEstimate,
    NoiseSums,
    mccandlish_two_batch,
    noise_scale_from_draws,
)
from leadline.lookahead.noise.gradfn import ModelGradFn
from leadline.lookahead.noise.monitor import Controller, NoiseMonitor, Suggestion
from leadline.lookahead.noise.probe import NoiseScale, measure_noise_scale
from leadline.lookahead.noise.step import (
    StepPlan,
    steps_and_tokens,
    time_optimal_tokens,
    tokens_per_step,
)

__all__ = [
    "Controller",
    "Draw",
    "ModelGradFn",
    "NoiseEstimate",
    "NoiseMonitor",
    "NoiseScale",
    "NoiseSums",
    "StepPlan",
    "Suggestion",
    "mccandlish_two_batch",
    "measure_noise_scale",
    "noise_scale_from_draws",
    "steps_and_tokens",
    "time_optimal_tokens",
    "tokens_per_step",
]
