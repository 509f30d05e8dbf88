"""The look-ahead's rules as pure functions on numbers: the ladder of horizons, the shortest
horizon a settled answer may end on, the candidates pruned at a horizon, the trend of the best rate
over the horizons, and the answer carried to the run's length.

No torch and no candidates: the search (:mod:`leadline.lookahead.rate.lookahead_search`) feeds these its
readings. The rules themselves are stated in :mod:`leadline.lookahead.rate.lookahead`'s docstring.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from leadline.rate.compare import Verdict, compare, mean_or_inf

K = TypeVar("K")
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


def best_key(readings: Mapping[K, Sequence[float]]) -> K:
    """The candidate with the lowest mean held-out loss (non-finite ones last).

    Examples:
        >>> best_key({"lo": [1.0, 2.0], "mid": [0.9, 1.9], "hi": [float("nan"), 0.1]})
        'mid'
    """
    return min(readings, key=lambda k: mean_or_inf(readings[k]))


def prune(readings: Mapping[K, Sequence[float]], *, alpha: float, look: int,
          max_looks: int) -> tuple[K, dict[K, Verdict]]:
    """The best candidate and, for every other, its comparison with the best; those with
    ``worse`` set are out (significantly worse at this look's sequential bar).

    Examples:
        >>> readings = {"lo": [1.0, 2.0, 3.0, 4.0], "mid": [0.9, 1.9, 2.9, 3.8], "hi": [float("nan"), 1.0, 1.0, 1.0]}
        >>> best, verdicts = prune(readings, alpha=0.05, look=1, max_looks=1)
        >>> best, {k: v.worse for k, v in verdicts.items()}
        ('mid', {'lo': True, 'hi': True})
    """
    best = best_key(readings)
    return best, {k: compare(v, readings[best], alpha=alpha, look=look, max_looks=max_looks)
                  for k, v in readings.items() if k != best}


def trend_slope(horizon_steps: Sequence[int], best_lrs: Sequence[float], points: int = 3) -> float | None:
    """The least-squares slope s of log2(best rate) against log2(horizon) over the last
    ``points`` horizons (best rate ~ n^s); None with fewer points.

    Examples:
        The best rate halving with each doubled horizon is n^-1; a flat one is n^0:

        >>> trend_slope([8, 16, 32], [4e-3, 2e-3, 1e-3]), trend_slope([8, 16, 32], [1e-3] * 3)
        (-1.0, 0.0)
        >>> trend_slope([16, 32], [1e-3, 1e-3]) is None
        True
    """
    if points < 2 or len(best_lrs) < points or len(horizon_steps) < points:
        return None
    xs = [math.log2(n) for n in horizon_steps[-points:]]
    ys = [math.log2(r) for r in best_lrs[-points:]]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else None


def carry_trend(lr_last: float, horizon_last: int, slope: float, total_steps: int, max_factor: float = 8.0) -> float:
    """The rate the trend reaches at the run's length: lr * (T / n)^s with s clamped to
    [-1, 1], bounded to a factor ``max_factor`` either way of the last best rate.

    Examples:
        1e-3 at 50 steps on n^-0.5 reaches 1e-3 x (200 / 50)^-0.5 at 200; a 100x carry on
        n^-1 stops at 8x; nothing is carried backwards:

        >>> carry_trend(1e-3, 50, -0.5, 200), carry_trend(1e-3, 10, -1.0, 1000), carry_trend(1e-3, 200, -0.5, 100)
        (0.0005, 0.000125, 0.001)
    """
    if total_steps <= horizon_last:
        return lr_last
    factor = (total_steps / horizon_last) ** min(1.0, max(-1.0, slope))
    return lr_last * min(max_factor, max(1.0 / max_factor, factor))


def parabola_log2(lrs: Sequence[float], means: Sequence[float]) -> float | None:
    """The vertex of the parabola through three (log2 lr, mean loss) points, clamped to half
    a grid step around the middle one; None when the three do not bend upward.

    Examples:
        A symmetric bend sits on the middle rate; a lopsided one leans toward the lower side;
        a falling line has no vertex:

        >>> parabola_log2([1e-3, 2e-3, 4e-3], [2.0, 1.0, 2.0])
        0.0020...
        >>> round(parabola_log2([1e-3, 2e-3, 4e-3], [1.5, 1.0, 2.0]), 6)
        0.001782
        >>> parabola_log2([1e-3, 2e-3, 4e-3], [3.0, 2.0, 1.0]) is None
        True
    """
    if len(lrs) != 3 or not all(math.isfinite(m) for m in means):
        return None
    (x0, x1, x2), (y0, y1, y2) = [math.log2(r) for r in lrs], means
    denom = (x0 - x1) * (x0 - x2) * (x1 - x2)
    if denom == 0:
        return None
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / denom
    b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / denom
    if a <= 0:
        return None
    vertex = -b / (2 * a)
    half = 0.5 * min(x1 - x0, x2 - x1)
    return 2.0 ** min(x1 + half, max(x1 - half, vertex))
