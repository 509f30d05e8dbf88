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
   since a longer horizon favours a lower rate (seed: the best constant rate fell 4x from 20
   to 200 steps) and a slow start is no verdict;
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
held-out rows (:func:`~leadline.rate.warmup.warmup_race`). ``keep_branch``: the best grid rate's
candidate at the last horizon — its trained tensors, optimizer state and RNG states after its n
steps — is handed back as :attr:`Lookahead.branch`, the start a run at that rate can continue
from (its steps are the run's first n).

Why the minimum horizon: at step 0 every row agrees on the answer's format (the end token),
and a short horizon rewards the rate that learns the format fastest: in a six-rate sweep on
SmolLM2-135M, LoRA's best rate at 2 and 4 steps was twice the winner's (docs/rate.md).
``min_horizon`` defaults to max(16, T/8) steps, so the answer is read past the format.

References: the look-ahead against a six-rate sweep (docs/rate.md); Li et al. 2018
(Hyperband) for continued candidates; Lan & DeMets 1983 for the sequential bar.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from leadline.errors import InputError
from leadline.plan import Value
from leadline.rate.compare import carry_trend, compare, parabola_log2, prune, trend_slope
from leadline.rate.first_step import FirstStep
from leadline.rate.warmup import warmup_lr, warmup_race, warmup_steps_for, warmup_values

DEFAULT_GRID = (-1, 0, 1, 2, 3)

LookaheadStop = Literal["quick", "unsettled", "budget", "diverged", "settled", "run_length", "max_seconds"]
"""Why the look-ahead stopped: no steps run (quick effort), the horizons ran out unsettled, the
step budget, every rate diverged or was unstable, the trend settled, the run's length, derive's
max_seconds. ``stopped_because`` is the sentence shown for it."""


@dataclass
class Branch:
    """A candidate's run the look-ahead handed back: ``steps`` optimizer steps at ``lr`` from the
    origin, without a warmup unless ``warmup_steps``, and its state after them (a
    :class:`~leadline.rate.state.Snapshot` of the trained tensors, the optimizer's state and the
    RNG states)."""

    lr: float
    steps: int
    snapshot: Any
    warmup_steps: int = 0
    alpha1: float | None = None


@dataclass
class Lookahead:
    """The look-ahead's answer and everything it read.

    Attributes:
        lr: the rate (``effort="quick"``: alpha1).
        rates: the grid tried (quick: the grid for :func:`race`).
        horizon_steps: the last horizon read — the schedule's check interval h.
        horizons: per horizon, every candidate's mean held-out loss, SE, status and test.
        stopped_because: the sentence saying why it stopped (displayed; ``stop`` is the reason).
        stop: why it stopped, one of :data:`LookaheadStop`.
    """

    lr: float
    alpha1: float
    rates: list[float]
    effort: str
    horizon_steps: int
    steps_used: int
    budget_steps: int
    total_steps: int
    warmup_steps: int
    beta1: float
    stopped_because: str
    held_out_rows: int = 0
    horizons: list[dict[str, Any]] = field(default_factory=list)
    trend_slope: float | None = None
    snapshots: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    stop: LookaheadStop = "unsettled"
    warmup_race: dict[str, Any] | None = None
    branch: Branch | None = field(default=None, repr=False, compare=False)

    def evidence(self) -> dict[str, Any]:
        return {"plot": "lookahead", "horizons": self.horizons, "chosen_lr": self.lr, "alpha1": self.alpha1,
                "rates": self.rates, "steps_used": self.steps_used, "budget_steps": self.budget_steps,
                "total_steps": self.total_steps, "stopped_because": self.stopped_because, "stop": self.stop,
                "trend_slope": self.trend_slope, "held_out_rows": self.held_out_rows, "snapshots": self.snapshots,
                "candidate_warmup_steps": self.warmup_steps,
                **({"warmup_race": self.warmup_race} if self.warmup_race else {})}

    def as_values(self) -> dict[str, Value]:
        """``lr``, ``lookahead_horizon_steps`` (full) or ``race_rates`` (quick), ``warmup_steps``, ``weight_decay``."""
        out: dict[str, Value] = {}
        if self.effort == "quick":
            out["lr"] = Value(self.lr, "derived",
                              f"alpha1 (quick effort: no look-ahead run); race() picks among {len(self.rates)} rates "
                              "alpha1 x 2^j inside the run", evidence=self.evidence(), unit="per step")
            out["race_rates"] = Value(self.rates, "derived", "alpha1 x 2^j for the race inside the run (quick effort)")
        else:
            out["lr"] = Value(
                self.lr, "measured",
                f"look-ahead: {len(self.rates)} rates alpha1 x 2^j run by the optimizer from the same weights on the "
                f"same rows, compared on {self.held_out_rows} held-out rows by a paired sequential test, up to "
                f"{self.horizon_steps} steps ({self.stopped_because}; {self.steps_used} steps of a "
                f"{self.budget_steps}-step budget)",
                evidence=self.evidence(), seconds=self.seconds, unit="per step")
            out["lookahead_horizon_steps"] = Value(self.horizon_steps, "measured",
                                                   "the horizon the look-ahead's answer was read at "
                                                   f"({self.stopped_because}); LookaheadSchedule checks every this "
                                                   "many steps", unit="steps")
        out.update(warmup_values(self.alpha1, self.lr, beta1=self.beta1, race=self.warmup_race))
        return out


def _alpha1(alpha1: float | FirstStep) -> float:
    if isinstance(alpha1, FirstStep):
        if alpha1.alpha1 is None:
            raise InputError("the first-step walk found no safe step (alpha1 is None); pass a rate by hand or the "
                             "anchor (leadline.rate.anchor_rate)")
        alpha1 = alpha1.alpha1
    if not (isinstance(alpha1, (int, float)) and math.isfinite(alpha1) and alpha1 > 0):
        raise InputError(f"alpha1 must be a positive number (measure_first_step().alpha1), got {alpha1!r}")
    return float(alpha1)


def beta1_of(opt: Any) -> float:
    betas = opt.defaults.get("betas") if hasattr(opt, "defaults") else None
    return float(betas[0]) if betas else 0.9


def horizon_ladder(first: int, total_steps: int) -> list[int]:
    """first, 2 first, 4 first, ... below T, then T."""
    out, n = [], max(1, first)
    while n < total_steps:
        out.append(n)
        n *= 2
    return [*out, total_steps]


def default_min_horizon(total_steps: int) -> int:
    """The shortest horizon a settled answer may end on: max(16, T/8) steps, at most T (read
    past the answer's format; see the module's docstring)."""
    return min(int(total_steps), max(16, math.ceil(total_steps / 8)))


def lookahead_lr(params: Sequence[Any], opt: Any, train_step: Callable[[int], Any],
                 held_out_losses_per_row: Callable[[], Sequence[float]], alpha1: float | FirstStep, *,
                 total_steps: int, effort: str = "full", grid: Sequence[int] = DEFAULT_GRID,
                 first_horizon: int | None = None, settle: int = 3, settle_slope: float = 0.25,
                 min_horizon: int | None = None,
                 budget_fraction: float = 2.0, alpha: float = 0.05, warmup_steps: int | None = None,
                 max_extend: int = 3, keep_below: int = 2, keep_above: int = 1, place: str = "auto",
                 on_progress: Callable[[dict[str, Any]], None] | None = None, race_warmup: int | None = None,
                 keep_branch: bool = False) -> Lookahead:
    """Measure the rate by running the real optimizer ahead (see the module docstring).

    Args:
        params, opt, train_step, held_out_losses_per_row: as in :mod:`leadline.rate.state`.
        alpha1: the first safe step (a float or :class:`FirstStep`).
        total_steps: the run's length T in optimizer steps.
        effort: ``"full"`` runs the look-ahead; ``"quick"`` runs nothing and returns alpha1 and
            the grid for :func:`race`.
        grid: the exponents j of alpha1 x 2^j.
        first_horizon: the first n (default: the warmup's length, so every reading is of the
            rate itself); n doubles up to T.
        settle: how many horizons the trend of the best rate is fitted over.
        settle_slope: settled when |s| in best rate ~ n^s is at most this.
        min_horizon: the shortest horizon a settled answer may end on (default max(16, T/8)).
        budget_fraction: the step budget, as a fraction of T, over all candidates.
        alpha: the error rate of the sequential tests.
        warmup_steps: the candidates' warmup from alpha1; default round(1/(1 - beta1)) with the
            optimizer's beta1 (0: every candidate starts at its rate, as a run without warmup does).
        max_extend: how many grid points the edges may grow by.
        keep_below: how many grid points below the best stay in even when significantly worse
            (a short horizon undersells a low rate; rates above the best that are significantly
            worse are out for good).
        keep_above: likewise above the best (so the estimate has both neighbours).
        place: where the snapshots live (``"auto"``: on the card when there is room).
        on_progress: called with each horizon's evidence.
        race_warmup: where the last horizon is the run's length, race a warmup from alpha1 over
            this many steps at the best rate against the candidate without it (see above).
        keep_branch: hand back the best grid rate's run as :attr:`Lookahead.branch`.

    Returns:
        :class:`Lookahead`. Weights, optimizer state, rates, gradients and RNG states are
        bit-identical afterwards, also when ``train_step`` or the reader raises.
    """
    t0 = time.perf_counter()
    a1 = _alpha1(alpha1)
    _check_args(total_steps, effort, grid)
    beta1 = beta1_of(opt)
    w = warmup_steps_for(beta1) if warmup_steps is None else int(warmup_steps)
    rates = sorted(a1 * 2.0**j for j in set(grid))
    budget = math.ceil(budget_fraction * total_steps)
    if effort == "quick":
        return Lookahead(a1, a1, rates, "quick", 0, 0, 0, total_steps, w, beta1,
                         "quick effort: no steps run; race() picks among the rates inside the run",
                         seconds=time.perf_counter() - t0,
                         stop="quick")

    from leadline.budget import OutOfTime
    from leadline.rate.state import check_params, group_ratios, no_trace, read_held_out

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
        race = None
        if race_warmup and s.evidence:
            race = _race_warmup(s.cands.get(s.last_best), int(race_warmup), w, a1, s.stop, s.last_read, total_steps,
                                params, opt, train_step, held_out_losses_per_row, origin, ratios, run.rows, place,
                                alpha)
    return _answer(s, run.rows, race, race_warmup, keep_branch, short, first, beta1, budget_fraction, t0)


def _check_args(total_steps: int, effort: str, grid: Sequence[int]) -> None:
    if not isinstance(total_steps, int) or total_steps < 1:
        raise InputError(f"total_steps must be the run's length in optimizer steps (>= 1), got {total_steps!r}")
    if effort not in ("quick", "full"):
        raise InputError(f"effort must be 'quick' or 'full', got {effort!r}")
    if not grid:
        raise InputError("grid is empty; pass the exponents j of alpha1 x 2^j, e.g. (-1, 0, 1, 2, 3)")


def _first_horizon(first: int, n_rates: int, total_steps: int, budget: int) -> tuple[int, bool]:
    """The first horizon, and whether the run was too short for the budget to cover the warmup at
    every rate (then the first horizon starts sooner)."""
    short = n_rates * min(first, total_steps) > budget
    if short:
        first = max(1, budget // n_rates)
    return first, short


@dataclass
class RunPieces:
    """What every candidate run from one origin uses (the look-ahead's and the race's): the
    weights, the optimizer, the step, the held-out reader, the origin snapshot, the parameter
    groups' ratios, and the held-out rows' losses at the origin (``base``, ``rows`` of them) on
    ``place``."""

    params: Any
    opt: Any
    train_step: Callable[[int], Any]
    held: Callable[[], Sequence[float]]
    origin: Any
    ratios: Any
    rows: int
    place: str
    base: Any


@dataclass
class _Search:
    """The look-ahead's settings and the state it carries from horizon to horizon."""

    a1: float
    w: int
    budget: int
    total_steps: int
    horizons: list[int]
    alpha: float
    settle: int
    settle_slope: float
    min_h: int
    keep_above: int
    keep_below: int
    lo_j: int
    hi_j: int
    on_progress: Callable[[dict[str, Any]], None] | None
    cands: dict[int, Any] = field(default_factory=dict)
    evidence: list[dict[str, Any]] = field(default_factory=list)
    estimates: list[float] = field(default_factory=list)
    read_at: list[int] = field(default_factory=list)
    sharp: list[bool] = field(default_factory=list)
    last_read: int = 0
    last_estimate: float = 0.0
    last_best: int = 0
    used: int = 0
    stopped: str = "unsettled"
    stop: LookaheadStop = "unsettled"
    snaps: dict[str, Any] = field(default_factory=dict)
    slope: float | None = None

    def __post_init__(self) -> None:
        self.last_estimate = self.a1

    def make(self, j: int) -> Any:
        """The candidate at alpha1 x 2^j, warmed from alpha1 over w steps."""
        from leadline.rate._run import Candidate

        r, a1, w = self.a1 * 2.0**j, self.a1, self.w
        return Candidate(r, lambda t, r=r: warmup_lr(t, r, a1, w), key=j)

    def halt(self, stop: LookaheadStop, sentence: str) -> bool:
        self.stop, self.stopped = stop, sentence
        return True


def _horizon(s: _Search, run: RunPieces, look: int, n: int) -> bool:
    """One horizon: the affordable candidates run to n steps and are read, the worse dropped, the
    best estimated, the edges extended. True when the look-ahead stops here (``s.stop`` says why)."""
    alive, cost = _affordable(s, n)
    if s.used + cost > s.budget:
        return s.halt("budget", f"budget: horizon {n} needed {cost} more steps, {s.budget - s.used} left")
    _advance(s, run, alive, look, n)
    running = {j: c for j, c in s.cands.items() if c.status == "running" and n in c.readings}
    if not running:
        s.halt("diverged", "every rate diverged or was unstable")
        s.evidence.append({"steps": n, "candidates": [c.row(n) for c in s.cands.values() if n in c.readings]})
        return True
    best = _read(s, running, look, n, run.rows)
    if (n >= s.min_h and len(s.sharp) >= s.settle and all(s.sharp[-s.settle:]) and s.slope is not None
            and abs(s.slope) <= s.settle_slope):
        return s.halt("settled", f"settled: the best rate moved as n^{s.slope:.2f} over the last {s.settle} "
                                 f"horizons, the last {n} steps")
    if n == s.total_steps:
        return s.halt("run_length", "reached the run's length")
    if n >= s.w:  # no extension on a reading inside the warmup
        _extend(s, best)
    return False


def _affordable(s: _Search, n: int) -> tuple[list[Any], int]:
    """The running candidates and the steps they need to reach n; where that passes the budget,
    the best and its neighbours alone, when they fit."""
    alive = [c for c in s.cands.values() if c.status == "running"]
    cost = sum(n - c.done for c in alive)
    if s.used + cost > s.budget and s.evidence:  # narrow to the best and its neighbours
        keep = [c for c in alive if abs(c.key - s.last_best) <= 1]
        if s.used + sum(n - c.done for c in keep) <= s.budget:
            for c in alive:
                if c not in keep:
                    c.stop("out of budget")
            alive, cost = keep, sum(n - c.done for c in keep)
    return alive, cost


def _advance(s: _Search, run: RunPieces, alive: list[Any], look: int, n: int) -> None:
    """Each candidate continued to n steps; one whose loss rose significantly since its previous
    reading is out with every higher rate (unstable)."""
    for c in alive:
        c.readings.setdefault(0, run.base)
        prev = max(k for k in c.readings if k < n)
        s.used += n - c.done
        c.advance(n, run.params, run.opt, run.train_step, run.held, run.origin, run.ratios, run.rows, run.place)
        if c.status == "running" and compare(c.readings[n], c.readings[prev], alpha=s.alpha, look=look,
                                             max_looks=len(s.horizons)).worse:
            for other in s.cands.values():
                if other.lr >= c.lr and other.status == "running":
                    other.stop("unstable")
        if c.snapshot is not None:
            s.snaps = c.snapshot.evidence()


def _read(s: _Search, running: dict[int, Any], look: int, n: int, rows: int) -> int:
    """The horizon's verdicts: the significantly worse dropped, the best estimated between grid
    points, the trend refitted, the evidence recorded. Returns the best grid point."""
    best, verdicts = prune({j: c.readings[n] for j, c in running.items()}, alpha=s.alpha, look=look,
                           max_looks=len(s.horizons))
    for j, v in verdicts.items():
        if v.worse and (j > best + s.keep_above or (j < best - s.keep_below and n >= s.w)):
            s.cands[j].stop("dropped")
    est, refined = _estimate(s.cands, best, n, rows)
    if n >= s.w:  # a horizon inside the warmup says little about the rate itself
        s.estimates.append(est)
        s.read_at.append(n)
        s.sharp.append(refined)
    s.slope = trend_slope(s.read_at, s.estimates, s.settle)
    s.evidence.append({"steps": n, "best_lr": s.cands[best].lr, "estimate": est, "refined": refined,
                       "trend_slope": s.slope, "candidates": [
                           c.row(n, verdicts[j].as_dict() if j in verdicts else None) for j,
                           c in sorted(s.cands.items()) if n in c.readings]})
    s.last_read, s.last_estimate, s.last_best = n, est, best
    if s.on_progress is not None:
        s.on_progress(s.evidence[-1])
    return best


def _extend(s: _Search, best: int) -> None:
    """Where the best sits at an edge of the running rates, the next rate beyond it joins."""
    blocked = any(c.status in ("unstable", "diverged") for c in s.cands.values())
    run_js = sorted(j for j, c in s.cands.items() if c.status == "running")
    if best == run_js[-1] and best + 1 not in s.cands and best + 1 <= s.hi_j and not blocked:
        s.cands[best + 1] = s.make(best + 1)
    if best == run_js[0] and best - 1 >= s.lo_j and (best - 1 not in s.cands
                                                     or s.cands[best - 1].status == "dropped"):
        s.cands[best - 1] = s.make(best - 1)  # (re)started from the origin: short horizons undersell low rates


def _answer(s: _Search, rows: int, race: dict[str, Any] | None, race_warmup: int | None, keep_branch: bool,
            short: bool, first: int, beta1: float, budget_fraction: float, t0: float) -> Lookahead:
    """The answer from the last estimate: carried to the run's length where the trend says so,
    held below the lowest unstable rate; with the warmup race and the branch."""
    won = race.pop("_arm", None) if race else None
    branch = (_branch(won or s.cands.get(s.last_best), s.last_read, race_warmup if won else s.w, s.a1)
              if keep_branch else None)
    if not s.evidence:
        raise InputError(f"the step budget ({s.budget} steps = {budget_fraction} x {s.total_steps}) does not cover "
                         f"the first horizon of {len(s.cands)} rates; raise budget_fraction or use effort='quick'")
    last, lr, stopped = s.last_read, s.last_estimate, s.stopped
    if short:
        stopped += f"; the run is short for its budget: the first horizon was cut to {first} steps"
    lr, why = answer_at_run_length(lr, last, s.slope, s.total_steps, settled=s.stop == "settled", settle=s.settle)
    stopped += why
    ceiling = min((c.lr for c in s.cands.values() if c.status in ("unstable", "diverged")), default=math.inf)
    if lr >= ceiling:
        lr = ceiling / 2
        stopped += f"; held below the lowest unstable rate {ceiling:.3g}"
    return Lookahead(lr, s.a1, sorted(c.lr for c in s.cands.values()), "full", last, s.used, s.budget, s.total_steps,
                     int(race_warmup) if won else s.w, beta1, stopped, rows, s.evidence, s.slope, s.snaps,
                     time.perf_counter() - t0, s.stop, race, branch)


def _race_warmup(best: Any, warmup: int, w: int, a1: float, stop: str, last: int, total_steps: int,
                 params: Any, opt: Any, train_step: Callable[[int], Any], held: Callable[[], Sequence[float]],
                 origin: Any, ratios: Any, rows: int, place: str, alpha: float) -> dict[str, Any]:
    """Race the warmup from alpha1 at the best rate against that rate's candidate, where the
    look-ahead read at the run's length; else say why it was not raced. A won race carries the
    warmup's candidate under ``"_arm"`` (the branch a run continues from)."""
    from leadline.budget import OutOfTime
    from leadline.rate._run import Candidate

    if w > 0:
        return {"raced": False, "why": f"the look-ahead's candidates were themselves warmed over {w} steps"}
    if stop != "run_length":
        return {"raced": False, "why": f"the look-ahead read at {last} of the run's {total_steps} steps, and a warmup "
                                       "raced short of the run's length can read ahead where it loses at the run's "
                                       "length (docs/rate.md)"}
    if best is None or best.status != "running" or total_steps not in best.readings:
        return {"raced": False, "why": "the best rate did not reach the run's length"}
    if best.lr <= a1:
        return {"raced": False, "why": f"the best rate {best.lr:.3g} is at or below alpha1 {a1:.3g}"}
    arm = Candidate(best.lr, lambda t, r=best.lr: warmup_lr(t, r, a1, warmup), key="warmup")
    try:
        arm.advance(total_steps, params, opt, train_step, held, origin, ratios, rows, place)
    except OutOfTime:
        return {"raced": False, "why": "max_seconds cut the race"}
    out = warmup_race(arm.readings[total_steps], best.readings[total_steps], rate=best.lr, warmup_steps=warmup,
                      total_steps=total_steps, alpha=alpha)
    out["steps_used"] = total_steps
    if out["kept"] == "warmup" and arm.status == "running":
        out["_arm"] = arm
    return out


def _branch(c: Any, last: int, warmup: int, a1: float) -> Branch | None:
    """The candidate's run as a :class:`Branch`, where it is whole at the last horizon."""
    if c is None or c.status != "running" or c.snapshot is None or c.done != last or last < 1:
        return None
    return Branch(c.lr, c.done, c.snapshot, warmup, a1)


def _estimate(cands: dict[int, Any], best: int, n: int, rows: int) -> tuple[float, bool]:
    """The best rate between grid points — the parabola through the best and its two
    neighbours' mean held-out losses at horizon n — and True; or the best grid point and False."""
    trio = [cands.get(best - 1), cands[best], cands.get(best + 1)]
    if all(c is not None and n in c.readings for c in trio):
        refined = parabola_log2([c.lr for c in trio], [sum(c.readings[n]) / rows for c in trio])
        if refined is not None:
            return refined, True
    return cands[best].lr, False


def answer_at_run_length(estimate: float, last: int, slope: float | None, total_steps: int, *, settled: bool,
                         settle: int = 3) -> tuple[float, str]:
    """The look-ahead's answer from its last estimate (read at ``last`` steps) and the trend
    ``slope`` (s in lr ~ n^s): carried to ``total_steps`` only on a falling trend that had not
    settled. Returns (rate, the clause the stop reason gains)."""
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

