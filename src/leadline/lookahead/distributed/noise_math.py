"""The noise scale from an all-reduce, as pure math: per-rank scalars in, estimator draws out.

Under DDP each rank r holds, for one optimizer step s, the gradient g_r of the mean loss
over its own t_r scored tokens (the small batch), and after the all-reduce every rank holds
the world's token-weighted mean m_s = Σ t_r g_r / T_s, T_s = Σ t_r (the big batch; DDP gives
exactly this when rank r's loss is scaled by W t_r / T_s before ``backward()`` — what Hugging
Face ``Trainer`` does with ``average_tokens_across_devices``). That is McCandlish et al.'s
(2018, Appendix A.1) two-batch setting, with unequal batches.

:mod:`leadline.lookahead.noise.estimator` takes draws one micro-batch at a time against the running
token-weighted mean M of everything drawn before (Welford). With M_p that mean before step s
(T_p tokens), each rank computes locally, with no extra pass, from its bucket before the
all-reduce:

    r_r = |g_r - M_p|²,    x_r = (g_r - M_p)·M_p,

and from the all-reduced bucket D = m_s - M_p and dd = |D|². Three scalars per rank are then
all-gathered. With these, for W = 2 ranks every draw is exact — the same
:class:`~leadline.lookahead.noise.estimator.Draw` the single-process probe would record for micro-batch
2s (rank 0) and 2s + 1 (rank 1) — because the one product the ranks cannot compute locally
follows from the all-reduced norm:

    d_0·d_1 = (T_s² dd - t_0² r_0 - t_1² r_1) / (2 t_0 t_1),     d_r = g_r - M_p.

With w = t_0 / (T_p + t_0) and M' = M_p + w d_0 (the mean after rank 0's draw):

    draw 0:  innovation_sq = r_0,  cross = x_0,  mean_sq = |M_p|² + 2 w x_0 + w² r_0
    draw 1:  innovation_sq = |d_1 - w d_0|² = r_1 - 2 w d_0·d_1 + w² r_0
             cross = (d_1 - w d_0)·M' = x_1 + w d_0·d_1 - w x_0 - w² r_0
             mean_sq = |M_new|²

and for any W, with a = T_s / (T_p + T_s) and D·M_p = Σ t_r x_r / T_s:

    |M_new|² = |M_p|² + 2 a D·M_p + a² dd.

With W > 2 the pairwise products d_i·d_j are not in one all-reduce (W(W-1)/2 unknowns, one
equation), so the draw is the world's step mean itself: tokens T_s, innovation_sq = dd,
cross = D·M_p — the same estimator on micro-batches W times larger (exact, coarser: fewer
draws per token). Everything is written against M_p, so the squared norms that meet are of
innovation size, not |M|², and do not cancel.

References:
    McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch Training",
    arXiv:1812.06162 (2018), §2.2 and Appendix A.1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from leadline.errors import InputError
from leadline.lookahead.noise.estimator import Draw


def _check(name: str, xs: Sequence[float], n: int) -> list[float]:
    vals = [float(x) for x in xs]
    if len(vals) != n or not all(math.isfinite(v) for v in vals):
        raise InputError(f"world_draws({name}=...) needs {n} finite numbers, one per rank, got {list(xs)!r}")
    return vals


def mean_sq_after(prev_tokens: float, prev_sq: float, step_tokens: float, dd: float, d_dot_prev: float) -> float:
    """|M_new|² = |M_p|² + 2 a D·M_p + a² |D|², a = T_s / (T_p + T_s) (Welford's update).

    Args:
        prev_tokens, prev_sq: T_p and |M_p|².
        step_tokens: T_s, the step's scored tokens.
        dd, d_dot_prev: |D|² and D·M_p, D = m_s - M_p.

    Examples:
        At the first step (T_p = 0) the new mean is the step's: a = 1, |M_new|² = |D|².

        >>> mean_sq_after(0, 0, 4, 0.5, 0)
        0.5

        M_p = (1, 0) over 4 tokens, a step of 4 tokens with mean (1, 1): D = (0, 1), a = 1/2,
        M_new = (1, 0.5), |M_new|² = 1 + 0 + 0.25.

        >>> mean_sq_after(4, 1.0, 4, 1.0, 0.0)
        1.25
    """
    a = step_tokens / (prev_tokens + step_tokens)
    return prev_sq + 2.0 * a * d_dot_prev + a * a * dd


def world_draws(prev_tokens: float, prev_sq: float, tokens: Sequence[float], innovation_sq: Sequence[float],
                cross: Sequence[float], dd: float, *, per_rank: bool | None = None) -> list[Draw]:
    """The estimator's draws for one all-reduced step (see the module for the formulas).

    Args:
        prev_tokens: T_p, the scored tokens drawn before this step (0 at the first).
        prev_sq: |M_p|², the squared norm of their token-weighted mean (0 at the first).
        tokens: t_r per rank (> 0).
        innovation_sq: r_r = |g_r - M_p|² per rank.
        cross: x_r = (g_r - M_p)·M_p per rank (0 at the first step).
        dd: |m_s - M_p|², m_s the all-reduced token-weighted mean.
        per_rank: one draw per rank (exact only for 1 or 2 ranks; the default there) or one
            draw for the world's step mean (the default for more ranks).

    Returns:
        The :class:`~leadline.lookahead.noise.estimator.Draw` records, in rank order.

    Examples:
        Two ranks, first step (M_p = 0): g_0 = (1, 0) over 2 tokens, g_1 = (0, 1) over 2:
        m = (0.5, 0.5), dd = 0.5; the second draw's innovation is |g_1 - g_0|² = 2.

        >>> [round(d.innovation_sq, 9) for d in world_draws(0, 0, [2, 2], [1, 1], [0, 0], 0.5)]
        [1.0, 2.0]

        Three ranks, first step: one draw, the world's step mean over all 4 tokens.

        >>> world_draws(0, 0, [1, 1, 2], [1.0, 2.0, 0.5], [0, 0, 0], 0.25)
        [Draw(tokens=4.0, innovation_sq=0.25, mean_sq=0.25, cross=0.0)]
        >>> world_draws(0, 0, [1, 1, 2], [1.0, 2.0, 0.5], [0, 0, 0], 0.25, per_rank=True)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: world_draws(per_rank=True) is exact for 1 or 2 ranks only, got 3: ...
    """
    w_n = len(tokens)
    if w_n < 1:
        raise InputError("world_draws needs the tokens of at least one rank")
    t = _check("tokens", tokens, w_n)
    r = _check("innovation_sq", innovation_sq, w_n)
    x = _check("cross", cross, w_n)
    if not all(v > 0 for v in t):
        raise InputError(f"world_draws(tokens={list(tokens)!r}): every rank must score at least one token")
    if not (prev_tokens >= 0 and math.isfinite(prev_tokens) and math.isfinite(prev_sq) and math.isfinite(dd)):
        raise InputError(f"world_draws needs finite prev_tokens >= 0, prev_sq and dd, got {prev_tokens!r}, "
                         f"{prev_sq!r}, {dd!r}")
    if per_rank is None:
        per_rank = w_n <= 2
    if per_rank and w_n > 2:
        raise InputError(f"world_draws(per_rank=True) is exact for 1 or 2 ranks only, got {w_n}: the pairwise products "
                         "are not in one all-reduce")
    ts = math.fsum(t)
    d_dot_prev = math.fsum(ti * xi for ti, xi in zip(t, x)) / ts
    final_sq = mean_sq_after(prev_tokens, prev_sq, ts, dd, d_dot_prev)
    if not per_rank or w_n == 1:
        return [Draw(tokens=ts, innovation_sq=dd, mean_sq=final_sq, cross=d_dot_prev)]
    (t0, t1), (r0, r1), (x0, x1) = t, r, x
    d01 = (ts * ts * dd - t0 * t0 * r0 - t1 * t1 * r1) / (2.0 * t0 * t1)
    w = t0 / (prev_tokens + t0)
    first = Draw(tokens=t0, innovation_sq=r0, mean_sq=prev_sq + 2.0 * w * x0 + w * w * r0, cross=x0)
    second = Draw(
        tokens=t1,
        innovation_sq=max(0.0, r1 - 2.0 * w * d01 + w * w * r0),
        mean_sq=final_sq,
        cross=x1 + w * d01 - w * x0 - w * w * r0,
    )
    return [first, second]
