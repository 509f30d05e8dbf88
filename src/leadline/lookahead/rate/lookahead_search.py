"""The look-ahead's candidate runs: each horizon's candidates advanced from their own
snapshots, read on the held-out rows, pruned, estimated between grid points and extended at the
edges; the warmup raced at the best rate; the best candidate's run handed back as a branch.

The state between horizons is one :class:`_Search`; :func:`_horizon` is one horizon. The rules
they follow are stated in :mod:`leadline.lookahead.rate.lookahead`'s docstring; the candidates themselves
(torch) are :class:`leadline.lookahead.rate._run.Candidate`, imported when a candidate is made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from leadline.lookahead.rate.lookahead_result import Branch, LookaheadStop
from leadline.lookahead.rate.lookahead_rules import parabola_log2, prune, trend_slope
from leadline.lookahead.rate.warmup import warmup_lr, warmup_race
from leadline.rate.compare import compare


@dataclass
class RunPieces:
    """What every candidate run from one origin uses (the look-ahead's): the
    weights, the optimizer, the step, the held-out reader, the origin snapshot, the parameter
    groups' ratios, and the held-out rows' losses at the origin (``base``, ``rows`` of them) on
    ``place``.

    Examples:
        What :func:`~leadline.lookahead.rate.lookahead_lr` builds inside
        :func:`~leadline.lookahead.rate.measuring.no_trace` (here with stand-ins for the torch pieces):

        >>> base = [2.0, 2.5, 1.5]
        >>> pieces = RunPieces(params=[], opt=None, train_step=lambda step: None, held=lambda: base, origin=None,
        ...                    ratios=[1.0], rows=len(base), place="auto", base=base)
        >>> pieces.rows, pieces.held() == pieces.base
        (3, True)
    """

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
        from leadline.lookahead.rate._run import Candidate

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


def _race_warmup(best: Any, warmup: int, w: int, a1: float, stop: str, last: int, total_steps: int,
                 params: Any, opt: Any, train_step: Callable[[int], Any], held: Callable[[], Sequence[float]],
                 origin: Any, ratios: Any, rows: int, place: str, alpha: float) -> dict[str, Any]:
    """Race the warmup from alpha1 at the best rate against that rate's candidate, where the
    look-ahead read at the run's length; else say why it was not raced. A won race carries the
    warmup's candidate under ``"_arm"`` (the branch a run continues from)."""
    from leadline.lookahead.budget import OutOfTime
    from leadline.lookahead.rate._run import Candidate

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
