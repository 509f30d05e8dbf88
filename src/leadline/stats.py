"""The statistics every decision in leadline uses, in one place, with no dependencies.

- Student-t distribution: :func:`t_cdf`, :func:`t_quantile` (through the regularized
  incomplete beta function, Numerical Recipes 3rd ed. §6.4), the normal through the
  standard library's :class:`statistics.NormalDist`.
- :func:`mean_se`: a mean and its standard error.
- :func:`paired_difference`: the mean of paired differences (same held-out rows, two
  candidates), its standard error, t, p and a confidence interval.
- :func:`sequential_bar`: the bar a paired statistic must clear at an interim look so that
  all looks together keep the error rate (Lan & DeMets 1983 spending, O'Brien-Fleming shape,
  each look's increment spent conservatively by Bonferroni).
- :func:`mcnemar`: McNemar's test for paired accuracies on the same rows (exact binomial for
  few discordant pairs, chi-square with continuity correction otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from leadline.errors import InputError

_NORMAL = NormalDist()


# ---- the incomplete beta function and Student's t ---------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the incomplete beta (modified Lentz), NR §6.4."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) = B(x; a, b) / B(a, b).

    By its continued fraction (modified Lentz), on the side where it converges fast
    (Press et al., *Numerical Recipes*, 3rd ed., §6.4).

    Examples:
        >>> round(betainc(2, 3, 0.5), 12)  # I_x(2, 3) = 6x^2 - 8x^3 + 3x^4; at x = 1/2, 11/16
        0.6875
        >>> round(betainc(1, 1, 0.3), 12)  # the uniform's CDF
        0.3
        >>> betainc(2, 3, 1.5)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: betainc needs 0 <= x <= 1, got x=1.5
    """
    if not 0.0 <= x <= 1.0:
        raise InputError(f"betainc needs 0 <= x <= 1, got x={x}")
    if x in (0.0, 1.0):
        return x
    ln_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(ln_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom.

    P(T <= t) = 1 - I_x(df/2, 1/2) / 2 for t > 0, with x = df / (df + t^2) (:func:`betainc`);
    symmetric about 0.

    Examples:
        >>> t_cdf(0.0, 5)
        0.5
        >>> round(t_cdf(1.0, 1), 12)  # df = 1 is the Cauchy: 1/2 + atan(1)/pi
        0.75
        >>> round(t_cdf(2.015, 5), 4)  # the tables' 95% one-sided point for df = 5
        0.95
    """
    if df <= 0:
        raise InputError(f"Student's t needs df > 0, got df={df}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    x = df / (df + t * t)
    tail = 0.5 * betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, Student's t with ``df`` degrees of freedom.

    Solved by bisection on :func:`t_cdf` to 1e-12 relative, started from the normal quantile.

    Examples:
        >>> round(t_quantile(0.975, 10), 4)  # the tables' two-sided 95% point for df = 10
        2.2281
        >>> round(t_quantile(0.025, 10), 4)
        -2.2281
        >>> round(t_quantile(0.75, 1), 9)  # the Cauchy's upper quartile: tan(pi/4)
        1.0
    """
    if not 0.0 < p < 1.0:
        raise InputError(f"t_quantile needs 0 < p < 1, got p={p}")
    if df <= 0:
        raise InputError(f"Student's t needs df > 0, got df={df}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, max(1.0, _NORMAL.inv_cdf(p))
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
        if hi > 1e12:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def normal_quantile(p: float) -> float:
    """The standard normal quantile: the z with Phi(z) = p.

    Examples:
        >>> round(normal_quantile(0.975), 4)
        1.96
        >>> normal_quantile(1.0)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: normal_quantile needs 0 < p < 1, got p=1.0
    """
    if not 0.0 < p < 1.0:
        raise InputError(f"normal_quantile needs 0 < p < 1, got p={p}")
    return _NORMAL.inv_cdf(p)


def normal_cdf(z: float) -> float:
    """The standard normal CDF Phi(z).

    Examples:
        >>> normal_cdf(0.0)
        0.5
        >>> round(normal_cdf(1.96), 4)
        0.975
    """
    return _NORMAL.cdf(z)


# ---- means, paired differences ---------------------------------------------------------
def mean_se(xs: Sequence[float]) -> tuple[float, float]:
    """The mean of ``xs`` and its standard error s/sqrt(n) (n-1 in the variance); se is inf for n < 2.

    Examples:
        >>> mean_se([1, 2, 3, 4])  # s^2 = 5/3, se = sqrt(5/12)
        (2.5, 0.645...)
        >>> mean_se([5.0])
        (5.0, inf)
    """
    n = len(xs)
    if n == 0:
        raise InputError("mean_se needs at least one number")
    m = math.fsum(xs) / n
    if n < 2:
        return m, math.inf
    var = math.fsum((x - m) ** 2 for x in xs) / (n - 1)
    return m, math.sqrt(var / n)


@dataclass(frozen=True)
class PairedDifference:
    """mean(a - b) over paired rows, its standard error and its t test (df = n - 1).

    Built by :func:`paired_difference`; ``ci_low``/``ci_high`` are the two-sided ``confidence``
    interval of the mean, mean -+ t_quantile(0.5 + confidence/2, df) x se.

    Examples:
        >>> d = paired_difference([2.0, 2.1, 1.9, 2.2], [2.1, 2.3, 2.0, 2.4])
        >>> d.p_less < 0.05  # a's losses are lower on every row: one-sided, significant
        True
        >>> sorted(d.as_dict())
        ['ci_high', 'ci_low', 'confidence', 'df', 'mean', 'n', 'p_less', 'p_two_sided', 'se', 't']
    """

    mean: float
    se: float
    n: int
    t: float
    df: int
    p_two_sided: float
    p_less: float
    """P-value for the one-sided alternative mean(a - b) < 0 (a is better when lower is better)."""
    ci_low: float
    ci_high: float
    confidence: float

    def as_dict(self) -> dict[str, float]:
        """Every field by name, for the evidence and the JSON."""
        return {
            "mean": self.mean, "se": self.se, "n": self.n, "t": self.t, "df": self.df,
            "p_two_sided": self.p_two_sided, "p_less": self.p_less,
            "ci_low": self.ci_low, "ci_high": self.ci_high, "confidence": self.confidence,
        }


def paired_difference(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> PairedDifference:
    """The paired difference a - b (e.g. per-row held-out losses of two candidates).

    t = mean(d) / (sd(d)/sqrt(n)), df = n - 1; a zero-variance difference gives t = ±inf
    (or 0 when the mean is 0 too). ``p_less`` = P(T <= t), the one-sided p for mean(d) < 0.

    Examples:
        >>> d = paired_difference([2.0, 2.1, 1.9, 2.2], [2.1, 2.3, 2.0, 2.4])
        >>> round(d.mean, 3), round(d.se, 4), d.df, round(d.t, 3)  # d = -0.1, -0.2, -0.1, -0.2
        (-0.15, 0.0289, 3, -5.196)
        >>> round(d.p_less, 4), round(d.p_two_sided, 4)
        (0.0069, 0.0138)
        >>> paired_difference([1.0, 2.0], [1.0])
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: paired_difference needs the same rows for both: got 2 and 1 values
    """
    if len(a) != len(b):
        raise InputError(f"paired_difference needs the same rows for both: got {len(a)} and {len(b)} values")
    if len(a) < 2:
        raise InputError(f"paired_difference needs at least 2 paired rows, got {len(a)}")
    d = [x - y for x, y in zip(a, b)]
    m, se = mean_se(d)
    n = len(d)
    df = n - 1
    if se == 0.0:
        t = 0.0 if m == 0 else math.copysign(math.inf, m)
    else:
        t = m / se
    p_less = t_cdf(t, df)
    p_two = min(1.0, 2.0 * min(p_less, 1.0 - p_less))
    q = t_quantile(0.5 + confidence / 2.0, df)
    return PairedDifference(m, se, n, t, df, p_two, p_less, m - q * se, m + q * se, confidence)


# ---- interim looks ----------------------------------------------------------------------
def obrien_fleming_spent(fraction: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming-shaped alpha spent by information fraction t (one-sided):
    alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)).

    References:
        Lan & DeMets, "Discrete sequential boundaries for clinical trials", Biometrika 70 (1983).

    Examples:
        >>> round(obrien_fleming_spent(1.0, 0.05), 12)  # all of alpha at the end
        0.05
        >>> round(obrien_fleming_spent(0.5, 0.05), 5)  # little of it half way
        0.00557
    """
    if not 0.0 < fraction <= 1.0:
        raise InputError(f"the information fraction must be in (0, 1], got {fraction}")
    z = normal_quantile(1.0 - alpha / 2.0)
    return 2.0 - 2.0 * normal_cdf(z / math.sqrt(fraction))


def sequential_bar(look: int, max_looks: int, alpha: float = 0.05, df: float | None = None) -> float:
    """The one-sided bar a paired statistic must clear at interim look ``look`` of ``max_looks``.

    Equally spaced looks; the alpha spent between look k-1 and k under the O'Brien-Fleming
    spending function (Lan & DeMets, 1983) is tested on its own (Bonferroni across looks,
    conservative: the looks together never exceed ``alpha``). Returns a z quantile, or a
    Student-t quantile when ``df`` is given. Early looks need a large statistic; the last
    look's bar is close to the fixed-sample one.

    References:
        Lan & DeMets, "Discrete sequential boundaries for clinical trials", Biometrika 70 (1983);
        O'Brien & Fleming, "A multiple testing procedure for clinical trials", Biometrics 35 (1979).

    Examples:
        >>> [round(sequential_bar(k, 4), 3) for k in (1, 2, 3, 4)]  # z bars; 1.645 at a single look
        [3.75, 2.544, 2.096, 1.937]
        >>> round(sequential_bar(4, 4, df=20), 3)
        2.059
        >>> sequential_bar(5, 4)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: look must be in 1..max_looks=4, got 5
    """
    if not 1 <= look <= max_looks:
        raise InputError(f"look must be in 1..max_looks={max_looks}, got {look}")
    if not 0.0 < alpha < 1.0:
        raise InputError(f"alpha must be in (0, 1), got {alpha}")
    spent_now = obrien_fleming_spent(look / max_looks, alpha)
    spent_before = obrien_fleming_spent((look - 1) / max_looks, alpha) if look > 1 else 0.0
    # an early look of many spends less than a double can hold below 1 (1 - 1e-300 == 1.0): its
    # bar is read at 1e-15, about 8 standard errors
    increment = max(spent_now - spent_before, 1e-15)
    if df is None:
        return normal_quantile(1.0 - increment)
    return t_quantile(1.0 - increment, df)


# ---- McNemar ----------------------------------------------------------------------------
@dataclass(frozen=True)
class McNemar:
    """McNemar's test on paired right/wrong answers of two systems on the same rows.

    b: rows the first got right and the second wrong; c: the reverse. ``statistic`` is
    min(b, c) for the exact test, chi-square otherwise; ``method`` says which.

    Examples:
        >>> m = mcnemar([True, True, False], [False, True, True])
        >>> m.b, m.c, m.method, m.as_dict()["p_value"]
        (1, 1, 'exact binomial', 1.0)
    """

    b: int
    c: int
    statistic: float
    p_value: float
    method: str
    accuracy_a: float
    accuracy_b: float
    n: int

    def as_dict(self) -> dict[str, float | int | str]:
        """Every field by name, for the evidence and the JSON."""
        return {
            "b": self.b, "c": self.c, "statistic": self.statistic, "p_value": self.p_value,
            "method": self.method, "accuracy_a": self.accuracy_a, "accuracy_b": self.accuracy_b, "n": self.n,
        }


def _binom_two_sided(k: int, n: int) -> float:
    """Exact two-sided binomial p-value at p = 1/2: 2 P(X <= min(k, n-k)), capped at 1."""
    lo = min(k, n - k)
    tail = math.fsum(math.comb(n, i) for i in range(lo + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


def mcnemar(correct_a: Sequence[bool], correct_b: Sequence[bool], exact_below: int = 25) -> McNemar:
    """McNemar's test for two systems' right/wrong answers on the same rows.

    With b + c < ``exact_below`` discordant pairs the exact binomial test (p = 1/2);
    otherwise chi2 = (|b - c| - 1)^2 / (b + c) with one degree of freedom.

    References:
        McNemar, "Note on the sampling error of the difference between correlated proportions
        or percentages", Psychometrika 12 (1947); the continuity correction: Edwards,
        Psychometrika 13 (1948).

    Examples:
        >>> m = mcnemar([True] * 10 + [False] * 2, [False] * 10 + [True] * 2)
        >>> m.b, m.c, m.method, round(m.p_value, 4)  # 2 P(X <= 2), X ~ Binomial(12, 1/2)
        (10, 2, 'exact binomial', 0.0386)
        >>> m = mcnemar([True] * 30 + [False] * 10, [False] * 30 + [True] * 10)
        >>> m.method, m.statistic, round(m.p_value, 4)  # (|30 - 10| - 1)^2 / 40
        ('chi-square, continuity-corrected', 9.025, 0.0027)
    """
    if len(correct_a) != len(correct_b):
        raise InputError(f"mcnemar needs answers on the same rows: got {len(correct_a)} and {len(correct_b)}")
    n = len(correct_a)
    if n == 0:
        raise InputError("mcnemar needs at least one row")
    b = sum(1 for x, y in zip(correct_a, correct_b) if x and not y)
    c = sum(1 for x, y in zip(correct_a, correct_b) if y and not x)
    acc_a = sum(1 for x in correct_a if x) / n
    acc_b = sum(1 for y in correct_b if y) / n
    if b + c == 0:
        return McNemar(b, c, 0.0, 1.0, "no discordant rows", acc_a, acc_b, n)
    if b + c < exact_below:
        return McNemar(b, c, float(min(b, c)), _binom_two_sided(b, b + c), "exact binomial", acc_a, acc_b, n)
    chi2 = (abs(b - c) - 1.0) ** 2 / (b + c)
    p = 2.0 * (1.0 - normal_cdf(math.sqrt(chi2)))
    return McNemar(b, c, chi2, p, "chi-square, continuity-corrected", acc_a, acc_b, n)


def median(xs: Sequence[float]) -> float:
    """The median (the mean of the middle two for an even count).

    Examples:
        >>> median([3, 1, 2]), median([4, 1, 3, 2])
        (2, 2.5)
    """
    if not xs:
        raise InputError("median needs at least one number")
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
