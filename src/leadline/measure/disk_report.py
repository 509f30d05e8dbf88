"""The disk sweep's result and its rules: :class:`DepthRow` (one queue depth), :class:`DiskSweep`
(the sweep, with the text a person reads and the values a plan takes), and the pure rules on a
sweep's rows: :func:`summarise` (the optimum, enough and collapse depths) and
:func:`gain_over_shallowest` (the optimum against the shallowest depth, paired by round). Stdlib only.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from leadline.errors import InputError
from leadline.plan import Value
from leadline.stats import paired_difference

ENOUGH_FRACTION = 0.95  # "enough": the fewest readers within 5% of the best
COLLAPSE_FRACTION = 0.80  # "collapsed": past the optimum, below 80% of it from there on


@dataclass
class DepthRow:
    """One queue depth: what was read, how long it took, and the per-read latency.

    Examples:
        >>> r = DepthRow(3, 64, 64 << 22, 0.158, 1703.0, 8.6, 27.8, [1650.0, 1703.0, 1720.0])
        >>> round(r.spread, 4)  # (1720 - 1650) / 1703
        0.0411
    """

    depth: int
    reads: int  # per round
    bytes: int  # per round
    seconds: float  # the median round's
    mb_per_s: float  # 10^6 bytes per second; the median over rounds
    read_ms_median: float
    read_ms_max: float
    mb_per_s_rounds: list[float] = field(default_factory=list)

    @property
    def spread(self) -> float:
        """(max - min) / median of the rounds: how far this depth moved while measured."""
        r = self.mb_per_s_rounds
        return (max(r) - min(r)) / self.mb_per_s if len(r) > 1 and self.mb_per_s > 0 else 0.0


@dataclass
class DiskSweep:
    """The sweep: one row per depth, the optimum, where more readers stop helping or hurt.

    Attributes:
        bypass: how the cache was bypassed (``O_DIRECT``, ``F_NOCACHE``, ``FILE_FLAG_NO_BUFFERING``).
        rows: the cache-bypassed rows (the disk's numbers).
        optimum_depth / optimum_mb_per_s: the fastest depth.
        enough_depth: the fewest readers within ``ENOUGH_FRACTION`` of the optimum.
        collapse_depth: past the optimum, the first depth from which every deeper one stays
            below ``COLLAPSE_FRACTION`` of it (a dip that recovers is not a collapse; None: no
            collapse up to the deepest depth measured).
        buffered_rows: the comparison arm through the page cache (not the disk), if asked.
        gain_over_qd1: the optimum's MB/s minus the shallowest depth's, paired by round
            (``leadline.stats.paired_difference``: mean, 95% CI, p-values), with 2+ rounds.

    Examples:
        >>> def row(depth, rounds):  # 64 reads of 4 MiB per round; the median round is the figure
        ...     return DepthRow(depth, 64, 64 << 22, 0.16, sorted(rounds)[1], 2.0 * depth, 5.0 * depth, rounds)
        >>> rows = [row(1, [990.0, 1017.0, 1040.0]), row(2, [1600.0, 1655.0, 1700.0]),
        ...         row(3, [1650.0, 1703.0, 1720.0]), row(8, [1000.0, 1035.0, 1090.0])]
        >>> optimum, enough, collapse = summarise(rows)
        >>> files = [{"path": "w.bin", "size_bytes": 2**31, "filesystem": "ext4"}]
        >>> sweep = DiskSweep(files, "O_DIRECT", 4 << 20, rows, optimum, 1703.0, enough, collapse,
        ...                   gain_over_qd1=gain_over_shallowest(rows, optimum))
        >>> print(sweep.text())
        leadline disk: 1 file, 2.00 GiB on ext4, O_DIRECT, 4 MiB reads, one reader thread per queue slot, ...
        depth     MB/s  vs QD1  rounds min-max  read ms median/max
          QD1    1,017   1.00x       990-1,040       2.0 /     5.0
          QD2    1,655   1.63x     1,600-1,700       4.0 /    10.0
          QD3    1,703   1.67x     1,650-1,720       6.0 /    15.0 <- optimum
          QD8    1,035   1.02x     1,000-1,090      16.0 /    40.0 <- collapsed
        optimum: QD3 at 1,703 MB/s; QD2 is the fewest readers within 5% of it; from QD8 on, throughput stays ...
        QD3 against QD1, paired by round: +675 MB/s (95% CI +642 to +709, 3 rounds): a real gain.
        >>> {k: v.value for k, v in sweep.as_values().items()}
        {'disk_read_mb_per_s': 1703.0, 'disk_queue_depth': 3}
    """

    files: list[dict[str, Any]]
    bypass: str
    block_bytes: int
    rows: list[DepthRow]
    optimum_depth: int
    optimum_mb_per_s: float
    enough_depth: int
    collapse_depth: int | None
    buffered_rows: list[DepthRow] | None = None
    gain_over_qd1: dict[str, float] | None = None
    seconds: float = 0.0
    platform: str = field(default_factory=platform.platform)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON-ready data (``leadline disk --json``)."""
        return asdict(self)

    def text(self) -> str:
        """The table per depth, the optimum, the collapse, the buffered arm beside it."""
        size = sum(f["size_bytes"] for f in self.files)
        fss = sorted({str(f["filesystem"]) for f in self.files if f["filesystem"]})
        where = f" on {', '.join(fss)}" if fss else ""
        n = len(self.files)
        lines = [f"leadline disk: {n} file{'s' if n > 1 else ''}, {size / 2**30:.2f} GiB{where}, {self.bypass}, "
                 f"{self.block_bytes / 2**20:g} MiB reads, one reader thread per queue slot"]
        buf = {r.depth: r for r in self.buffered_rows or []}
        rounds = max(len(r.mb_per_s_rounds) for r in self.rows)
        lines[0] += f", median of {rounds} round{'s' if rounds > 1 else ''}"
        head = f"{'depth':>5} {'MB/s':>8} {'vs QD1':>7} {'rounds min-max':>15} {'read ms median/max':>19}"
        lines.append(head + (f" {'buffered MB/s (page cache, not the disk)':>42}" if buf else ""))
        q1 = self.rows[0].mb_per_s
        for r in self.rows:
            mark = (" <- optimum" if r.depth == self.optimum_depth else " <- collapsed"
                    if r.depth == self.collapse_depth else "")
            lo, hi = (min(r.mb_per_s_rounds), max(r.mb_per_s_rounds)) if r.mb_per_s_rounds else (r.mb_per_s, r.mb_per_s)
            line = (f"{'QD' + str(r.depth):>5} {r.mb_per_s:8,.0f} {r.mb_per_s / q1:6.2f}x {f'{lo:,.0f}-{hi:,.0f}':>15} "
                    f"{r.read_ms_median:9.1f} /{r.read_ms_max:8.1f}")
            if buf:
                line += f" {buf[r.depth].mb_per_s:42,.0f}"
            lines.append(line + mark)
        coll = (f"from QD{self.collapse_depth} on, throughput stays below {COLLAPSE_FRACTION:.0%} of it (collapsed)"
                if self.collapse_depth else f"up to QD{self.rows[-1].depth} it does not stay below "
                                            f"{COLLAPSE_FRACTION:.0%} of it (no collapse)")
        lines.append(f"optimum: QD{self.optimum_depth} at {self.optimum_mb_per_s:,.0f} MB/s; QD{self.enough_depth} is "
                     f"the fewest readers within {1 - ENOUGH_FRACTION:.0%} of it; {coll}.")
        g = self.gain_over_qd1
        if g is not None:
            verdict = "a real gain" if g["ci_low"] > 0 else "not told apart from noise"
            lines.append(f"QD{self.optimum_depth} against QD{self.rows[0].depth}, paired by round: {g['mean']:+,.0f} "
                         f"MB/s (95% CI {g['ci_low']:+,.0f} to {g['ci_high']:+,.0f}, {int(g['n'])} rounds): {verdict}.")
        if buf:
            top = max(r.mb_per_s for r in buf.values())
            lines.append(f"buffered: up to {top:,.0f} MB/s, {top / self.optimum_mb_per_s:.1f}x the disk's optimum — "
                         "that is the page cache, which is why leadline never reports a buffered number as a disk "
                         "number.")
        lines += [f"note: {x}" for x in self.notes]
        return "\n".join(lines)

    def as_values(self) -> dict[str, Value]:
        """The disk's figures as plan values; the buffered arm is never one of them."""
        ev = {"bypass": self.bypass, "block_bytes": self.block_bytes, "rows": [asdict(r) for r in self.rows],
              "enough_depth": self.enough_depth, "collapse_depth": self.collapse_depth,
              "gain_over_qd1": self.gain_over_qd1}
        src = (f"{self.bypass} reads of {self.block_bytes >> 20} MiB, depths "
               f"{', '.join(str(r.depth) for r in self.rows)}")
        return {
            "disk_read_mb_per_s": Value(self.optimum_mb_per_s, "measured", f"the fastest depth of a sweep of {src}", ev,
                                        self.seconds, unit="MB/s"),
            "disk_queue_depth": Value(self.optimum_depth, "measured",
                                      f"the depth with the highest throughput in a sweep of {src}", ev, self.seconds),
        }


def summarise(rows: Sequence[DepthRow]) -> tuple[int, int, int | None]:
    """(optimum, enough, collapse) depths of a sweep — the rules stated on :class:`DiskSweep`.

    Examples:
        >>> mb_per_s = {1: 1017, 2: 1655, 3: 1703, 4: 1535, 6: 1270, 8: 1035}  # a dip below 80% from QD6 on
        >>> summarise([DepthRow(d, 64, 64 << 22, 0.2, x, 2.0, 5.0) for d, x in mb_per_s.items()])
        (3, 2, 6)
        >>> summarise([])
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: a disk sweep needs at least one depth
    """
    if not rows:
        raise InputError("a disk sweep needs at least one depth")
    ordered = sorted(rows, key=lambda r: r.depth)
    best = max(ordered, key=lambda r: r.mb_per_s)
    enough = next(r.depth for r in ordered if r.mb_per_s >= ENOUGH_FRACTION * best.mb_per_s)
    past = [r for r in ordered if r.depth > best.depth]
    low = [r.mb_per_s < COLLAPSE_FRACTION * best.mb_per_s for r in past]
    collapse = next((r.depth for i, r in enumerate(past) if all(low[i:])), None)
    return best.depth, enough, collapse


def gain_over_shallowest(rows: Sequence[DepthRow], depth: int) -> dict[str, float] | None:
    """``depth``'s MB/s minus the shallowest depth's, paired round by round (rounds run close
    in time, so a drift of the disk hits both); None with fewer than 2 rounds or no gap.

    Examples:
        >>> def row(depth, rounds):  # 64 reads of 4 MiB per round; the median round is the figure
        ...     return DepthRow(depth, 64, 64 << 22, 0.16, sorted(rounds)[1], 2.0 * depth, 5.0 * depth, rounds)
        >>> rows = [row(1, [990.0, 1017.0, 1040.0]), row(2, [1600.0, 1655.0, 1700.0]),
        ...         row(3, [1650.0, 1703.0, 1720.0]), row(8, [1000.0, 1035.0, 1090.0])]
        >>> g = gain_over_shallowest(rows, 3)  # per round: +660, +686, +680
        >>> round(g["mean"], 1), round(g["ci_low"]), round(g["ci_high"]), g["n"]
        (675.3, 642, 709, 3)
        >>> gain_over_shallowest(rows, 1) is None
        True
    """
    first = min(rows, key=lambda r: r.depth)
    row = next(r for r in rows if r.depth == depth)
    if row is first or len(row.mb_per_s_rounds) < 2 or len(row.mb_per_s_rounds) != len(first.mb_per_s_rounds):
        return None
    return paired_difference(row.mb_per_s_rounds, first.mb_per_s_rounds).as_dict()
