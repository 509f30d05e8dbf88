"""race(): the rates raced inside the run by successive halving, the ending raced too.

race() *is* the run: every rate starts from the same weights, RNG state and rows (warmup from
alpha1, then constant); at each round's boundary the candidates are read on the held-out rows
and compared with the best (paired t at :func:`leadline.stats.sequential_bar`), and half go on,
each continued from its own snapshot: those not significantly worse than the best first,
lowest rates first, then the others by mean (diverged ones are out, and one whose held-out loss
rose significantly since its previous reading — a spike — is out with every higher rate; when
that is every running rate, the lowest goes on: the race is the run) — successive halving,
Jamieson & Talwalkar 2016; Li et al. 2018. The boundaries double from the end of the warmup (at least
T/16; a short horizon favours the rate that learns the answer's format fastest); the last
decides the winner **by a test**: the best mean wins when every other rate is significantly
worse; otherwise the lowest rate among those not significantly worse (a tie goes to the rate
least likely to spike late — the format trap's collapse in docs/rate.md came from the highest). The winner runs
to the end; copies are kept at T/2 and T - 2h (those past its last round), and the ending is
raced: the same steps rerun from each copy with the rate falling linearly to zero, the better
decay (by its mean held-out loss) kept unless the constant ending is better by a one-sided
paired t test (:func:`leadline.rate._run.race_ending`).

On success the model holds the winner's end (the run's result). On an exception everything is
put back as it was before race() (weights, optimizer state, rates, gradients, RNG).

References: Jamieson & Talwalkar 2016, "Non-stochastic Best Arm Identification and
Hyperparameter Optimization", <https://arxiv.org/abs/1502.07943>; Li et al. 2018, "Hyperband",
<https://arxiv.org/abs/1603.06560>.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from leadline.errors import InputError
from leadline.plan import Value
from leadline.rate.compare import compare, mean_or_inf, prune
from leadline.rate.lookahead import RunPieces
from leadline.rate.warmup import warmup_lr, warmup_steps_for


@dataclass
class RaceResult:
    """The race's winner and its rounds (evidence in the look-ahead's shape).

    Attributes:
        lr: the winner.
        rounds: per round, every candidate's mean held-out loss, SE, status and test.
        ending: the raced ending's record (``kept``: ``decay``, ``average`` or ``constant``).
        decided_by: how the last round chose the winner.

    Examples:
        >>> r = RaceResult(lr=1e-3, rates=[5e-4, 1e-3, 2e-3], rounds=[], ending={"kept": "decay", "why": "..."},
        ...                steps_used=140, total_steps=100, decided_by="the only rate left", held_out_rows=64)
        >>> {name: (v.value, v.kind) for name, v in r.as_values().items()}
        {'lr': (0.001, 'measured'), 'ending': ('decay', 'measured')}
        >>> r.as_values()["lr"].source
        'won a race of 3 rates inside the run by successive halving on 64 held-out rows (the only rate left; ...)'
    """

    lr: float
    rates: list[float]
    rounds: list[dict[str, Any]]
    ending: dict[str, Any]
    steps_used: int
    total_steps: int
    decided_by: str
    held_out_rows: int = 0
    seconds: float = 0.0
    snapshots: dict[str, Any] = field(default_factory=dict)

    def evidence(self) -> dict[str, Any]:
        return {"plot": "lookahead", "horizons": self.rounds, "chosen_lr": self.lr, "rates": self.rates,
                "ending": self.ending, "steps_used": self.steps_used, "total_steps": self.total_steps,
                "decided_by": self.decided_by, "held_out_rows": self.held_out_rows, "snapshots": self.snapshots}

    def as_values(self) -> dict[str, Value]:
        """``lr`` (the winner) and ``ending`` (decay or constant), both measured."""
        kept = self.ending.get("kept", "constant")
        return {
            "lr": Value(self.lr, "measured",
                        f"won a race of {len(self.rates)} rates inside the run by successive halving on "
                        f"{self.held_out_rows} held-out rows ({self.decided_by}; {self.steps_used} steps for a "
                        f"{self.total_steps}-step run)", evidence=self.evidence(), seconds=self.seconds,
                        unit="per step"),
            "ending": Value(kept, "measured", self.ending.get("why", "the ending raced at the end"),
                            evidence=self.ending),
        }


def quick_race_rates(anchor: float, alpha1: float) -> list[float]:
    """The quick plan's race: the anchor x 2^j from half the anchor up to alpha1 (alpha1 is the
    best single step, not a rate to hold; docs/rate.md).

    Examples:
        >>> quick_race_rates(1e-3, 4e-3)
        [0.0005, 0.001, 0.002, 0.004]
        >>> quick_race_rates(0, 4e-3)
        Traceback (most recent call last):
            ...
        leadline.errors.InputError: quick_race_rates needs a positive anchor and alpha1, got 0 and 0.004
    """
    if not (anchor > 0 and alpha1 > 0 and math.isfinite(anchor) and math.isfinite(alpha1)):
        raise InputError(f"quick_race_rates needs a positive anchor and alpha1, got {anchor!r} and {alpha1!r}")
    return [anchor * 2.0**j for j in range(-1, 8) if anchor * 2.0**j <= alpha1 * (1 + 1e-9)]


def boundaries(n_rates: int, total_steps: int, first: int) -> list[int]:
    """ceil(log2 K) halving points for K rates, doubling from ``first``, none past T/2 (each >= 1).

    Examples:
        >>> boundaries(4, 160, 10), boundaries(8, 160, 10), boundaries(8, 60, 10)
        ([10, 20], [10, 20, 40], [10, 20, 30])
    """
    rounds = max(1, math.ceil(math.log2(max(2, n_rates))))
    out = sorted({min(max(1, first) * 2**r, max(1, total_steps // 2)) for r in range(rounds)})
    return [b for b in out if b < total_steps] or [max(1, total_steps - 1)]


def race(params: Sequence[Any], opt: Any, train_step: Callable[[int], Any],
         held_out: Callable[[], Sequence[float]], rates: Sequence[float], total_steps: int, *,
         alpha1: float | None = None, warmup_steps: int | None = None, first_round: int | None = None,
         ending_horizon: int | None = None, alpha: float = 0.05, place: str = "auto",
         on_progress: Callable[[dict[str, Any]], None] | None = None, rounds_only: bool = False,
         average: bool = False) -> RaceResult:
    """Race ``rates`` inside a run of ``total_steps`` optimizer steps (see the module docstring).

    Args:
        params, opt, train_step: as in :mod:`leadline.rate.state`; ``train_step(t)`` is called
            for t in 0..T-1 by each candidate while it runs.
        held_out: ``held_out_losses_per_row()``.
        rates: the candidates (e.g. ``lookahead_lr(..., effort="quick").rates``).
        total_steps: T.
        alpha1: the warmup's start (default: the lowest rate); warmup over ``warmup_steps``
            (default round(1/(1 - beta1))).
        first_round: the first halving point (default max(warmup, T/16)): a reading inside the
            warmup is of the warmup, not of the rate; the points double from there.
        ending_horizon: h; the ending is raced over the last 2h steps and the last half (default
            h = T // 8).
        alpha: the error rate of the tests.
        place: where the snapshots live.
        rounds_only: run the halving rounds and decide the winner, then put the weights and
            the optimizer state back as they were (a loop of someone else's, e.g. Trainer's,
            then runs the winner's rate from the start); ``steps_used`` counts the rounds.
        average: also race the winner's weights averaged over the run's last half at the
            constant rate (no step rerun: one held-out read; a float32 copy of the trained
            tensors kept while it runs), ranked with the decays.

    Returns:
        :class:`RaceResult`; the trained tensors hold the winner's run with the kept ending
        (with ``rounds_only``: as they were before the race).

    Examples:
        Four weights trained from 0 toward 0.01, one held-out row each; Adam moves every entry
        by about lr a step. At the first round (step 4) 0.01 / 4 has reached the target and
        leads; by the second (step 8) it has overshot, its own loss rose (a spike) and it is
        out, and 0.01 / 8, on the target, wins and runs to step 16; the last 4 steps rerun with
        the rate falling to zero read lower than the constant ending, so the decay is kept:

        >>> import torch
        >>> w = torch.zeros(4, requires_grad=True)
        >>> opt = torch.optim.Adam([w])
        >>> train_step = lambda step: ((w - 0.01) ** 2).mean().backward()
        >>> held_out = lambda: ((w - 0.01) ** 2).tolist()
        >>> r = race([w], opt, train_step, held_out, [0.01 / 32, 0.01 / 16, 0.01 / 8, 0.01 / 4], 16,
        ...          warmup_steps=0, first_round=4)
        >>> r.lr, r.decided_by, r.ending["kept"]
        (0.00125, 'the only rate left', 'decay')
        >>> [(c["lr"], c["status"]) for c in r.rounds[-1]["candidates"]]
        [(0.0025, 'unstable'), (0.00125, 'running')]
    """
    t0 = time.perf_counter()
    rates = _checked_rates(rates, total_steps)
    s, win, ending = _run_race(params, opt, train_step, held_out, rates, total_steps, alpha1, warmup_steps,
                               first_round, ending_horizon, alpha=alpha, place=place, on_progress=on_progress,
                               rounds_only=rounds_only, average=average)
    return RaceResult(win.lr, rates, s.rounds, ending, s.used, total_steps, s.decided, s.rows,
                      time.perf_counter() - t0, s.snaps)


def _checked_rates(rates: Sequence[float], total_steps: int) -> list[float]:
    """The rates, each once and in order, refused unless positive numbers, and the run's length checked."""
    rates = sorted({float(r) for r in rates})
    if not rates or not all(math.isfinite(r) and r > 0 for r in rates):
        raise InputError(f"rates must be positive numbers, got {rates!r}")
    if not isinstance(total_steps, int) or total_steps < 2:
        raise InputError(f"total_steps must be the run's length in optimizer steps (>= 2), got {total_steps!r}")
    return rates


def _run_race(params: Sequence[Any], opt: Any, train_step: Callable[[int], Any],
              held_out: Callable[[], Sequence[float]], rates: list[float], total_steps: int, alpha1: float | None,
              warmup_steps: int | None, first_round: int | None, ending_horizon: int | None, *, alpha: float,
              place: str, on_progress: Callable[[dict[str, Any]], None] | None, rounds_only: bool,
              average: bool) -> tuple[_Race, Any, dict[str, Any]]:
    """The race on checked rates: its rounds, then the winner's run and its ending; with
    ``rounds_only`` the rounds alone, the weights put back. ``(the race, the winner, the ending)``."""
    from leadline.rate._run import Candidate
    from leadline.rate.lookahead import beta1_of
    from leadline.rate.state import check_params, group_ratios, no_trace, read_held_out

    params = check_params(params, opt)
    a1 = min(rates) if alpha1 is None else float(alpha1)
    w = warmup_steps_for(beta1_of(opt)) if warmup_steps is None else int(warmup_steps)
    cands = [Candidate(r, lambda t, r=r: warmup_lr(t, r, a1, w), key=i) for i, r in enumerate(rates)]
    points = boundaries(len(rates), total_steps,
                        max(w, math.ceil(total_steps / 16)) if first_round is None else first_round)
    h = max(1, total_steps // 8) if ending_horizon is None else int(ending_horizon)
    with no_trace(params, opt, place=place, on_success=False) as origin:
        ratios = group_ratios(opt)
        base = read_held_out(held_out)
        s = _Race(params, opt, train_step, held_out, origin, ratios, len(base), place, base, alpha, cands, points)
        win = _rounds(s, cands, points, on_progress)
        if rounds_only:
            origin.load(params, opt)
            for c in cands:
                c.snapshot = None
            s.decided += "".join("; " + n for n in s.notes)
            return s, win, {"kept": None, "why": "the rounds only: the winner's run and its ending are the caller's"}
        ending = _run_winner(s, win, total_steps, h, average)
        for c in cands:
            c.snapshot = None
    if s.notes:
        s.decided += "; " + "; ".join(s.notes)
    return s, win, ending


def _rounds(s: _Race, cands: list[Any], points: list[int],
            on_progress: Callable[[dict[str, Any]], None] | None) -> Any:
    """The rounds of successive halving at ``points``, until one candidate is left: the winner."""
    alive = list(cands)
    for look, b in enumerate(points, 1):
        if len(alive) == 1:
            break
        alive = _round(s, alive, look, b)
        if on_progress is not None:
            on_progress(s.rounds[-1])
    return alive[0]


@dataclass
class _Race(RunPieces):
    """The race's pieces (:class:`~leadline.rate.lookahead.RunPieces`) and the state it carries from
    round to round."""

    alpha: float
    cands: list[Any]
    points: list[int]
    used: int = 0
    decided: str = "one rate"
    snaps: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)


def _round(s: _Race, alive: list[Any], look: int, b: int) -> list[Any]:
    """One round: the candidates run to step b and are read, the spiked put out, the survivors
    kept (the last round: the winner alone). Returns those that go on."""
    seen, spiked = _advance(s, alive, look, b)
    if not any(math.isfinite(mean_or_inf(c.readings[b])) for c in seen):
        raise InputError(f"every rate in the race diverged by step {b} (held-out loss not finite); pass lower "
                         "rates")
    _stop_spiked(s, [c for c in seen if c.status == "running"], spiked, b)
    alive = [c for c in seen if c.status == "running"]
    readings = {c.key: c.readings[b] for c in alive}
    best, verdicts = prune(readings, alpha=s.alpha, look=look, max_looks=len(s.points))
    keep = _survivors(s, readings, best, verdicts, last=look == len(s.points), entered=len(seen))
    for c in alive:
        if c.key not in keep:
            c.stop("dropped" if c.status == "running" else c.status)
    s.rounds.append({"steps": b,
                     "candidates": [c.row(b,
                                          verdicts[c.key].as_dict() if c.key in verdicts else None)
                                    for c in seen]})
    return [s.cands[k] for k in keep]


def _advance(s: _Race, alive: list[Any], look: int, b: int) -> tuple[list[Any], list[Any]]:
    """Each candidate continued to step b; returns them, and those whose own held-out loss rose
    significantly since their previous reading (spiked)."""
    spiked = []
    for c in alive:
        s.used += b - c.done
        prev = max(c.readings, default=0)
        c.advance(b, s.params, s.opt, s.train_step, s.held, s.origin, s.ratios, s.rows, s.place)
        s.snaps = c.snapshot.evidence() if c.snapshot is not None else s.snaps
        if c.status == "running" and compare(c.readings[b], c.readings.get(prev, s.base), alpha=s.alpha, look=look,
                                             max_looks=len(s.points)).worse:
            spiked.append(c)  # its own held-out loss rose since its previous reading
    return list(alive), spiked


def _stop_spiked(s: _Race, running: list[Any], spiked: list[Any], b: int) -> None:
    """A spike puts that rate and every higher one out, but the run goes on: where that is every
    running rate, the lowest stays, the least likely to spike again."""
    if not spiked:
        return
    low = min(c.lr for c in spiked)
    out = sorted((c for c in running if c.lr >= low), key=lambda c: c.lr)
    if len(out) == len(running):
        s.notes.append(f"step {b}: every running rate's held-out loss rose since its previous reading; the "
                       f"lowest, {out[0].lr:.3g}, goes on")
        out = out[1:]
    for c in out:
        c.stop("unstable")


def _survivors(s: _Race, readings: dict[Any, Any], best: Any, verdicts: dict[Any, Any], *, last: bool,
               entered: int) -> list[Any]:
    """Those that go on: the last round's winner by a test (``s.decided`` says how), else half of
    those that entered the round — the tied ones first, lowest rates first; then by mean."""
    tied = [k for k in readings if k == best or not verdicts[k].worse]
    tied = [k for k in tied if math.isfinite(mean_or_inf(readings[k]))] or [best]
    if last:
        winner = min(tied, key=lambda k: s.cands[k].lr)
        s.decided = ("the only rate left" if len(readings) == 1
                     else "the best mean, every other rate significantly worse" if winner == best
                     and len(tied) == 1
                     else f"{len(tied)} rates not significantly different: the lowest of them")
        return [winner]
    half = max(1, math.ceil(entered / 2))  # half of those that entered the round
    rest = sorted((k for k in readings if k not in tied and math.isfinite(mean_or_inf(readings[k]))),
                  key=lambda k: mean_or_inf(readings[k]))
    return (sorted(tied, key=lambda k: s.cands[k].lr) + rest)[:half]


def _run_winner(s: _Race, win: Any, total_steps: int, h: int, average: bool = False) -> dict[str, Any]:
    """The winner run to the end from its snapshot, copies kept at T/2 and T - 2h (those after
    its last round) and the endings raced from them; with ``average``, the iterates after T/2
    averaged on the way. Returns the ending's record."""
    from leadline.rate._run import EndingCopy, TailAverage, ending_why, race_ending
    from leadline.rate.state import Snapshot, run_steps

    (win.snapshot or s.origin).load(s.params, s.opt)
    tail = TailAverage(s.params, total_steps // 2) if average and win.done <= total_steps // 2 else None
    step = s.train_step
    if tail is not None:
        def step(t: int) -> Any:  # the weights entering step t are the iterate after t steps
            if t > tail.start:
                tail.fold(s.params)
            return s.train_step(t)
    lengths = (total_steps // 2, 2 * h) if total_steps // 2 > 2 * h else (2 * h,)
    starts = sorted(total_steps - n for n in lengths if win.done < total_steps - n < total_steps)
    if total_steps - 2 * h <= win.done:
        run_steps(s.opt, s.train_step, win.done, total_steps, win.lr_at, s.ratios)
        s.used += total_steps - win.done
        return {"kept": "constant", "why": "no ending race: the run is too short for 2h steps after the last round"}
    copies, at = [], win.done
    for start in starts:
        run_steps(s.opt, step, at, start, win.lr_at, s.ratios)
        copies.append(EndingCopy(Snapshot.take(s.params, s.opt, place=s.place), win.lr_at(start), start))
        at = start
    run_steps(s.opt, step, at, total_steps, win.lr_at, s.ratios)
    if tail is not None:
        tail.fold(s.params)  # the last iterate, after step T-1
    s.used += total_steps - win.done + sum(total_steps - c.start for c in copies)
    ending, _ = race_ending(s.params, s.opt, s.train_step, s.held, copies, total_steps, s.ratios, s.rows,
                            alpha=s.alpha, place=s.place, average=tail)
    ending["why"] = ending_why(ending)
    return ending
