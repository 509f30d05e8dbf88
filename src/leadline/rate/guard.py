"""The guard: the run read on held-out rows at checks spread over it, and rolled back when it worsens.

The seed's first lesson is a run that learns fast, spikes, collapses to one answer and cannot
climb out at its rate. The guard is the answer it measured (check every horizon on held-out
rows, put the best check back, halve the rate), as pure rules on numbers;
:class:`leadline.rate.watch.Watch` feeds it readings and carries out what it says, for the run's
loop (:mod:`leadline.run.loop`), the LookaheadSchedule (:mod:`leadline.lookahead.rate.schedule`) and the
guard inside Trainer alike. The rules, fixed before any run of them:

1. **Where it reads.** :data:`CHECKS` checks spread evenly over the steps after the start, the
   last at the run's end (:func:`check_steps`), plus the start itself. The reads use a fixed
   subset of the held-out rows sized so that all the checks together cost at most
   :data:`READ_SHARE` of the run's step time, never fewer than :data:`MIN_CHECK_ROWS` rows
   (or every held-out row where there are fewer); where even that would pass the share, the
   checks are thinned, never below :data:`MIN_CHECKS` (:func:`check_plan`). The start and the
   kept model are read on every held-out row: the run's verdict.
2. **The watch between checks.** A non-finite step loss is a rollback at once (the state that
   produced it is not read). A step loss above :data:`SPIKE_RATIO` times the highest of the
   last :data:`SPIKE_WINDOW` step losses (with at least half that many seen) calls a check at
   once, at most one such check between two scheduled ones (:func:`spiked`).
3. **A check.** The per-row losses against the best check's, one-sided paired t at the
   sequential bar (:func:`leadline.rate.compare.compare`, O'Brien-Fleming spending over the
   planned looks). A check **rolls back** when it went wrong, not when it wobbled:
   - its mean is not below the start's: at once, whatever the bar says (a run that reads worse
     than it started is not waited on);
   - or it is significantly worse than the best check *and* gave back at least
     :data:`GIVE_BACK` of the fall from the start to the best (:func:`gave_back`; why that share:
     ``docs/rate.md``, "The guard").
   Else a lower mean is the new best; else keep going. A non-finite step loss still rolls back at
   once, and a spike still calls a check at once (rule 2), judged by the same rule.
4. **A rollback** puts the best check's weights and optimizer state back and multiplies the rate
   by :data:`ROLLBACK_FACTOR` (the seed halves). A rate promoted over the run's default (the
   opening race's incumbent) drops to the incumbent at once or lower. When the run fails again
   from the same check without improving on it, that check is suspect (a state already going
   bad) and the guard goes one check further back, as far as the start.
5. **Stop.** After :data:`MAX_ROLLBACKS` rollbacks a further worsening ends the run at the best
   check: the steps left are saved, not spent (a run of several passes learning its rows by
   heart ends here, as the pass rule did).
6. **The end.** The run's end is kept unless it is significantly worse than the best check (the
   sequential bar at the last look, whatever share of the fall it gave back) or no better than
   the start; the best check is then put back. Rule 3's share guards the run's course (a
   rollback halves the rate and spends the steps since the best); choosing between two kept
   states at the end changes nothing else, so the better one is kept. The kept model is read
   once more on every held-out row against the start's reading: a kept model whose mean is not
   below the start's is *no better than its start* (:func:`outcome`); the run then keeps the
   start's weights and says so.

Reference: the seed README's LookaheadSchedule (check, roll back, halve); Lan & DeMets 1983 for
the sequential bar.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from leadline.rate.compare import compare, mean_or_inf

CHECKS = 8
"""Checks after the start in a run long enough to have them (at least 8 for 100 steps and more)."""
MIN_CHECKS = 3
"""The fewest checks the read budget may thin the run to."""
READ_SHARE = 0.05
"""All the checks' reads together: at most this share of the run's step time."""
MIN_CHECK_ROWS = 32
"""The fewest held-out rows a check reads (every row where the split holds fewer)."""
ROLLBACK_FACTOR = 0.5
"""The rate after a rollback, as a share of the rate before it (the seed halves)."""
MAX_ROLLBACKS = 3
"""Rollbacks before a further worsening stops the run at its best check."""
STEP_READS = 3
"""A training step's forward and backward, in forwards of its rows (the usual 1 + 2)."""
SPIKE_WINDOW = 16
SPIKE_RATIO = 2.0
ALPHA = 0.05
GIVE_BACK = 0.05
"""The share of the start-to-best fall a significant worsening must give back to roll back (rule 3)."""
END_RULE = "the best check where the end is significantly worse"
"""What the end keeps (rule 6), as ``run.json``'s ``rules`` names it."""

