"""The ramp's decisions as pure functions on numbers: no torch, no device, tested exactly.

On CUDA (:class:`RampSearch`): the allocator decides. A rung *fits* when its step ran without
the allocator emptying its cache and retrying; it *squeezed* in when ``num_alloc_retries``
grew (it ran only because the cache was emptied, which every later step would pay again, and
a fragmented cache turns into an OOM); it is *oom* when the allocator refused. Rows double
from ``start_rows`` until a rung does not fit or ``max_rows`` is reached, then bisect between
the largest rows that fit and the smallest that did not, to one row. The candidate must then
pass the confirmation (the driver runs it at least twice in a row without emptying the cache,
then, from an emptied cache, through the corpus's length mix, longest first, with the full
length after each of the mix's lengths: :func:`~leadline.memory.probe.confirmation_lengths`); a
candidate that fails
any of its steps becomes the new upper end and the search goes on below it, down to a
candidate that passes all of them.

Off CUDA (:class:`ThroughputSearch`): nothing refuses a batch, so the rule is speed. Rows
double from 1; each rung measures rows per second = rows / t_micro (the median of synchronized
forward+backward repeats). The ramp stops at the first doubling whose rows per second gain
less than ``min_gain`` (5%) over the rung before and keeps the smaller rung; it also stops
before a rung whose peak, extrapolated on the line through the last two rungs' measured peaks
(or from the baseline and one rung), would exceed the RAM room, and at ``max_rows``.

A rung's verdict (:func:`~leadline.memory.probe.verdict_of`) and the rules on shapes the fit
pre-flight shares with the ramp are in :mod:`leadline.memory.probe`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from leadline.memory_readings import format_bytes
from leadline.stats import median, t_quantile

RampStop = Literal["", "no_row_fits", "hurried", "upper_limit", "did_not_fit", "no_gain", "out_of_room",
                   "out_of_memory"]
"""Why a ramp stopped ("" while it runs): not even its first rows fit, cut short (``max_seconds``)
keeping the most that fitted, at its upper limit of rows, at the least rows that did not fit,
rows per second stopped improving, a step peaked (or would peak) over the room, the host ran out
of memory. ``stopped_because`` is the sentence shown for it."""


@dataclass
class RampSearch:
    """Doubling, then bisection, then confirmation; see the module docstring.

    Drive it with ``while (move := s.next()) is not None: kind, rows = move; ...;
    s.record(kind, rows, ok)`` where kind is ``"try"`` (one step at ``rows``) or ``"confirm"``
    (the confirmation run at ``rows``) and ``ok`` is True when every step of it fit.
    ``kept`` is the answer once ``next()`` returns None (0: not even the smallest rows fit).

    Examples:
        A card where 5 rows fit and 6 do not: rows double to the first miss, bisect, confirm.

        >>> s, moves = RampSearch(max_rows=64), []
        >>> while (move := s.next()) is not None:
        ...     kind, rows = move
        ...     moves.append(move)
        ...     s.record(kind, rows, rows <= 5)
        >>> moves
        [('try', 1), ('try', 2), ('try', 4), ('try', 8), ('try', 6), ('try', 5), ('confirm', 5)]
        >>> s.kept, s.stop, s.stopped_because
        (5, 'did_not_fit', '6 rows did not fit')

        A failed confirmation becomes the upper end; the rung below is confirmed instead.

        >>> s = RampSearch(max_rows=64)
        >>> while (move := s.next()) is not None:
        ...     kind, rows = move
        ...     s.record(kind, rows, rows <= (5 if kind == "try" else 4))
        >>> s.kept, s.failed_confirmation
        (4, [5])
    """

    max_rows: int | None = None
    start_rows: int = 1
    lo: int = 0
    hi: int | None = None
    kept: int | None = None
    fits: list[int] = field(default_factory=list)
    failed_confirmation: list[int] = field(default_factory=list)
    stopped_because: str = ""
    stop: RampStop = ""
    hurried: str = ""
    """Why the search was told to stop (:meth:`hurry`); empty while it searches freely."""

    def hurry(self, reason: str) -> None:
        """Stop searching: confirm the most rows a try fitted so far (after a failed
        confirmation, the next below it) instead of bisecting on. Before any try fitted it has
        nothing to confirm and goes on until one does."""
        self.hurried = reason
        if self.lo > 0 and self.kept is None:
            self.hi = self.lo + 1

    def __post_init__(self) -> None:
        if self.start_rows < 1:
            raise ValueError(f"start_rows must be >= 1, got {self.start_rows}")
        if self.max_rows is not None and self.max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {self.max_rows}")

    def _capped(self, rows: int) -> int:
        return rows if self.max_rows is None else min(rows, self.max_rows)

    def next(self) -> tuple[str, int] | None:
        if self.kept is not None:
            return None
        if self.hi is None:
            if self.lo == 0:
                return ("try", self._capped(self.start_rows))
            if self.max_rows is not None and self.lo >= self.max_rows:
                return ("confirm", self.lo)
            return ("try", self._capped(2 * self.lo))
        if self.hi - self.lo > 1:
            return ("try", (self.lo + self.hi) // 2)
        if self.lo == 0:
            self.kept = 0
            self.stop = "no_row_fits"
            self.stopped_because = f"not even {self.hi} row{'s' if self.hi != 1 else ''} fit"
            return None
        return ("confirm", self.lo)

    def record(self, kind: str, rows: int, ok: bool) -> None:
        if kind == "try":
            if ok:
                self.lo = max(self.lo, rows)
                self.fits.append(rows)
            else:
                self.hi = rows if self.hi is None else min(self.hi, rows)
            return
        if kind != "confirm":
            raise ValueError(f"kind must be 'try' or 'confirm', got {kind!r}")
        if ok:
            self.kept = rows
            if self.hurried:
                self.stop = "hurried"
                self.stopped_because = f"{self.hurried}: the most rows a step fitted so far, confirmed"
            elif self.max_rows is not None and rows >= self.max_rows:
                self.stop = "upper_limit"
                self.stopped_because = f"reached the upper limit of {self.max_rows} rows"
            else:
                self.stop = "did_not_fit"
                self.stopped_because = f"{self.hi} rows did not fit"
            return
        self.failed_confirmation.append(rows)
        self.hi = rows
        self.lo = max((r for r in self.fits if r < rows), default=0)
        if self.hurried:
            self.hurry(self.hurried)


def extrapolate_peak(points: Sequence[tuple[int, int]], rows: int, baseline_bytes: int | None = None) -> float:
    """The peak bytes at ``rows`` on the line through the last two measured ``(rows, peak)``
    points, or through ``(0, baseline_bytes)`` and the one point there is.

    With one point and no baseline the peak is taken as proportional to rows (an upper line
    when the peak includes a fixed part). A falling line is read as flat.

    Examples:
        >>> extrapolate_peak([(1, 300), (2, 500)], 4)
        900.0
        >>> extrapolate_peak([(2, 500)], 4, baseline_bytes=100), extrapolate_peak([(2, 500)], 4)
        (900.0, 1000.0)
    """
    if not points:
        raise ValueError("extrapolate_peak needs at least one measured (rows, peak) point")
    if len(points) >= 2 and points[-1][0] != points[-2][0]:
        (r1, p1), (r2, p2) = points[-2], points[-1]
        slope = (p2 - p1) / (r2 - r1)
        return p2 + max(slope, 0.0) * (rows - r2)
    r, p = points[-1]
    base = 0 if baseline_bytes is None else min(baseline_bytes, p)
    return base + (p - base) * rows / r


@dataclass
class ThroughputSearch:
    """The off-CUDA rule: the micro-batch where rows per second stop improving, within RAM.

    Drive it with ``while (rows := s.next()) is not None: ...; s.record(rows,
    rows_per_second, peak_bytes, repeats)``; ``kept`` and ``stopped_because`` once it returns None.

    A doubling is taken only when its gain is more than ``min_gain`` beyond the spread of the
    repeats: with each rung's rows per second per repeat (``repeats``), the one-sided test

        mean(log r2) - mean(log r1) - t(0.95, n1 + n2 - 2) x se  >=  log(1 + min_gain)

    (se the standard error of the difference, from the repeats' own variances; Welch's
    difference with pooled degrees of freedom). When the medians gain ``min_gain`` but the test
    does not pass, both rungs are measured once more (``next()`` asks for them again; their
    repeats pool) and the test is read again; a gain that still does not pass is a tie, and a
    tie keeps the smaller batch. So timings that jitter by a few percent around the threshold
    give the same micro-batch run after run, and a clear gain (tens of percent) still passes.
    Without repeats the medians alone decide.

    Examples:
        A micro-batch costing 10 ms plus 10 ms a row: rows per second = 100 r / (1 + r).

        >>> s = ThroughputSearch()
        >>> while (rows := s.next()) is not None:
        ...     s.record(rows, 100 * rows / (1 + rows), 0)
        >>> s.kept, s.stop
        (16, 'no_gain')
        >>> s.stopped_because
        'doubling 16 -> 32 rows gained +3.0% rows per second, less than 5%'

        With repeats, a 6% gain of the medians inside the repeats' spread is not sure (99%
        one-sided), so both rungs are measured again:

        >>> s = ThroughputSearch()
        >>> s.record(4, 100.0, 0, [98.0, 100.0, 102.0])
        >>> s.record(8, 106.0, 0, [101.0, 106.0, 111.0])
        >>> round(s.sure_gain(4, 8), 3), s.spread(8, 106.0)
        (-0.052, (101.0, 111.0))
        >>> s.next(), s.next()
        (4, 8)
    """

    room_bytes: int | None = None
    max_rows: int | None = None
    min_gain: float = 0.05
    baseline_bytes: int | None = None
    points: list[tuple[int, float, int]] = field(default_factory=list)
    repeats: dict[int, list[float]] = field(default_factory=dict)
    confidence: float = 0.99
    remeasured: set[int] = field(default_factory=set)
    pending: list[int] = field(default_factory=list)
    kept: int | None = None
    stopped_because: str = ""
    stop: RampStop = ""

    def hurry(self, reason: str) -> None:
        """Stop searching: keep the rows with the most rows per second measured so far."""
        if self.kept is None and self.points:
            best = max(self.points, key=lambda p: (p[1], -p[0]))
            low = self.spread(best[0], best[1])[0]  # the fewest rows whose fastest repeat reaches the best's slowest
            self.kept = min(p[0] for p in self.points if self.spread(p[0], p[1])[1] >= low)
            self.stop = "hurried"
            self.stopped_because = f"{reason}: the rows with the most rows per second measured so far"

    def next(self) -> int | None:
        if self.kept is not None:
            return None
        if not self.points:
            return 1
        if self.pending:
            return self.pending.pop(0)
        rows, rps, peak = self.points[-1]
        if len(self.points) >= 2:
            prev_rows, prev_rps, _ = self.points[-2]
            gain = rps / prev_rps - 1.0 if prev_rps > 0 else float("inf")
            sure = self.sure_gain(prev_rows, rows)
            if gain < self.min_gain:
                self.kept = prev_rows
                self.stop = "no_gain"
                self.stopped_because = (
                    f"doubling {prev_rows} -> {rows} rows gained {gain:+.1%} rows per second, "
                    f"less than {self.min_gain:.0%}"
                )
                return None
            if sure < self.min_gain and rows in self.repeats and rows not in self.remeasured:
                self.remeasured.update((prev_rows, rows))  # neither sure nor a loss by the medians: measure both again
                self.pending = [prev_rows, rows]
                return self.pending.pop(0)
            if sure < self.min_gain:
                self.kept = prev_rows
                self.stop = "no_gain"
                self.stopped_because = (
                    f"doubling {prev_rows} -> {rows} rows gained {gain:+.1%} rows per second by the medians, "
                    f"but only {sure:+.1%} at {self.confidence:.0%} confidence over the repeats' spread: "
                    f"not surely more than {self.min_gain:.0%}, a tie, so the smaller is kept"
                )
                return None
        if self.room_bytes is not None and peak > self.room_bytes:
            self.kept = self.points[-2][0] if len(self.points) >= 2 else 0
            self.stop = "out_of_room"
            self.stopped_because = (f"{rows} rows peaked at {format_bytes(peak)}, over the "
                                    f"{format_bytes(self.room_bytes)} of room")
            return None
        if self.max_rows is not None and rows >= self.max_rows:
            self.kept = rows
            self.stop = "upper_limit"
            self.stopped_because = f"reached the upper limit of {self.max_rows} rows"
            return None
        nxt = 2 * rows if self.max_rows is None else min(2 * rows, self.max_rows)
        if self.room_bytes is not None:
            predicted = extrapolate_peak([(r, p) for r, _, p in self.points], nxt, self.baseline_bytes)
            if predicted > self.room_bytes:
                self.kept = rows
                self.stop = "out_of_room"
                self.stopped_because = (
                    f"{nxt} rows would peak near {format_bytes(predicted)} (extrapolated from the rungs "
                    f"measured), over the {format_bytes(self.room_bytes)} of RAM room"
                )
                return None
        return nxt

    def record(self, rows: int, rows_per_second: float, peak_bytes: int, repeats: Sequence[float] = ()) -> None:
        """One rung: its rows per second (the median), its peak, and each repeat's rows per
        second where it ran several (a rung measured again pools its repeats in place)."""
        rows = int(rows)
        known = [i for i, p in enumerate(self.points) if p[0] == rows]
        if known and rows in self.remeasured:  # measured again: the repeats pool, the point keeps its place
            pooled = self.repeats.get(rows, []) + [float(r) for r in repeats if r > 0]
            self.repeats[rows] = pooled
            i = known[-1]
            self.points[i] = (rows, median(pooled) if pooled else float(rows_per_second),
                              max(self.points[i][2], int(peak_bytes)))
            return
        self.points.append((rows, float(rows_per_second), int(peak_bytes)))
        if len(repeats) > 1 and all(r > 0 for r in repeats):
            self.repeats[rows] = [float(r) for r in repeats]

    def spread(self, rows: int, rows_per_second: float) -> tuple[float, float]:
        """The slowest and the fastest repeat's rows per second at ``rows`` (the median twice
        where no repeats were recorded)."""
        xs = self.repeats.get(int(rows))
        return (min(xs), max(xs)) if xs else (rows_per_second, rows_per_second)

    def sure_gain(self, smaller: int, larger: int) -> float:
        """The gain of ``larger`` over ``smaller`` rows at the lower end of its one-sided
        ``confidence`` interval (see the class docstring); the medians' gain without repeats."""
        a, b = self.repeats.get(smaller), self.repeats.get(larger)
        if not a or not b:
            med = {r: rps for r, rps, _ in self.points}
            return med[larger] / med[smaller] - 1.0 if med.get(smaller) else float("inf")
        la, lb = [math.log(x) for x in a], [math.log(x) for x in b]
        ma, mb = sum(la) / len(la), sum(lb) / len(lb)
        va = sum((x - ma) ** 2 for x in la) / (len(la) - 1)
        vb = sum((x - mb) ** 2 for x in lb) / (len(lb) - 1)
        se = math.sqrt(va / len(la) + vb / len(lb))
        return math.exp(mb - ma - t_quantile(self.confidence, len(la) + len(lb) - 2) * se) - 1.0


