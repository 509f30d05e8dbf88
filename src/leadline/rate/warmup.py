"""Warmup from alpha1, the linear ending, weight decay 0 — pure functions and their Values.

- Warmup: none in the plan — the run starts at the rate. The warmup from alpha1 (the first safe
  step) to the rate over 1/(1 - beta1) steps (Adam's first-moment horizon, Kingma & Ba 2015)
  was the plan's until it lost to the same rate run constant in every paired run at the run's
  length where it was measured and never measured better (docs/rate.md); the look-ahead still
  warms its candidates (:func:`warmup_lr`), and where the rate is at or below alpha1 there was
  nothing to warm.
- Ending: the rate falls linearly to zero over the last 2h steps (LookaheadSchedule races it
  against the constant ending and keeps the better by a test).
- Weight decay: 0, by the argument the seed measured: a decay that acts within the run
  pulls fine-tuned weights toward zero, and one that does not act is 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from leadline.errors import InputError
from leadline.plan import Value

WARMUP_MEASURED = {
    "source": "benchmarks/results/warmup_cost/*.json, rate_lookahead/sweep_gsm_full.json; seed E9/E9b",
    "e8_full_90_steps_warmup_minus_constant_ce": [0.0174, 0.0156, 0.0254, 0.0211, 0.0184],
    "e8_paired_runs_lost": "5 of 5", "e8_rate_over_alpha1": 1.62,
    "seed_e9_warmup_minus_constant_ce": -0.0001, "seed_e9b_lora_warmup_minus_constant_ce": -0.0001,
    "decide_again": ("PYTHONPATH=src python3 benchmarks/warmup_cost.py --model M --data-dir D --judge 256 "
                     "--arms constant,warmup --order-seed 1 --out OUT"),
}
"""What the plan's warmup of 0 rests on: every paired measurement of the warmup from alpha1 against
the same rate run constant (docs/rate.md), and the command that measures it again."""


def warmup_steps_for(beta1: float) -> int:
    """round(1 / (1 - beta1)) steps, at least 1 (10 for Adam's default beta1 = 0.9)."""
    if not 0.0 <= beta1 < 1.0:
        raise InputError(f"beta1 must be in [0, 1), got {beta1}")
    return max(1, round(1.0 / (1.0 - beta1)))


def warmup_lr(step: int, rate: float, alpha1: float | None, warmup_steps: int) -> float:
    """The rate at ``step`` (0-based) of a warmup from alpha1 to ``rate``.

    lr(t) = a + (rate - a) * t / w for t < w, then ``rate``, with a = min(alpha1, rate): the
    first step is taken at alpha1, step w at the rate.
    """
    if alpha1 is None or warmup_steps <= 0 or step >= warmup_steps:
        return rate
    start = min(alpha1, rate)
    return start + (rate - start) * max(step, 0) / warmup_steps


def linear_decay_lr(step: int, start_step: int, end_step: int, lr: float) -> float:
    """lr * (end - t) / (end - start) for start <= t < end: ``lr`` at the start, 0 at ``end``."""
    if end_step <= start_step:
        raise InputError(f"a decay needs end_step > start_step, got {start_step}..{end_step}")
    frac = (end_step - step) / (end_step - start_step)
    return lr * min(1.0, max(0.0, frac))


def warmup_values(alpha1: float | None = None, lr: float | None = None, betas: Sequence[float] | None = None, *,
                  beta1: float | None = None) -> dict[str, Value]:
    """The plan's ``warmup_steps`` and ``weight_decay`` as Values with their sources.

    Args:
        alpha1: the warmup's start (the first safe step).
        lr: the rate the warmup rises to (for the source sentence).
        betas: the optimizer's betas (beta1 is read from it), or ``beta1`` directly; 0.9 when
            neither is given (Adam's default).
    """
    b1 = float(beta1) if beta1 is not None else float(betas[0]) if betas else 0.9
    kind, evidence = "constant", {"beta1": b1, "warmup_from": alpha1, "warmup_to": lr, **WARMUP_MEASURED}
    to = f"the rate {lr:.3g}" if isinstance(lr, (int, float)) and math.isfinite(lr) else "the chosen rate"
    source = (f"none, by measurement on other runs, not this one: the run starts at {to}. A warmup from alpha1 over "
              f"round(1/(1 - beta1)) = {warmup_steps_for(b1)} steps lost to the same rate run constant in every paired "
              "run at the run's length (E8 full fine-tune, 90 steps, on the card: +0.016 to +0.025 held-out CE, 5 of "
              "5) and never measured better (seed E9: -0.0001 at 256 steps; LoRA r32 -0.0001 ± 0.0003)")
    if isinstance(alpha1, (int, float)) and isinstance(lr, (int, float)) and math.isfinite(alpha1) and lr <= alpha1:
        # nothing to warm: 0, so a scheduler that warms from zero (Trainer's) does not add one
        kind, evidence = "derived", {"beta1": b1, "warmup_from": alpha1, "warmup_to": lr}
        source = (f"none: the rate {lr:.3g} is at or below alpha1 = {alpha1:.3g}, the step measured safe, so the run "
                  f"starts at the rate (the warmup from alpha1 would be round(1/(1 - beta1)) = {warmup_steps_for(b1)} "
                  "steps)")
    return {
        "warmup_steps": Value(0, kind, source, evidence=evidence, unit="steps"),
        "weight_decay": Value(
            0.0, "constant",
            "0 by argument, not measured here: a decay that acts within the run pulls fine-tuned weights toward zero "
            "(seed E9: 1/(lr x steps) lost +2.96 CE, 10x weaker +0.0086), one that does not act is 0",
            evidence={"source": "seed E9/E13", "decay_1_over_lr_steps_delta_ce": 2.96,
                      "decay_10x_weaker_delta_ce": 0.0086},
        ),
    }
