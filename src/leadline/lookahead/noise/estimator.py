"""The gradient noise scale as pure math: B_noise = tr(Σ)/|G|² from streamed scalars.

McCandlish, Kaplan, Amodei et al. (2018), "An Empirical Model of Large-Batch Training"
(arXiv:1812.06162), define the simple noise scale B_noise = tr(Σ)/|G|², with G the true
gradient and Σ the covariance of one example's gradient. Here an *example* is one scored
token, so B_noise is in scored tokens.

Micro-batch j scores t_j tokens (unequal: answers differ in length) and its gradient g_j is
the gradient of the mean loss over them, so E[g_j] = G, Cov(g_j) = Σ/t_j and

    E|g_j|² = |G|² + S/t_j,     S = tr(Σ).

The big batch is the token-weighted mean m_k = Σ t_j g_j / T_k, T_k = Σ t_j, with
E|m_k|² = |G|² + S/T_k. The estimates (unbiased for S and |G|²):

    S    = Σ_j t_j |g_j - m_k|² / (k - 1)          (the token-weighted scatter)
    |G|² = |m_k|² - S / T_k
    B_noise = S / |G|²

With equal t_j these are exactly McCandlish et al.'s two-batch estimators (Appendix A.1)
with B_small = t, B_big = k t (:func:`mccandlish_two_batch`); with unequal t_j, treating
every micro-batch as the mean size biases both (measured: docs/noise.md).

Streaming. Nothing here sees a gradient: each draw arrives as three scalars the driver
computes against ONE running accumulator, the token-weighted mean m_{j-1} (Welford's update,
m_j = m_{j-1} + (t_j/T_j)(g_j - m_{j-1})):

    innovation_sq = |g_j - m_{j-1}|²,   mean_sq = |m_j|²,   cross = (g_j - m_{j-1})·m_{j-1}.

The Helmert innovations e_j = (t_j T_{j-1}/T_j)|g_j - m_{j-1}|², j >= 2, each have mean S,
are uncorrelated with each other and with m_k, and sum to the scatter above (Welford's
identity), so S is their mean.

Standard error: the delta method on these pieces (stated, not a jackknife: a jackknife needs
each g_j against the final mean, i.e. every gradient kept):

    Var(S)    = var(e)/(k-1)                           (empirical: no distribution assumed)
    Var(|m|²) = 4 GᵀΣG/T + 2 tr(Σ²)/T²                 (m_k ~ N(G, Σ/T) by the CLT)
    Var(|G|²) = Var(|m|²) + Var(S)/T²,   Cov(S, |G|²) = -Var(S)/T
    Var(B)/B² = Var(S)/S² + Var(|G|²)/|G|⁴ - 2 Cov(S, |G|²)/(S |G|²)

with tr(Σ²) read as var(e)/2 (exact for Gaussian noise, larger — so a wider error — for
heavy tails) and GᵀΣG from q_j = w_j·m_j, w_j = sqrt(t_j T_{j-1}/T_j)(g_j - m_{j-1}):
E[q_j²] = GᵀΣG + tr(Σ²)/T_j. Several groups of draws (one per optimizer step in the
monitor, each at its own weights) pool the innovations into one S and weight each group's
|G|² by its tokens.

When |G|² is not above zero by one SE, B_noise is reported as a lower bound
S_low/(|G|² + SE); when S is not above zero by one SE, as an upper bound (S + SE)/|G|²_low.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from leadline import stats
from leadline.errors import InputError

_ONE_SE_LEVEL = 0.8413447460685429  # P(Z <= 1): the one-sided level of "one standard error"


@functools.lru_cache(maxsize=4096)
def _one_se(df: int) -> float:
    """Student's t at the normal's one-SE level with ``df`` degrees of freedom."""
    return stats.t_quantile(_ONE_SE_LEVEL, df)


@dataclass(frozen=True)
class Draw:
    """One micro-batch's scalars, computed against the running token-weighted mean.

    Args:
        tokens: t_j, the scored tokens of the micro-batch (> 0).
        innovation_sq: |g_j - m_{j-1}|² (for the first draw of a group, |g_1|²).
        mean_sq: |m_j|², the squared norm of the token-weighted mean after this draw.
        cross: (g_j - m_{j-1})·m_{j-1}; None to derive it from the norms
            (|m_j|² - |m_{j-1}|² - (t_j/T_j)²·innovation_sq) / (2 t_j/T_j).

    Examples:
        Two one-number gradients of one token each, g_1 = 1 and g_2 = 3 (so m_1 = 1, m_2 = 2):

        >>> first = Draw(tokens=1, innovation_sq=1.0, mean_sq=1.0)             # |1 - 0|², |1|²
        >>> second = Draw(tokens=1, innovation_sq=4.0, mean_sq=4.0, cross=2.0)  # |3 - 1|², |2|², (3 - 1)·1
        >>> noise_scale_from_draws([first, second]).s                          # S = t × var(1, 3)
        2.0
    """

    tokens: float
    innovation_sq: float
    mean_sq: float
    cross: float | None = None


@dataclass(frozen=True)
class NoiseEstimate:
    """B_noise and its parts after some draws (all in scored tokens and squared-gradient units).

    Attributes:
        b_noise_tokens: S/|G|²; under ``lower_bound``/``upper_bound`` the bound; None
            when nothing can be said yet (fewer than two draws, or neither part resolves).
        se_tokens: its standard error by the delta method (None when it has none).
        s: tr(Σ) per scored token; s_se its standard error.
        g2: |G|²; g2_se its standard error.
        tokens: the scored tokens drawn (T); draws: how many micro-batches; groups: how
            many groups (optimizer steps) they came from.
        resolved: |G|² and S are both above zero by one standard error.
        lower_bound: |G|² did not resolve, so B_noise is at least ``b_noise_tokens``.
        upper_bound: S did not resolve, so B_noise is at most ``b_noise_tokens``.
        one_se: "one standard error" for these tests: Student's t quantile at the normal's
            one-SE level (0.8413) with the innovations' n - 1 degrees of freedom, since the
            error is itself estimated from few draws (1.32 at 3 innovations, -> 1 with many).

    Examples:
        >>> est = NoiseEstimate(b_noise_tokens=100.0, se_tokens=10.0, s=2.0, s_se=0.1, g2=0.02, g2_se=0.001,
        ...                     tokens=105.0, draws=8, groups=1, resolved=True, lower_bound=False,
        ...                     upper_bound=False)
        >>> est.settled                       # 105 tokens drawn do not cover 100 + 1 × 10
        False
        >>> import dataclasses
        >>> dataclasses.replace(est, tokens=110.0).settled
        True
        >>> print(dataclasses.replace(est, b_noise_tokens=float("inf")).as_dict()["b_noise_tokens"])  # JSON: no inf
        None
    """

    b_noise_tokens: float | None
    se_tokens: float | None
    s: float | None
    s_se: float | None
    g2: float | None
    g2_se: float | None
    tokens: float
    draws: int
    groups: int
    resolved: bool
    lower_bound: bool
    upper_bound: bool
    one_se: float = 1.0

    @property
    def settled(self) -> bool:
        """Resolved, and the largest batch covers B_noise at the upper edge of its error
        (T >= B_noise + one_se × SE)."""
        return (
            self.resolved
            and self.b_noise_tokens is not None
            and self.se_tokens is not None
            and self.tokens >= self.b_noise_tokens + self.one_se * self.se_tokens
        )

    def as_dict(self) -> dict[str, Any]:
        """Every field as JSON-ready data, a non-finite number as None."""
        return {
            "b_noise_tokens": _finite(self.b_noise_tokens), "se_tokens": _finite(self.se_tokens),
            "s": _finite(self.s), "s_se": _finite(self.s_se), "g2": _finite(self.g2),
            "g2_se": _finite(self.g2_se), "tokens": self.tokens, "draws": self.draws,
            "groups": self.groups, "resolved": self.resolved, "lower_bound": self.lower_bound,
            "upper_bound": self.upper_bound, "one_se": self.one_se,
        }


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


@dataclass
class _Group:
    """The draws of one group taken at the same weights: its tokens, its last |m|², and the
    Helmert innovations e_j with the sums behind GᵀΣG."""

    tokens: float = 0.0
    draws: int = 0
    mean_sq: float = 0.0
    innovations: list[float] = field(default_factory=list)
    sum_tq2: float = 0.0  # Σ T_j q_j² over the draws j >= 2
    sum_t: float = 0.0  # Σ T_j over the same draws


@dataclass
class NoiseSums:
    """Streaming sums for the estimator: a few floats per draw, no gradient.

    ``add(draw)`` appends a draw to the current group; ``new_group()`` starts another (the
    monitor calls it at each optimizer step: the weights moved); ``drop_oldest()`` forgets the
    oldest group (a moving window). ``estimate()`` pools every group held.

    Examples:
        One-number gradients g_1 = 1 and g_2 = 3, one token each, then a draw at new weights:

        >>> sums = NoiseSums()
        >>> sums.add(Draw(tokens=1, innovation_sq=1.0, mean_sq=1.0))   # g_1 = 1: m = 1
        >>> sums.add(Draw(tokens=1, innovation_sq=4.0, mean_sq=4.0))   # g_2 = 3: m = 2
        >>> est = sums.estimate()
        >>> est.s, est.g2, round(est.b_noise_tokens, 4)   # S = var(1, 3) = 2, |G|² = 2² - S/T = 4 - 2/2
        (2.0, 3.0, 0.6667)
        >>> est.resolved, est.se_tokens                   # one innovation: no standard error yet
        (False, None)
        >>> sums.new_group()
        >>> sums.add(Draw(tokens=2, innovation_sq=9.0, mean_sq=9.0))
        >>> sums.draws, len(sums.groups), sums.tokens
        (3, 2, 4.0)
        >>> sums.drop_oldest()
        >>> sums.draws, sums.tokens
        (1, 2.0)
        >>> sums.add(Draw(tokens=0, innovation_sq=1.0, mean_sq=1.0))
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: a draw's scored tokens must be a finite number > 0, got 0; ...
    """

    groups: list[_Group] = field(default_factory=list)

    def new_group(self) -> None:
        """Start a group of draws at new weights (a new optimizer step)."""
        if not self.groups or self.groups[-1].draws:
            self.groups.append(_Group())

    def drop_oldest(self) -> None:
        """Forget the oldest group (the monitor's window moves on)."""
        if self.groups:
            self.groups.pop(0)

    def add(self, draw: Draw) -> None:
        """Add one micro-batch's scalars to the current group."""
        t = float(draw.tokens)
        if not (t > 0 and math.isfinite(t)):
            raise InputError(f"a draw's scored tokens must be a finite number > 0, got {draw.tokens!r}; skip "
                             "micro-batches that score nothing")
        r, u = float(draw.innovation_sq), float(draw.mean_sq)
        if not (math.isfinite(r) and math.isfinite(u)):
            raise InputError(f"a draw's squared norms must be finite, got innovation_sq={r!r}, mean_sq={u!r}; the "
                             "gradient has inf/NaN (check the loss and its scale)")
        if not self.groups:
            self.groups.append(_Group())
        grp = self.groups[-1]
        t_prev = grp.tokens
        t_now = t_prev + t
        if grp.draws:
            w = t / t_now
            cross = draw.cross
            if cross is None:
                cross = (u - grp.mean_sq - w * w * r) / (2.0 * w)
            grp.innovations.append(r * t * t_prev / t_now)
            q = math.sqrt(t * t_prev / t_now) * (float(cross) + w * r)
            grp.sum_tq2 += t_now * q * q
            grp.sum_t += t_now
        grp.tokens, grp.draws, grp.mean_sq = t_now, grp.draws + 1, u

    @property
    def tokens(self) -> float:
        """The scored tokens of every draw held (T)."""
        return math.fsum(g.tokens for g in self.groups)

    @property
    def draws(self) -> int:
        """How many micro-batches are held."""
        return sum(g.draws for g in self.groups)

    def estimate(self) -> NoiseEstimate:
        """B_noise, S, |G|² and their standard errors from the draws held (see the module)."""
        groups = [g for g in self.groups if g.draws]
        tokens = math.fsum(g.tokens for g in groups)
        draws, n_g = sum(g.draws for g in groups), len(groups)
        e = [x for g in groups for x in g.innovations]
        if not e:
            return NoiseEstimate(None, None, None, None, None, None, tokens, draws, n_g, False, False, False)
        s, s_se = stats.mean_se(e)
        # each group's |G|² = |m|² - S/T, weighted by its tokens
        g2 = (math.fsum(g.tokens * g.mean_sq for g in groups) - n_g * s) / tokens
        if len(e) < 2:
            return NoiseEstimate(s / g2 if g2 > 0 else None, None, s, None, g2, None, tokens, draws, n_g, False, False,
                                 False)
        var_s = s_se * s_se
        tr_sigma2 = var_s * len(e) / 2.0  # var(e)/2
        sum_t = math.fsum(g.sum_t for g in groups)
        gsg = max(0.0, (math.fsum(g.sum_tq2 for g in groups) - len(e) * tr_sigma2) / sum_t)
        var_u = (4.0 * gsg * tokens + 2.0 * tr_sigma2 * n_g) / (tokens * tokens)
        var_g2 = var_u + var_s * (n_g / tokens) ** 2
        cov = -var_s * n_g / tokens
        g2_se = math.sqrt(var_g2)
        one = _one_se(len(e) - 1)
        s_ok, g2_ok = s > one * s_se, g2 > one * g2_se
        parts = (s, s_se, g2, g2_se, tokens, draws, n_g)
        if s_ok and g2_ok:
            b = s / g2
            rel2 = var_s / s**2 + var_g2 / g2**2 - 2.0 * cov / (s * g2)
            return NoiseEstimate(b, b * math.sqrt(max(rel2, 0.0)), *parts, True, False, False, one)
        if s_ok:  # |G|² unresolved: B_noise is at least this
            return NoiseEstimate((s - one * s_se) / (max(g2, 0.0) + one * g2_se), None, *parts, False, True, False, one)
        if g2_ok:  # S unresolved: B_noise is at most this
            return NoiseEstimate((s + one * s_se) / (g2 - one * g2_se), None, *parts, False, False, True, one)
        return NoiseEstimate(None, None, *parts, False, False, False, one)


def noise_scale_from_draws(draws: Iterable[Draw] | Sequence[Sequence[Draw]]) -> NoiseEstimate:
    """The estimate from recorded draws: a flat sequence (one group) or a list of groups.

    The same as :class:`NoiseSums` fed the draws in order, with :meth:`NoiseSums.new_group`
    before each group. With equal tokens t, S = t × the gradients' sample variance and
    |G|² = |mean|² - S/T.

    Examples:
        Six one-number gradients of one token each, streamed as a driver streams them:

        >>> def stream(gradients, tokens):
        ...     m, total, draws = 0.0, 0.0, []
        ...     for g, t in zip(gradients, tokens):
        ...         d = g - m
        ...         total += t
        ...         m += t / total * d                  # Welford: m_j = m_{j-1} + (t_j/T_j)(g_j - m_{j-1})
        ...         draws.append(Draw(t, d * d, m * m))
        ...     return draws
        >>> gs = [1.0, 3.0, 2.0, 2.5, 1.5, 2.0]         # mean 2, sample variance 0.5
        >>> est = noise_scale_from_draws(stream(gs, [1] * 6))
        >>> est.s, est.g2, 2.0 ** 2 - 0.5 / 6          # S = 0.5, |G|² = 2² - S/T
        (0.5, 3.9166666666666665, 3.9166666666666665)
        >>> round(est.b_noise_tokens, 4), est.resolved
        (0.1277, True)
        >>> noise_scale_from_draws([stream(gs[:3], [1] * 3), stream(gs[3:], [1] * 3)]).groups  # two steps
        2
    """
    sums = NoiseSums()
    items = list(draws)
    if items and not isinstance(items[0], Draw):
        for grp in items:
            sums.new_group()
            for d in grp:
                sums.add(d)
    else:
        for d in items:
            sums.add(d)
    return sums.estimate()


def mccandlish_two_batch(g_small_sq: float, b_small: float, g_big_sq: float, b_big: float) -> tuple[float, float]:
    """McCandlish et al. (2018), Appendix A.1: the unbiased |G|² and S from two batch sizes.

    |G|² = (B_big |G_big|² - B_small |G_small|²)/(B_big - B_small),
    S    = (|G_small|² - |G_big|²)/(1/B_small - 1/B_big).
    Returns (|G|², S). Exact only when every small batch has B_small examples.

    Examples:
        With |G|² = 3 and S = 2, E|G_B|² = |G|² + S/B: 5 at B = 1 and 4 at B = 2.

        >>> mccandlish_two_batch(5.0, 1, 4.0, 2)
        (3.0, 2.0)
        >>> mccandlish_two_batch(5.0, 2, 4.0, 2)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: mccandlish_two_batch needs 0 < b_small < b_big, got b_small=2, b_big=2

    References:
        McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch Training",
        arXiv:1812.06162 (2018), Appendix A.1.
    """
    if not 0 < b_small < b_big:
        raise InputError(f"mccandlish_two_batch needs 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}")
    g2 = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small)
    s = (g_small_sq - g_big_sq) / (1.0 / b_small - 1.0 / b_big)
    return g2, s
