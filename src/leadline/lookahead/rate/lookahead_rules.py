"""The look-ahead's rules as pure functions on numbers: the ladder of horizons, the shortest
horizon a settled answer may end on, and the answer carried to the run's length.

No torch and no candidates: the search (:mod:`leadline.lookahead.rate.lookahead_search`) feeds these its
readings. The rules themselves are stated in :mod:`leadline.lookahead.rate.lookahead`'s docstring.
"""

from __future__ import annotations

import math
from typing import Any

from leadline.rate.compare import carry_trend

DEFAULT_GRID = (-1, 0, 1, 2, 3)


def beta1_of(opt: Any) -> float:
    """The optimizer's beta1 (its ``defaults["betas"][0]``); 0.9, Adam's default, where it has none.

    Examples:
        >>> from types import SimpleNamespace
        >>> beta1_of(SimpleNamespace(defaults={"betas": (0.8, 0.999)})), beta1_of(SimpleNamespace(defaults={}))
        (0.8, 0.9)
    """
    betas = opt.defaults.get("betas") if hasattr(opt, "defaults") else None
    return float(betas[0]) if betas else 0.9


def horizon_ladder(first: int, total_steps: int) -> list[int]:
    """first, 2 first, 4 first, ... below T, then T.

    Examples:
        >>> horizon_ladder(4, 20)
        [4, 8, 16, 20]
    """
    out, n = [], max(1, first)
    while n < total_steps:
        out.append(n)
        n *= 2
    return [*out, total_steps]


def default_min_horizon(total_steps: int) -> int:
    """The shortest horizon a settled answer may end on: max(16, T/8) steps, at most T (read
    past the answer's format; see :mod:`leadline.lookahead.rate.lookahead`).

    Examples:
        >>> default_min_horizon(300), default_min_horizon(10)
        (38, 10)
    """
    return min(int(total_steps), max(16, math.ceil(total_steps / 8)))


def _first_horizon(first: int, n_rates: int, total_steps: int, budget: int) -> tuple[int, bool]:
    """The first horizon, and whether the run was too short for the budget to cover the warmup at
    every rate (then the first horizon starts sooner)."""
    short = n_rates * min(first, total_steps) > budget
    if short:
        first = max(1, budget // n_rates)
    return first, short


def answer_at_run_length(estimate: float, last: int, slope: float | None, total_steps: int, *, settled: bool,
                         settle: int = 3) -> tuple[float, str]:
    """The look-ahead's answer from its last estimate (read at ``last`` steps) and the trend
    ``slope`` (s in lr ~ n^s): carried to ``total_steps`` only on a falling trend that had not
    settled. Returns (rate, the clause the stop reason gains).

    Examples:
        >>> answer_at_run_length(1e-4, 50, -0.5, 200, settled=False)
        (5e-05, '; the estimate (n^-0.50) carried from 50 to 200 steps')
        >>> answer_at_run_length(1e-4, 50, 0.3, 200, settled=False)[0]
        0.0001
    """
    if last >= total_steps:
        return estimate, ""
    if settled:
        return estimate, f"; the estimate at {last} steps kept (settled: not carried)"
    if slope is None:
        return estimate, f"; fewer than {settle} horizons for a trend, the estimate at {last} steps kept"
    if slope > 0:
        return estimate, f"; the estimate at {last} steps kept (a rising trend, n^{slope:.2f}, is not carried)"
    return carry_trend(estimate, last, slope,
                       total_steps), f"; the estimate (n^{slope:.2f}) carried from {last} to {total_steps} steps"
