"""Which rate the plan takes: pure decisions on the numbers the rate phases measured.

- :func:`short_run_grid`: a run too short for the default grid to reach its minimum horizon
  reads fewer rates around the anchor, from that horizon.
- :func:`cut_rate`: a look-ahead stopped before its minimum horizon gives the lower of its
  answer and the anchor.
- :func:`fallback_rate`: where no rate phase finished, alpha1 or the anchor, whichever the
  plan has and is lower.

Why a short horizon is not trusted: at step 0 every row agrees on the answer's format, and a
short horizon rewards the rate that learns the format fastest (docs/rate.md).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from leadline.lookahead.rate.lookahead import DEFAULT_GRID, LookaheadStop, default_min_horizon
from leadline.plan import Plan, Value


class LookaheadAnswer(Protocol):
    """What :func:`cut_rate` reads of a :class:`~leadline.lookahead.rate.Lookahead`: its rate, the last
    horizon read, why it stopped (the reason and its sentence) and its evidence.

    Examples:
        A :class:`~leadline.lookahead.rate.Lookahead` is one:

        >>> from leadline.lookahead.rate import Lookahead
        >>> la: LookaheadAnswer = Lookahead(4.8e-3, 1e-2, [5e-3, 1e-2], 10, 40, 74, 37, 0, 0.9,
        ...                                 "budget: horizon 20 needed 40 more steps", stop="budget")
        >>> la.lr, la.horizon_steps, la.stop, la.evidence()["stopped_because"]
        (0.0048, 10, 'budget', 'budget: horizon 20 needed 40 more steps')
    """

    lr: float
    horizon_steps: int
    stop: LookaheadStop
    stopped_because: str

    def evidence(self) -> dict[str, Any]: ...


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def short_run_grid(anchor: float | None, alpha1: float, total_steps: int) -> dict[str, Any]:
    """The grid and first horizon for a run too short for the default grid.

    A look-ahead has 2 x T steps over all its rates. When the default grid times the minimum
    horizon does not fit in them, it reads k = min(4, budget // min_horizon) rates alpha1 x 2^j
    nearest the anchor (from half of it up, never above alpha1), from the minimum horizon.

    Returns:
        ``{"grid": (j, ...), "first_horizon": n}``, or ``{}`` where the default grid reaches the
        minimum horizon, no anchor below alpha1 is known, or fewer than 2 rates fit.

    Examples:
        >>> short_run_grid(4.57e-4, 0.01, 24)
        {'grid': (-5, -4, -3), 'first_horizon': 16}
        >>> short_run_grid(4.57e-4, 0.01, 400)
        {}
    """
    min_h, budget = default_min_horizon(total_steps), 2 * total_steps
    if len(DEFAULT_GRID) * min_h <= budget or not isinstance(anchor, (int, float)) or not 0 < anchor < alpha1:
        return {}
    k = min(4, budget // min_h)
    if k < 2:
        return {}
    top = min(0, round(math.log2(anchor / alpha1)) - 1 + k - 1)  # never above alpha1
    return {"grid": tuple(range(top - k + 1, top + 1)), "first_horizon": min_h}


def cut_rate(plan: Plan, la: LookaheadAnswer, total_steps: int) -> dict[str, Value]:
    """The rate of a look-ahead that stopped before its minimum horizon.

    Cut by max_seconds, or by its step budget in a short run, the look-ahead read its answer
    where a short horizon rewards the rate that learns the answer's format fastest: the rate is
    then the lower of its answer and the anchor (``plan["lr_anchor"]``).

    Returns:
        ``{"lr": Value}`` with the anchor, or ``{}`` when the look-ahead reached its minimum
        horizon or its answer is at or below the anchor.

    Examples:
        >>> from types import SimpleNamespace
        >>> plan = Plan()
        >>> plan.set("lr_anchor", Value(4.57e-4, "constant", "rewrite / 32"))
        >>> la = SimpleNamespace(lr=4.82e-3, horizon_steps=10, stop="budget", stopped_because="budget",
        ...                      evidence=dict)
        >>> cut_rate(plan, la, 37)["lr"].value
        0.000457
        >>> cut_rate(plan, SimpleNamespace(lr=3e-4, horizon_steps=10, stop="budget", stopped_because="budget",
        ...                                evidence=dict), 37)
        {}
    """
    anchor, min_h = plan.get("lr_anchor"), default_min_horizon(total_steps)
    if la.horizon_steps >= min(min_h, total_steps):
        return {}
    if not _positive(anchor) or anchor >= la.lr:
        return {}
    why = "max_seconds cut the look-ahead" if la.stop == "max_seconds" else "its step budget stopped the look-ahead"
    a = plan["lr_anchor"]
    source = (f"the anchor, below the look-ahead's {la.lr:.3g}: {why} at {la.horizon_steps} steps, before its "
              f"{min_h}-step minimum horizon, where a short horizon rewards the rate that learns the answer's "
              f"format fastest ({la.stopped_because}): {a.source}")
    return {"lr": Value(anchor, a.kind, source, {**(a.evidence or {}), "lookahead": la.evidence()}, 0.0, a.unit)}


def fallback_rate(plan: Plan) -> Value | None:
    """The rate where no rate phase put one in the plan.

    Where the look-ahead did not finish, alpha1 (measured) is the rate, or the anchor where
    that is lower (alpha1 is the best single step, not a rate to hold); where nothing could
    run, the anchor — a constant, listed as one. None when the plan has a rate, or neither.

    Examples:
        >>> plan = Plan()
        >>> plan.set("lr_anchor", Value(1e-3, "constant", "rewrite / 32"))
        >>> fallback_rate(plan).source
        'the anchor (nothing could be run for the rate): rewrite / 32'
        >>> plan.set("alpha1", Value(4e-4, "measured", "the first step"))
        >>> fallback_rate(plan).value, fallback_rate(plan).kind
        (0.0004, 'measured')
    """
    if "lr" in plan:
        return None
    alpha1, anchor = plan.get("alpha1"), plan.get("lr_anchor")
    if _positive(alpha1):
        if _positive(anchor) and anchor < alpha1:
            a = plan["lr_anchor"]
            return Value(a.value, a.kind, f"the anchor, below alpha1 {alpha1:.3g} (the look-ahead did not finish "
                                          f"within max_seconds; alpha1 is the best single step, not a rate to hold): "
                                          f"{a.source}", a.evidence, 0.0, a.unit)
        a = plan["alpha1"]
        return Value(a.value, "measured", f"alpha1, the first safe step (the look-ahead did not finish within "
                                          f"max_seconds): {a.source}", a.evidence, 0.0, a.unit)
    if "lr_anchor" in plan:
        a = plan["lr_anchor"]
        return Value(a.value, a.kind, f"the anchor (nothing could be run for the rate): {a.source}", a.evidence,
                     0.0, a.unit)
    return None
