"""Warmup from alpha1, the linear ending, weight decay 0 — pure functions and their Values.

- Warmup: kept only where it measured better on this run. The warmup from alpha1 (the first
  safe step) to the rate over 1/(1 - beta1) steps (Adam's first-moment horizon, Kingma & Ba
  2015) is raced against the same rate from step 0 where the look-ahead reads at the run's
  length (:func:`warmup_race`), and kept when its held-out loss is lower by a one-sided paired t
  test. A shorter horizon does not decide it: there the warmup can read ahead and still lose at
  the run's length (docs/rate.md). Where it was not raced, 0, resting on the paired runs measured
  elsewhere (:data:`WARMUP_MEASURED`); where the rate is at or below alpha1 there is nothing to
  warm.
- Ending: the rate falls linearly to zero over the last half or the last 2h steps
  (LookaheadSchedule races both against the constant ending and keeps the best by a test).
- Weight decay: 0, by a measured argument (docs/rate.md): a decay that acts within the run
  pulls fine-tuned weights toward zero, and one that does not act is 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from leadline.errors import InputError
from leadline.plan import Value

WARMUP_MEASURED = {
    "measurements": "docs/rate.md, Warmup and weight decay",
    "full_finetune_90_steps_warmup_minus_constant_ce": [0.0174, 0.0156, 0.0254, 0.0211, 0.0184],
    "full_finetune_paired_runs_lost": "5 of 5", "full_finetune_rate_over_alpha1": 1.62,
    "seed_256_steps_warmup_minus_constant_ce": -0.0001, "seed_lora_r32_warmup_minus_constant_ce": -0.0001,
    "decide_again": ("PYTHONPATH=src python3 benchmarks/warmup_cost.py --model M --data-dir D --judge 256 "
                     "--arms constant,warmup --order-seed 1 --out OUT"),
}
"""What a warmup of 0 rests on where the run did not race it: every paired measurement of the
warmup from alpha1 against the same rate run constant (docs/rate.md), and the command that
measures it again."""

def warmup_steps_for(beta1: float) -> int:
    """round(1 / (1 - beta1)) steps, at least 1: Adam's first-moment horizon (Kingma & Ba 2015).

    Examples:
        >>> warmup_steps_for(0.9), warmup_steps_for(0.95), warmup_steps_for(0.0)
        (10, 20, 1)
        >>> warmup_steps_for(1.0)
        Traceback (most recent call last):
            ...
        leadline.errors.InputError: beta1 must be in [0, 1), got 1.0
    """
    if not 0.0 <= beta1 < 1.0:
        raise InputError(f"beta1 must be in [0, 1), got {beta1}")
    return max(1, round(1.0 / (1.0 - beta1)))


def warmup_lr(step: int, rate: float, alpha1: float | None, warmup_steps: int) -> float:
    """The rate at ``step`` (0-based) of a warmup from alpha1 to ``rate``.

    lr(t) = a + (rate - a) * t / w for t < w, then ``rate``, with a = min(alpha1, rate): the
    first step is taken at alpha1, step w at the rate. No alpha1 or no warmup: ``rate``.

    Examples:
        >>> [warmup_lr(t, 1e-3, 1e-4, 10) for t in (0, 5, 10, 20)]
        [0.0001, 0.00055, 0.001, 0.001]
        >>> warmup_lr(0, 1e-3, None, 10)
        0.001
    """
    if alpha1 is None or warmup_steps <= 0 or step >= warmup_steps:
        return rate
    start = min(alpha1, rate)
    return start + (rate - start) * max(step, 0) / warmup_steps


def linear_decay_lr(step: int, start_step: int, end_step: int, lr: float) -> float:
    """lr * (end - t) / (end - start) for start <= t < end: ``lr`` at the start, 0 at ``end``
    (clamped to [0, lr] outside).

    Examples:
        >>> [linear_decay_lr(t, 50, 100, 1e-3) for t in (50, 75, 99, 100)]
        [0.001, 0.0005, 2e-05, 0.0]
        >>> linear_decay_lr(0, 50, 50, 1e-3)
        Traceback (most recent call last):
            ...
        leadline.errors.InputError: a decay needs end_step > start_step, got 50..50
    """
    if end_step <= start_step:
        raise InputError(f"a decay needs end_step > start_step, got {start_step}..{end_step}")
    frac = (end_step - step) / (end_step - start_step)
    return lr * min(1.0, max(0.0, frac))


def within_half_grid_step(a: float, b: float) -> bool:
    """True when ``a`` and ``b`` are within a factor sqrt(2) of each other (half a step of the
    look-ahead's grid alpha1 x 2^j).

    Examples:
        >>> within_half_grid_step(1e-3, 1.4e-3), within_half_grid_step(1e-3, 1.5e-3)
        (True, False)
    """
    return a > 0 and b > 0 and abs(math.log2(a / b)) <= 0.5 + 1e-9


def warmup_race(warmup: Sequence[float], constant: Sequence[float], *, rate: float, warmup_steps: int,
                total_steps: int, alpha: float = 0.05) -> dict[str, Any]:
    """The verdict of the warmup raced against none at the run's length, on the same held-out rows.

    ``warmup`` and ``constant`` are the per-row held-out losses after ``total_steps`` steps at
    ``rate`` with and without the warmup from alpha1 over ``warmup_steps``. The warmup is kept
    (``"kept": "warmup"``) only when its losses are lower by a one-sided paired t test at
    ``alpha`` (one look); otherwise ``"none"``: the null is the run without it.

    Examples:
        >>> r = warmup_race([1.0, 2.0, 3.0, 4.0], [1.1, 2.1, 3.1, 4.2], rate=1e-3, warmup_steps=10, total_steps=40)
        >>> r["kept"], r["raced"]
        ('warmup', True)
        >>> warmup_race([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], rate=1e-3, warmup_steps=10, total_steps=40)["kept"]
        'none'
    """
    from leadline import stats
    from leadline.rate.compare import compare

    verdict = compare(warmup, constant, alpha=alpha)
    w_mean, w_se = stats.mean_se(list(warmup)) if all(map(math.isfinite, warmup)) else (math.inf, math.inf)
    c_mean, c_se = stats.mean_se(list(constant)) if all(map(math.isfinite, constant)) else (math.inf, math.inf)
    return {"raced": True, "kept": "warmup" if verdict.better and math.isfinite(w_mean) else "none",
            "rate": rate, "warmup_steps": warmup_steps, "total_steps": total_steps, "alpha": alpha,
            "warmup": {"loss": w_mean, "se": w_se}, "constant": {"loss": c_mean, "se": c_se},
            "warmup_versus_constant": verdict.as_dict()}


def _not_raced_source(b1: float, to: str, race: Mapping[str, Any] | None) -> str:
    why = (f"not raced on this run ({race['why']})" if race and race.get("why")
           else "not raced on this run")
    return (f"none: {why}; by the paired runs measured elsewhere a warmup from alpha1 over round(1/(1 - beta1)) = "
            f"{warmup_steps_for(b1)} steps lost to the same rate run constant in every one at the run's length "
            "(a 90-step full fine-tune on the card: +0.016 to +0.025 held-out CE, 5 of 5) and never measured better "
            f"(a 256-step run: -0.0001; a LoRA r32 run: -0.0001 ± 0.0003; docs/rate.md): the run starts at "
            f"{to}")


def warmup_values(alpha1: float | None = None, lr: float | None = None, betas: Sequence[float] | None = None, *,
                  beta1: float | None = None, race: Mapping[str, Any] | None = None) -> dict[str, Value]:
    """The plan's ``warmup_steps`` and ``weight_decay`` as Values with their sources.

    Args:
        alpha1: the warmup's start (the first safe step).
        lr: the rate the warmup rises to (for the source sentence).
        betas: the optimizer's betas (beta1 is read from it), or ``beta1`` directly; 0.9 when
            neither is given (Adam's default).
        race: :func:`warmup_race`'s verdict on this run (``"raced": True``), or
            ``{"raced": False, "why": ...}`` saying why it was not raced. A raced warmup is
            ``measured``: its steps when kept, else 0; one not raced is a ``constant`` 0.

    Examples:
        A rate at or below alpha1 has nothing to warm; above it and not raced, the warmup is a
        constant 0; raced and won (:func:`warmup_race`), it is measured:

        >>> show = lambda values: {name: (v.value, v.kind) for name, v in values.items()}
        >>> show(warmup_values(1e-2, 1e-3))
        {'warmup_steps': (0, 'derived'), 'weight_decay': (0.0, 'constant')}
        >>> show(warmup_values(1e-3, 4e-3, betas=(0.9, 0.999)))
        {'warmup_steps': (0, 'constant'), 'weight_decay': (0.0, 'constant')}
        >>> won = warmup_race([1.0, 2.0, 3.0, 4.0], [1.1, 2.1, 3.1, 4.2], rate=4e-3, warmup_steps=10, total_steps=40)
        >>> show(warmup_values(1e-3, 4e-3, race=won))
        {'warmup_steps': (10, 'measured'), 'weight_decay': (0.0, 'constant')}
    """
    b1 = float(beta1) if beta1 is not None else float(betas[0]) if betas else 0.9
    if race and race.get("raced") and isinstance(lr, (int, float)) and not within_half_grid_step(race["rate"], lr):
        race = {"raced": False, "why": f"it was raced at {race['rate']:.3g}, more than half a grid step from the rate "
                                       f"{lr:.3g}", "race": dict(race)}
    to = f"the rate {lr:.3g}" if isinstance(lr, (int, float)) and math.isfinite(lr) else "the chosen rate"
    if isinstance(alpha1, (int, float)) and isinstance(lr, (int, float)) and math.isfinite(alpha1) and lr <= alpha1:
        # nothing to warm: 0, so a scheduler that warms from zero (Trainer's) does not add one
        warm = Value(0, "derived", f"none: the rate {lr:.3g} is at or below alpha1 = {alpha1:.3g}, the step measured "
                                   f"safe, so the run starts at the rate (the warmup from alpha1 would be "
                                   f"round(1/(1 - beta1)) = {warmup_steps_for(b1)} steps)",
                     evidence={"beta1": b1, "warmup_from": alpha1, "warmup_to": lr}, unit="steps")
    elif race and race.get("raced"):
        warm = _raced_warmup(race, b1, alpha1, lr, to)
    else:
        warm = Value(0, "constant", _not_raced_source(b1, to, race),
                     evidence={"beta1": b1, "warmup_from": alpha1, "warmup_to": lr, **WARMUP_MEASURED,
                               **({"race": dict(race)} if race else {})}, unit="steps")
    return {"warmup_steps": warm, "weight_decay": _no_weight_decay()}


def _raced_warmup(race: Mapping[str, Any], b1: float, alpha1: float | None, lr: float | None, to: str) -> Value:
    """``warmup_steps`` from :func:`warmup_race`'s verdict on this run: its steps when the warmup
    won, else 0, measured either way."""
    w, c = race["warmup"], race["constant"]
    read = (f"raced at the run's length ({race['total_steps']} steps, the rate {race['rate']:.3g}) against the "
            f"rate from step 0: held-out loss {w['loss']:.4g} ± {w['se']:.2g} with it, {c['loss']:.4g} ± "
            f"{c['se']:.2g} without")
    if race["kept"] == "warmup":
        return Value(int(race["warmup_steps"]), "measured",
                     f"the warmup from alpha1 over {race['warmup_steps']} steps, kept: {read}, lower by a "
                     "one-sided paired t test",
                     evidence={"beta1": b1, "warmup_from": alpha1, "warmup_to": lr, "race": race}, unit="steps")
    return Value(0, "measured", f"none, measured on this run: the warmup from alpha1 over "
                                f"{race['warmup_steps']} steps {read}, not lower by a one-sided paired t test; "
                                f"the run starts at {to}",
                 evidence={"beta1": b1, "warmup_from": alpha1, "warmup_to": lr, "race": race}, unit="steps")


def _no_weight_decay() -> Value:
    """``weight_decay``: 0, a constant."""
    return Value(
        0.0, "constant",
        "0 by argument, not measured here: a decay that acts within the run pulls fine-tuned weights toward zero "
        "(measured: 1/(lr x steps) lost +2.96 CE, 10x weaker +0.0086; docs/rate.md), one that does not act "
        "is 0",
        evidence={"measurements": "docs/rate.md, Warmup and weight decay", "decay_1_over_lr_steps_delta_ce": 2.96,
                  "decay_10x_weaker_delta_ce": 0.0086},
    )
