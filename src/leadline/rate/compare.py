"""The decisions between candidates, as pure functions on per-row held-out losses.

Every choice the rate phases make between two candidates (rates, checks, endings) goes
through :func:`leadline.stats.paired_difference` on the same held-out rows, against
:func:`leadline.stats.sequential_bar` where the same comparison is looked at repeatedly
(Lan & DeMets 1983, O'Brien-Fleming-shaped spending), or a fixed one-sided t test where it
is made once. Nothing here imports torch.

References: Lan & DeMets 1983, "Discrete sequential boundaries for clinical trials",
Biometrika 70(3).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from leadline import stats

K = TypeVar("K")


@dataclass(frozen=True)
class Verdict:
    """One paired comparison: a against b, per-row losses, lower is better.

    Examples:
        >>> v = compare([1.1, 2.1, 3.1, 4.2], [1.0, 2.0, 3.0, 4.0])
        >>> v.worse, v.better, round(v.diff.t, 2)
        (True, False, 5.0)
        >>> Verdict(worse=True, better=False, bar=float("inf"), diff=None).as_dict()
        {'worse': True, 'better': False, 'bar': inf}
    """

    worse: bool
    """a is significantly worse (higher) than b at the bar."""
    better: bool
    """a is significantly better (lower) than b at the bar."""
    bar: float
    diff: stats.PairedDifference | None
    """None when either side has a non-finite loss (a diverged candidate)."""

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"worse": self.worse, "better": self.better, "bar": self.bar}
        if self.diff is not None:
            d.update(mean=self.diff.mean, se=self.diff.se, t=self.diff.t, n=self.diff.n)
        return d


def _finite(xs: Sequence[float]) -> bool:
    return all(math.isfinite(x) for x in xs)


MIN_EFFECT = 1e-3
"""A difference below this fraction of the reference's mean loss is a tie whatever its t: two
candidates a hair apart on the same rows give near-identical per-row differences, and a
paired t on those is large without the difference meaning anything."""


def compare(a: Sequence[float], b: Sequence[float], *, alpha: float = 0.05, look: int = 1, max_looks: int = 1,
            min_effect: float = MIN_EFFECT) -> Verdict:
    """Is ``a`` significantly worse / better than ``b`` on the same rows?

    t = mean(a - b) / se, df = n - 1; worse when t > bar, better when t < -bar, with
    bar = ``sequential_bar(look, max_looks, alpha, df)`` (the fixed one-sided t quantile when
    ``max_looks`` is 1), and in both cases |mean(a - b)| > ``min_effect`` x |mean(b)|.
    A non-finite side counts as worse (a) or as a's win (b).

    Examples:
        Every row 0.1 or 0.2 higher: t = 5 against the one-sided bar t(0.95, 3) = 2.353; at the
        first of four looks the sequential bar is far higher:

        >>> a, b = [1.1, 2.1, 3.1, 4.2], [1.0, 2.0, 3.0, 4.0]
        >>> compare(a, b).as_dict()
        {'worse': True, 'better': False, 'bar': 2.353..., 'mean': 0.125..., 'se': 0.025..., 't': 5.0..., 'n': 4}
        >>> v = compare(a, b, look=1, max_looks=4)
        >>> v.worse, round(v.bar, 1)
        (False, 23.1)

        A difference below 0.1% of b's mean is a tie whatever its t; a non-finite loss loses:

        >>> v = compare([1.0, 2.0, 3.0], [1.0001, 2.0001, 3.0001])
        >>> v.better, v.diff.t < -1e9
        (False, True)
        >>> compare([float("nan"), 1.0], [1.0, 1.0]).worse
        True
    """
    fa, fb = _finite(a), _finite(b)
    if not (fa and fb):
        return Verdict(worse=not fa and fb, better=fa and not fb, bar=math.inf, diff=None)
    d = stats.paired_difference(a, b)
    bar = stats.sequential_bar(min(look, max_looks), max_looks, alpha, df=d.df)
    relevant = abs(d.mean) > min_effect * abs(math.fsum(b) / len(b))
    return Verdict(worse=relevant and d.t > bar, better=relevant and d.t < -bar, bar=bar, diff=d)


def mean_or_inf(xs: Sequence[float]) -> float:
    """The mean, or +inf where any loss is not finite (a diverged candidate ranks last).

    Examples:
        >>> mean_or_inf([1.0, 2.0]), mean_or_inf([1.0, float("nan")])
        (1.5, inf)
    """
    return math.fsum(xs) / len(xs) if _finite(xs) else math.inf


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
