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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from leadline import stats


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