Action = Literal["start", "best", "keep", "rollback", "stop", "final", "restore"]


def check_steps(total_steps: int, start: int = 0, checks: int = CHECKS) -> list[int]:
    """The steps after which the guard reads: ``checks`` spread evenly over ``start+1..total``,
    the last at ``total`` (fewer where the run has fewer steps left).

    Examples:
        >>> check_steps(100)
        [13, 25, 38, 50, 63, 75, 88, 100]
        >>> check_steps(20, start=2)   # a 20-step run after a 2-step opening
        [5, 7, 9, 11, 14, 16, 18, 20]
        >>> check_steps(3), check_steps(10, start=10)
        ([1, 2, 3], [])
    """
    left = total_steps - start
    k = min(checks, left)
    return [start + math.ceil(i * left / k) for i in range(1, k + 1)] if k > 0 else []


def check_plan(held_out_rows: int, rows_per_step: int, steps: int) -> tuple[int, int]:
    """``(rows, checks)``: the held-out rows a check reads and the number of checks, within the budget.

    A training step's forward and backward cost about :data:`STEP_READS` forwards of its rows, so
    the run's steps are worth ``STEP_READS x rows_per_step x steps`` row reads and the checks may
    read :data:`READ_SHARE` of that: rows = budget / checks, at least :data:`MIN_CHECK_ROWS` (or
    every held-out row) and at most every held-out row; where the least rows would pass the
    budget at :data:`CHECKS` checks, the checks are thinned to what it holds, never below
    :data:`MIN_CHECKS`. The rule reads no clock, so a seed gives the same checks on a busy card
    as on an idle one; the reads' measured seconds are stated in the plan's phase table.

    Examples:
        A run of 250 steps of 16 rows: 8 checks of 75 rows; a run of 20 steps: 3 checks of 32:

        >>> check_plan(256, 16, 250), check_plan(256, 16, 20)
        ((75, 8), (32, 3))
        >>> check_plan(256, 16, 2000), check_plan(20, 16, 20)   # capped at every held-out row
        ((256, 8), (20, 3))
    """
    least = min(MIN_CHECK_ROWS, held_out_rows)
    budget = READ_SHARE * STEP_READS * rows_per_step * steps  # row reads the checks may spend
    checks = CHECKS
    if least * checks > budget:
        checks = max(MIN_CHECKS, int(budget // max(least, 1)))
    return max(least, min(held_out_rows, int(budget // checks))), checks


def gave_back(check: float, best: float, start: float) -> float:
    """The share of the fall from the start to the best that a check's mean gave back: 0 at the
    best, 1 back at the start; ``inf`` where the best is no lower than the start (nothing to give).

    Examples:
        >>> gave_back(0.446, 0.346, 8.61)   # a one-pass wobble
        0.0121
        >>> round(gave_back(2.736, 2.502, 5.350), 4), gave_back(3.0, 3.0, 3.0)
        (0.0822, inf)
    """
    fall = start - best
    if not fall > 0:
        return math.inf
    return round((check - best) / fall, 4)


def spiked(loss: float, recent: Sequence[float]) -> bool:
    """A step loss far above the recent steps': over :data:`SPIKE_RATIO` x their highest, with at
    least half of :data:`SPIKE_WINDOW` recent steps seen.

    Examples:
        >>> spiked(0.48, [0.004, 0.01, 0.003, 0.02, 0.006, 0.005, 0.004, 0.01])
        True
        >>> spiked(0.03, [0.004, 0.01, 0.003, 0.02, 0.006, 0.005, 0.004, 0.01])
        False
        >>> spiked(9.0, [0.1, 0.2])   # too few steps to tell a spike from the start's noise
        False
    """
    window = list(recent)[-SPIKE_WINDOW:]
    return len(window) >= SPIKE_WINDOW // 2 and loss > SPIKE_RATIO * max(window)


@dataclass
class Step:
    """What the guard says after a reading: the action, where to go back to, and the new rate."""

    action: Action
    to_step: int | None = None
    lr: float | None = None
    dropped: int | None = None  # a kept check no longer needed: its copy can be freed
    further_back: bool = False


@dataclass
class Guard:
    """The rules' state: the kept checks (the start and the latest bests), the rate, the record.

    ``incumbent``: the run's default rate where a race promoted another (None: no promotion).
    ``max_rollbacks``: rollbacks before a worsening stops the run (None: never stop, for a loop
    the guard cannot end, such as a caller's own loop under the LookaheadSchedule).

    Examples:
        A run that improves, then collapses at step 75; the best (step 50) is put back at half
        the rate; the end reads as well as the best and is kept:

        >>> g = Guard(rate=0.01, looks=4)
        >>> g.start(0, [2.0, 2.1, 1.9, 2.0]).action
        'start'
        >>> g.check(25, [1.0, 1.1, 0.9, 1.0]).action, g.check(50, [0.5, 0.6, 0.4, 0.5]).action
        ('best', 'best')
        >>> s = g.check(75, [9.0, 9.5, 8.5, 9.2])
        >>> s.action, s.to_step, s.lr
        ('rollback', 50, 0.005)
        >>> g.finish(100, [0.49, 0.61, 0.41, 0.5]).action, g.kept_step
        ('final', 100)

        A promoted rate goes back to the incumbent on its first rollback:

        >>> g = Guard(rate=0.01, looks=4, incumbent=0.0025)
        >>> _ = g.start(0, [2.0, 2.1, 1.9, 2.0])
        >>> g.check(10, [8.0, 8.1, 7.9, 8.2]).lr
        0.0025
    """

    rate: float
    looks: int
    incumbent: float | None = None
    alpha: float = ALPHA
    keep: int = 3
    max_rollbacks: int | None = MAX_ROLLBACKS
    chain: list[tuple[int, list[float]]] = field(default_factory=list)
    best_step: int = 0
    kept_step: int | None = None
    failures: int = 0
    looked: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def best(self) -> list[float]:
        return next(losses for step, losses in self.chain if step == self.best_step)

    @property
    def rollbacks(self) -> int:
        return sum(1 for r in self.records if r["action"] in ("rollback", "stop"))

    def start(self, step: int, losses: Sequence[float]) -> Step:
        """The start's reading: the first kept check."""
        self.chain, self.best_step = [(step, list(losses))], step
        self.start_mean = mean_or_inf(losses)
        self._record(step, losses, "start")
        return Step("start")

    start_mean: float = math.inf

    def went_wrong(self, losses: Sequence[float], look: int) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """Rule 3: ``(why, versus_best)``: ``why`` the comparison with the best check where the reading
        went wrong (no better than the start; or significantly worse than the best with
        :data:`GIVE_BACK` of the fall given back: any share where the best is the start), else None."""
        v = compare(losses, self.best, alpha=self.alpha, look=look, max_looks=self.looks).as_dict()
        share = gave_back(mean_or_inf(losses), mean_or_inf(self.best), self.start_mean)
        if not mean_or_inf(losses) < self.start_mean:
            return {**v, "gave_back": share, "worse_than_start": True}, v
        if v["worse"] and share >= GIVE_BACK:
            return {**v, "gave_back": share}, v
        return None, {**v, "gave_back": share}

    def check(self, step: int, losses: Sequence[float], *, why: str = "scheduled") -> Step:
        """A reading at ``step``: ``best`` (keep a copy), ``keep``, ``rollback`` or ``stop``."""
        self.looked += 1
        wrong, v = self.went_wrong(losses, min(self.looked, self.looks))
        if wrong is not None:
            return self._worse(step, losses, wrong, why)
        if mean_or_inf(losses) < mean_or_inf(self.best):
            dropped = self.chain.pop(1)[0] if len(self.chain) >= self.keep else None
            self.chain.append((step, list(losses)))
            self.best_step, self.failures = step, 0
            self._record(step, losses, "best", versus_best=v, why=why)
            return Step("best", dropped=dropped)
        self._record(step, losses, "keep", versus_best=v, why=why)
        return Step("keep")

    def diverged(self, step: int) -> Step:
        """A non-finite step loss: a rollback without a read."""
        return self._worse(step, [math.inf], {"worse": True, "non_finite_step_loss": True}, "non-finite step loss")

    def _worse(self, step: int, losses: Sequence[float], versus: dict[str, Any], why: str) -> Step:
        if self.max_rollbacks is not None and self.rollbacks >= self.max_rollbacks:
            self.kept_step = self.best_step
            self._record(step, losses, "stop", to_step=self.best_step, versus_best=versus, why=why)
            return Step("stop", to_step=self.best_step, lr=self.rate)
        self.failures += 1
        further = self.failures >= 2 and len(self.chain) > 1
        if further:
            self.chain.pop()
        target = self.chain[-1][0]
        self.best_step = target
        self.rate *= ROLLBACK_FACTOR
        if self.incumbent is not None and self.rate > self.incumbent:
            self.rate = self.incumbent
        self._record(step, losses, "rollback", to_step=target, further_back=further, versus_best=versus, why=why)
        return Step("rollback", to_step=target, lr=self.rate, further_back=further)

    def finish(self, step: int, losses: Sequence[float]) -> Step:
        """The run's end: kept (``final``) unless significantly worse than the best or no better than
        the start (``restore``, rule 6)."""
        if self.kept_step is not None:  # stopped: the best check is already the model
            return Step("stop", to_step=self.kept_step)
        wrong, v = self.went_wrong(losses, self.looks)
        if wrong is None and v["worse"]:  # a worsening too small to roll back a run is enough to choose the best
            wrong = {**v, "end": "significantly worse than the best check"}
        if wrong is not None:
            self.kept_step = self.best_step
            self._record(step, losses, "restore", to_step=self.best_step, versus_best=wrong, why="the end")
            return Step("restore", to_step=self.best_step)
        self.kept_step = step
        self._record(step, losses, "final", versus_best=v, why="the end")
        return Step("final")

    def _record(self, step: int, losses: Sequence[float], action: str, **extra: Any) -> None:
        from leadline.stats import mean_se

        finite = math.isfinite(mean_or_inf(losses)) and len(losses) > 1
        mean, se = mean_se(losses) if finite else (mean_or_inf(losses), math.inf)
        self.records.append({"step": step, "loss": mean, "se": se, "lr": self.rate, "action": action, **extra})


Outcome = Literal["improved", "no_better_than_start", "collapsed"]


def outcome(before: Sequence[float], after: Sequence[float], collapsed: bool = False) -> Outcome:
    """The run's verdict on every held-out row: the kept model against the start; a model that
    improved on it is then judged on its answers (``collapsed``: the race's rule on them).

    Examples:
        >>> outcome([2.0, 2.2], [1.0, 1.1]), outcome([2.0, 2.2], [2.0, 2.2], True), outcome([2.0], [1.0], True)
        ('improved', 'no_better_than_start', 'collapsed')
    """
    if mean_or_inf(after) >= mean_or_inf(before):
        return "no_better_than_start"
    return "collapsed" if collapsed else "improved"


def outcome_sentence(result: Outcome, before: float, after: float) -> str:
    """The one sentence a run that did not improve prints, with what to try.

    Examples:
        >>> outcome_sentence("no_better_than_start", 2.0, 2.3)[:75]
        'the run ended no better than it started on the held-out rows (loss 2.3 agai'
    """
    if result == "collapsed":
        return (f"the kept model answers one answer for most held-out rows (loss {after:.4g}, {before:.4g} before): it "
                "collapsed; the adapter is written but marked in run.json; try a lower --lr, more rows, or "
                "--rows-per-step 32")
    if result == "no_better_than_start":
        return (f"the run ended no better than it started on the held-out rows (loss {after:.4g} against {before:.4g} "
                "before): the start's weights are the result and no adapter was written; try a lower --lr, more "
                "rows or more --epochs")
    return f"the held-out loss fell from {before:.4g} to {after:.4g}"
