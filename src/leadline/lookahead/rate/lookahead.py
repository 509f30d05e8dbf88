"""The rate by running ahead: the real optimizer, the same weights, the same rows.

Candidates lr_j = alpha1 * 2^j (j over ``grid``) each run n steps from the same weights with
the caller's optimizer and ``train_step`` — warmup from alpha1 over ``warmup_steps`` steps (by
default w = 1/(1 - beta1); derive() passes 0, since its run starts at the rate), then constant —
and are read on the held-out rows. n doubles (w, 2w, 4w, ... up to the run's length T: a reading
inside a warmup is of the warmup, not of the rate) and every candidate is **continued** from its
own snapshot, not restarted. At each horizon:

1. a candidate whose held-out loss is non-finite is out (diverged); one whose loss rose
   significantly since its previous reading (a spike) is out with every higher rate (unstable);
2. every other candidate is compared with the best on the same rows (paired t,
   :func:`leadline.stats.sequential_bar` for look k of the planned horizons); the
   significantly worse are dropped, except the ``keep_above`` rates just above the best and
   the ``keep_below`` just below it (and every rate below it during the warmup, when a low
   rate has not reached itself yet). Those above are out for good; one below may come back,
   since a longer horizon favours a lower rate (measured: docs/rate.md) and a slow start is no
   verdict;
3. when the best sits at the edge of the running rates, the next rate beyond it joins (from
   the origin, caught up to the horizon; a dropped lower rate is restarted), as far as
   ``max_extend`` grid points past the grid.

At each horizon the best rate is estimated between grid points — the vertex of a parabola
through the best and its neighbours in log2(lr), clamped to half a grid step — and the trend
of that estimate against the horizon, s in lr ~ n^s, is fitted over the last ``settle``
horizons past the warmup. It stops when |s| <= ``settle_slope``, every estimate in the fit
was refined and the last horizon is at least ``min_horizon`` steps (settled), at the run's
length, or when the next horizon would pass the step budget
(``budget_fraction`` x T optimizer steps over all candidates; where the budget does not cover
every rate, the best and its two neighbours go on alone). The answer is the last
estimate; when the look-ahead stopped short of the run's length on a falling trend that had not
settled, that estimate carried to the run's length, lr * (T/n)^s, bounded to 8x either way.
A settled estimate is the answer as read (the search runs until the best rate stops depending
on n), and a rising trend is not carried: a longer horizon favours a lower rate, and a rise past
the warmup is the low rates catching up, not a trend to extrapolate. Never above a rate found
unstable or diverged.

Where the look-ahead reads at the run's length and ``race_warmup`` is given, the best rate is
run once more with the warmup from alpha1 over that many steps, and the two are raced on the
held-out rows (:func:`~leadline.lookahead.rate.warmup.warmup_race`). ``keep_branch``: the best grid rate's
candidate at the last horizon — its trained tensors, optimizer state and RNG states after its n
steps — is handed back as :attr:`Lookahead.branch`, the start a run at that rate can continue
from (its steps are the run's first n).

Why the minimum horizon: at step 0 every row agrees on the answer's format (the end token),
and a short horizon rewards the rate that learns the format fastest (measured: docs/rate.md,
"The format trap"). ``min_horizon`` defaults to max(16, T/8) steps, so the answer is read past
the format.

References: the look-ahead against a six-rate sweep (docs/rate.md); Li et al. 2018,
"Hyperband", <https://arxiv.org/abs/1603.06560>, for continued candidates; Lan & DeMets 1983,
"Discrete sequential boundaries for clinical trials", for the sequential bar.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from leadline.errors import InputError
from leadline.lookahead.rate.first_step import FirstStep
from leadline.lookahead.rate.lookahead_result import Branch, Lookahead, LookaheadStop
from leadline.lookahead.rate.lookahead_rules import (
    DEFAULT_GRID,
    _first_horizon,
    answer_at_run_length,
    beta1_of,
    default_min_horizon,
    horizon_ladder,
)
from leadline.lookahead.rate.lookahead_search import RunPieces, _branch, _horizon, _race_warmup, _Search
from leadline.lookahead.rate.warmup import warmup_steps_for

__all__ = ["DEFAULT_GRID", "Branch", "Lookahead", "LookaheadStop", "RunPieces", "answer_at_run_length", "beta1_of",
           "default_min_horizon", "horizon_ladder", "lookahead_lr"]


def _alpha1(alpha1: float | FirstStep) -> float:
    if isinstance(alpha1, FirstStep):
        if alpha1.alpha1 is None:
            raise InputError("the first-step walk found no safe step (alpha1 is None); pass a rate by hand or the "
                             "anchor (leadline.lookahead.rate.anchor_rate)")
        alpha1 = alpha1.alpha1
    if not (isinstance(alpha1, (int, float)) and math.isfinite(alpha1) and alpha1 > 0):
        raise InputError(f"alpha1 must be a positive number (measure_first_step().alpha1), got {alpha1!r}")
    return float(alpha1)


def lookahead_lr(params: Sequence[Any], opt: Any, train_step: Callable[[int], Any],
                 held_out_losses_per_row: Callable[[], Sequence[float]], alpha1: float | FirstStep, *,
                 total_steps: int, grid: Sequence[int] = DEFAULT_GRID,
                 first_horizon: int | None = None, settle: int = 3, settle_slope: float = 0.25,
                 min_horizon: int | None = None,
                 budget_fraction: float = 2.0, alpha: float = 0.05, warmup_steps: int | None = None,
                 max_extend: int = 3, keep_below: int = 2, keep_above: int = 1, place: str = "auto",
                 on_progress: Callable[[dict[str, Any]], None] | None = None, race_warmup: int | None = None,
                 keep_branch: bool = False) -> Lookahead:
    """Measure the rate by running the real optimizer ahead (see the module docstring); every
    argument: ``docs/rate.md``, "lookahead_lr's arguments".

    Returns:
        :class:`Lookahead`. Weights, optimizer state, rates, gradients and RNG states are
        bit-identical afterwards, also when ``train_step`` or the reader raises.

    Examples:
        Four weights trained from 0 toward 0.01, one held-out row each. Adam moves every entry
        by about lr a step, so the best constant rate over n steps is about 0.01 / n: the
        look-ahead reads the best rate halving with each doubled horizon (n^-1); its budget
        (2 x 16 steps over all its rates) stops it after the 8-step horizon, and it carries
        that trend to the run's 16 steps, 0.01 / 16:

        >>> import torch
        >>> w = torch.zeros(4, requires_grad=True)
        >>> opt = torch.optim.Adam([w])
        >>> train_step = lambda step: ((w - 0.01) ** 2).mean().backward()
        >>> held_out = lambda: ((w - 0.01) ** 2).tolist()
        >>> la = lookahead_lr([w], opt, train_step, held_out, 0.01, total_steps=16, warmup_steps=0)
        >>> la.lr, la.stop, la.horizon_steps
        (0.000625, 'budget', 8)
        >>> [h["best_lr"] for h in la.horizons]
        [0.01, 0.005, 0.0025, 0.00125]
        >>> w.tolist()
        [0.0, 0.0, 0.0, 0.0]

        >>> lookahead_lr([w], opt, train_step, held_out, 0.0, total_steps=16)
        Traceback (most recent call last):
            ...
        leadline.errors.InputError: alpha1 must be a positive number (measure_first_step().alpha1), got 0.0
    """
    t0 = time.perf_counter()
    a1 = _alpha1(alpha1)
    _check_args(total_steps, grid)
    beta1 = beta1_of(opt)
    w = warmup_steps_for(beta1) if warmup_steps is None else int(warmup_steps)
    budget = math.ceil(budget_fraction * total_steps)
    from leadline.lookahead.rate.measuring import check_params, no_trace, read_held_out
    from leadline.rate.state import group_ratios

    params = check_params(params, opt)
    first, short = _first_horizon(w if first_horizon is None else int(first_horizon), len(set(grid)), total_steps,
                                  budget)
    s = _Search(a1, w, budget, total_steps, horizon_ladder(first, total_steps), alpha=alpha, settle=settle,
                settle_slope=settle_slope,
                min_h=default_min_horizon(total_steps) if min_horizon is None else min(total_steps, int(min_horizon)),
                keep_above=keep_above, keep_below=keep_below, lo_j=min(grid) - max_extend,
                hi_j=max(grid) + max_extend, on_progress=on_progress)
    s.cands = {j: s.make(j) for j in sorted(set(grid))}
    with no_trace(params, opt, place=place) as origin:
        ratios = group_ratios(opt)
        base = read_held_out(held_out_losses_per_row)
        run = RunPieces(params, opt, train_step, held_out_losses_per_row, origin, ratios, len(base), place, base)
        _look_ahead(s, run)
        race = None
        if race_warmup and s.evidence:
            race = _race_warmup(s.cands.get(s.last_best), int(race_warmup), w, a1, s.stop, s.last_read, total_steps,
                                params, opt, train_step, held_out_losses_per_row, origin, ratios, run.rows, place,
                                alpha)
    return _answer(s, run.rows, race, race_warmup, keep_branch, short, first, beta1, budget_fraction, t0)


def _look_ahead(s: _Search, run: RunPieces) -> None:
    """The candidates run and read horizon by horizon until the search stops; cut by derive's
    max_seconds (checked before every step), it keeps what was read."""
    from leadline.lookahead.budget import OutOfTime

    for look, n in enumerate(s.horizons, 1):
        try:
            if _horizon(s, run, look, n):
                break
        except OutOfTime:  # derive's max_seconds, checked before every step: keep what was read
            if not s.evidence:
                raise
            s.halt("max_seconds", f"max_seconds: cut inside the {n}-step horizon, the answer read at "
                                  f"{s.last_read} steps")
            break


def _check_args(total_steps: int, grid: Sequence[int]) -> None:
    if not isinstance(total_steps, int) or total_steps < 1:
        raise InputError(f"total_steps must be the run's length in optimizer steps (>= 1), got {total_steps!r}")
    if not grid:
        raise InputError("grid is empty; pass the exponents j of alpha1 x 2^j, e.g. (-1, 0, 1, 2, 3)")


def _answer(s: _Search, rows: int, race: dict[str, Any] | None, race_warmup: int | None, keep_branch: bool,
            short: bool, first: int, beta1: float, budget_fraction: float, t0: float) -> Lookahead:
    """The answer from the last estimate: carried to the run's length where the trend says so,
    held below the lowest unstable rate; with the warmup race and the branch."""
    won = race.pop("_arm", None) if race else None
    branch = (_branch(won or s.cands.get(s.last_best), s.last_read, race_warmup if won else s.w, s.a1)
              if keep_branch else None)
    if not s.evidence:
        raise InputError(f"the step budget ({s.budget} steps = {budget_fraction} x {s.total_steps}) does not cover "
                         f"the first horizon of {len(s.cands)} rates; raise budget_fraction")
    last, lr, stopped = s.last_read, s.last_estimate, s.stopped
    if short:
        stopped += f"; the run is short for its budget: the first horizon was cut to {first} steps"
    lr, why = answer_at_run_length(lr, last, s.slope, s.total_steps, settled=s.stop == "settled", settle=s.settle)
    stopped += why
    ceiling = min((c.lr for c in s.cands.values() if c.status in ("unstable", "diverged")), default=math.inf)
    if lr >= ceiling:
        lr = ceiling / 2
        stopped += f"; held below the lowest unstable rate {ceiling:.3g}"
    return Lookahead(lr, s.a1, sorted(c.lr for c in s.cands.values()), last, s.used, s.budget, s.total_steps,
                     int(race_warmup) if won else s.w, beta1, stopped, rows, s.evidence, s.slope, s.snaps,
                     time.perf_counter() - t0, s.stop, race, branch)
