"""The pass kept: a run of several passes over its rows is read on the held-out rows at the end
of each pass, and ends at the pass the rows favour.

A constant-rate run that passes over the same rows again can learn them by heart: its training
loss keeps falling while its held-out loss turns up. Schedule-free AdamW's averaged weights are
the model at every step, so each pass's end is a finished model that can be read and kept at the
cost of one held-out read and one copy of the trained tensors, with no optimizer step replayed.
The rule, fixed before any run:

1. at the end of every pass but the last, the averaged weights are read on the held-out rows;
   the lowest reading so far is the *best* pass, its trained tensors kept (a copy);
2. a pass whose reading is significantly *worse* than the best's (the one-sided paired t at 5%,
   :func:`leadline.rate.compare.compare`) ends the run there: the best pass's weights are the
   model, and the passes left are not run (they are saved, not spent);
3. after the last pass the same test decides between it and the best earlier pass: the last is
   kept unless it is significantly worse.

A run of one pass reads nothing and copies nothing: the rule costs nothing where it cannot act.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from leadline.rate.compare import compare


def pass_ends(rows: int, rows_per_step: int, steps: int, start: int = 0) -> list[int]:
    """The steps after which a pass over ``rows`` ends, after ``start`` and at least half a pass
    before the run's last step (the run's end is read apart; a pass end closer to it would read
    nearly the same weights twice).

    Examples:
        >>> pass_ends(800, 16, 150)
        [50, 100]
        >>> pass_ends(810, 16, 150)   # 810 rows end a pass in the middle of step 51: read after it
        [51, 102]
        >>> pass_ends(800, 16, 50), pass_ends(800, 16, 150, start=60), pass_ends(800, 16, 120)
        ([], [100], [50])
    """
    ends, k, half = [], 1, rows / rows_per_step / 2
    while (end := math.ceil(k * rows / rows_per_step)) < steps - half:
        if end > start:
            ends.append(end)
        k += 1
    return ends


@dataclass
class PassRule:
    """The rule's state: every reading (its step and held-out mean) and the best so far.

    Examples:
        A run that learns its rows by heart: the second pass reads significantly worse, the run
        stops there and keeps the first pass:

        >>> rule = PassRule()
        >>> rule.after_pass(50, [1.0, 1.2, 0.9, 1.1])
        'best'
        >>> rule.after_pass(100, [1.3, 1.5, 1.2, 1.4])
        'stop'
        >>> rule.kept_step
        50
        >>> rule.sentence(150)
        'the pass ending at step 50 kept: the next read significantly worse on the held-out rows, so the run...'

        A run still learning keeps its last pass:

        >>> rule = PassRule()
        >>> rule.after_pass(50, [1.0, 1.2, 0.9, 1.1]), rule.after_pass(100, [0.9, 1.1, 0.8, 1.0])
        ('best', 'best')
        >>> rule.at_end(150, [0.85, 1.05, 0.75, 0.95]), rule.kept_step
        ('last', 150)
    """

    readings: list[dict[str, Any]] = field(default_factory=list)
    best: list[float] | None = None
    best_step: int | None = None
    kept_step: int | None = None
    stopped_at: int | None = None

    def after_pass(self, step: int, losses: Sequence[float]) -> str:
        """``'best'`` (keep a copy of these weights), ``'go on'``, or ``'stop'`` (restore the best)."""
        if self._worse_than_best(step, losses):
            self.stopped_at, self.kept_step = step, self.best_step
            return "stop"
        if self.best is None or self.readings[-1]["mean"] < math.fsum(self.best) / len(self.best):
            self.best, self.best_step = list(losses), step
            return "best"
        return "go on"

    def at_end(self, step: int, losses: Sequence[float]) -> str:
        """``'last'`` (the run's end is the model) or ``'best'`` (restore the best earlier pass)."""
        if self._worse_than_best(step, losses):
            self.kept_step = self.best_step
            return "best"
        self.kept_step = step
        return "last"

    def _worse_than_best(self, step: int, losses: Sequence[float]) -> bool:
        """The reading recorded, with its test against the best pass where there is one."""
        verdict = compare(losses, self.best) if self.best is not None else None
        self.readings.append({"step": step, "mean": math.fsum(losses) / len(losses),
                              **({"against_best": verdict.as_dict()} if verdict else {})})
        return verdict is not None and verdict.worse

    def sentence(self, steps: int) -> str:
        if self.stopped_at is not None:
            return (f"the pass ending at step {self.kept_step} kept: the next read significantly worse on the "
                    f"held-out rows, so the run stopped at step {self.stopped_at} of {steps}")
        if self.kept_step is not None and self.kept_step < steps:
            return (f"the pass ending at step {self.kept_step} kept: the run's end read significantly worse on "
                    "the held-out rows")
        return (f"the run's end kept: no pass read significantly better on the held-out rows "
                f"({len(self.readings)} reads)")

    def as_dict(self) -> dict[str, Any]:
        return {"readings": self.readings, "kept_step": self.kept_step, "stopped_at": self.stopped_at}
