"""Read throughput per queue depth, with the page cache bypassed.

Queue depth here is the number of reader threads, each with one large read in flight (what a
loader with N reader threads does): ``os.preadv`` into a page-aligned ``mmap`` buffer releases
the GIL, so the threads really overlap. The cache is bypassed with ``O_DIRECT`` on Linux,
``F_NOCACHE`` on macOS and ``FILE_FLAG_NO_BUFFERING`` on Windows. A buffered number is never
reported as a disk number: when the bypass is refused, or the file lives in memory (tmpfs),
:func:`disk_queue_depth` says so in one sentence instead of measuring the page cache. The
``buffered`` arm exists only to show, beside the real sweep, what the cache would have claimed.

Stdlib only: no torch, no numpy.
"""

from __future__ import annotations

import errno
import glob
import mmap
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from leadline.errors import InputError
from leadline.plan import Value
from leadline.stats import median, paired_difference

DEPTHS = (1, 2, 3, 4, 6, 8, 16, 32)
BLOCK_BYTES = 4 << 20  # one read; a multiple of every sector and page size
BYTES_PER_DEPTH = 256 << 20  # per depth and round
ROUNDS = 3
SPREAD_NOTE = 0.25  # rounds of one depth further apart than 25% of their median: say so
ENOUGH_FRACTION = 0.95  # "enough": the fewest readers within 5% of the best
COLLAPSE_FRACTION = 0.80  # "collapsed": past the optimum, below 80% of it from there on
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs", "rootfs"})
_F_NOCACHE = 48  # macOS <sys/fcntl.h>


@dataclass
class DepthRow:
    """One queue depth: what was read, how long it took, and the per-read latency."""

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
    """(optimum, enough, collapse) depths of a sweep — the rules stated on :class:`DiskSweep`."""
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
    in time, so a drift of the disk hits both); None with fewer than 2 rounds or no gap."""
    first = min(rows, key=lambda r: r.depth)
    row = next(r for r in rows if r.depth == depth)
    if row is first or len(row.mb_per_s_rounds) < 2 or len(row.mb_per_s_rounds) != len(first.mb_per_s_rounds):
        return None
    return paired_difference(row.mb_per_s_rounds, first.mb_per_s_rounds).as_dict()


def filesystem_of(path: str | os.PathLike[str], mounts_text: str | None = None) -> str | None:
    """The filesystem type holding ``path`` (longest mount point of ``/proc/self/mounts``)."""
    if mounts_text is None:
        try:
            mounts_text = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    real = os.path.realpath(path)
    best, fstype = "", None
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best):
            best, fstype = mnt, parts[2]
    return fstype


def bypass_name() -> str:
    """The cache bypass this platform uses."""
    return {"win32": "FILE_FLAG_NO_BUFFERING", "darwin": "F_NOCACHE"}.get(sys.platform, "O_DIRECT")


class _PosixReader:
    """One file descriptor; ``read`` fills an aligned buffer at an aligned offset."""

    def __init__(self, path: str, direct: bool) -> None:
        flags = os.O_RDONLY
        if direct and sys.platform.startswith("linux"):
            flags |= os.O_DIRECT
        self.fd = os.open(path, flags)
        if direct and sys.platform == "darwin":  # pragma: no cover - not this platform
            import fcntl

            fcntl.fcntl(self.fd, _F_NOCACHE, 1)

    def read(self, buf: mmap.mmap, offset: int) -> int:
        if hasattr(os, "preadv"):
            return os.preadv(self.fd, [buf], offset)
        data = os.pread(self.fd, len(buf), offset)  # pragma: no cover - macOS < 11
        buf[: len(data)] = data
        return len(data)

    def close(self) -> None:
        os.close(self.fd)


class _WindowsReader:  # pragma: no cover - exercised on Windows only
    """CreateFileW with FILE_FLAG_NO_BUFFERING; ReadFile at an offset given by an OVERLAPPED."""

    def __init__(self, path: str, direct: bool) -> None:
        import ctypes
        from ctypes import wintypes

        self._ct = ctypes
        k32 = ctypes.WinDLL("kernel32", use_last_error=True)
        k32.CreateFileW.restype = wintypes.HANDLE
        k32.CreateFileW.argtypes = [wintypes.LPCWSTR, wintypes.DWORD, wintypes.DWORD, wintypes.LPVOID, wintypes.DWORD,
                                    wintypes.DWORD, wintypes.HANDLE]
        k32.ReadFile.argtypes = [wintypes.HANDLE, wintypes.LPVOID, wintypes.DWORD, ctypes.POINTER(wintypes.DWORD),
                                 wintypes.LPVOID]
        k32.CloseHandle.argtypes = [wintypes.HANDLE]
        flags = 0x20000000 if direct else 0x80  # FILE_FLAG_NO_BUFFERING / FILE_ATTRIBUTE_NORMAL
        h = k32.CreateFileW(path, 0x80000000, 0x1, None, 3, flags, None)  # GENERIC_READ, FILE_SHARE_READ, OPEN_EXISTING
        if h is None or h == ctypes.c_void_p(-1).value:
            raise ctypes.WinError(ctypes.get_last_error())
        self.k32, self.h = k32, h

        class Overlapped(ctypes.Structure):
            _fields_ = [("Internal", ctypes.c_void_p), ("InternalHigh", ctypes.c_void_p), ("Offset", wintypes.DWORD),
                        ("OffsetHigh", wintypes.DWORD), ("hEvent", wintypes.HANDLE)]

        self._ov, self._dword = Overlapped, wintypes.DWORD

    def read(self, buf: mmap.mmap, offset: int) -> int:
        ct = self._ct
        ov = self._ov()
        ov.Offset, ov.OffsetHigh = offset & 0xFFFFFFFF, offset >> 32
        got = self._dword(0)
        target = (ct.c_char * len(buf)).from_buffer(buf)
        if not self.k32.ReadFile(self.h, target, len(buf), ct.byref(got), ct.byref(ov)):
            raise ct.WinError(ct.get_last_error())
        return int(got.value)

    def close(self) -> None:
        self.k32.CloseHandle(self.h)


def _reader(path: str, direct: bool) -> _PosixReader | _WindowsReader:
    return _WindowsReader(path, direct) if sys.platform == "win32" else _PosixReader(path, direct)


def _expand(files: Sequence[str | os.PathLike[str]] | str | os.PathLike[str]) -> list[Path]:
    items = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    out: list[Path] = []
    for item in items:
        s = str(item)
        if not os.path.exists(s) and any(c in s for c in "*?["):
            matched = sorted(glob.glob(s))
            if not matched:
                raise InputError(f"no file matches {s}; pass files on the disk you want measured (e.g. "
                                 "'models/*.safetensors')")
            out.extend(Path(m) for m in matched)
            continue
        p = Path(s)
        if p.is_dir():
            out.extend(sorted(q for q in p.iterdir() if q.is_file()))
        elif p.is_file():
            out.append(p)
        else:
            raise InputError(f"disk file {p} does not exist; pass files on the disk you want measured (e.g. a model's "
                             ".safetensors)")
    if not out:
        raise InputError("no files to read; pass files on the disk you want measured (e.g. a model's .safetensors)")
    return out


def _check_bypass(paths: list[Path], block_bytes: int) -> None:
    """Refuse, in one sentence, a file the cache cannot be bypassed for."""
    name = bypass_name()
    for p in paths:
        fs = filesystem_of(p) if sys.platform.startswith("linux") else None
        if fs in MEMORY_FILESYSTEMS:
            raise InputError(f"{p} lives on {fs}, which is memory, not a disk, so any number read from it would be a "
                             "page-cache number; put the file on the disk you want measured")
    buf = mmap.mmap(-1, block_bytes)
    try:
        r = _reader(str(paths[0]), direct=True)
        try:
            r.read(buf, 0)
        finally:
            r.close()
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP) or sys.platform == "win32":
            raise InputError(f"{paths[0]} is on a filesystem that refuses {name} ({e.strerror}), so the page cache "
                             "cannot be bypassed and leadline will not report a buffered number as a disk number; put "
                             "the file on the disk you want measured") from None
        raise InputError(f"cannot read {paths[0]} ({e.strerror}); pass a readable file") from None
    finally:
        buf.close()


def _close(readers: list[list[_PosixReader | _WindowsReader]], buffers: list[mmap.mmap]) -> None:
    for rs in readers:
        for r in rs:
            r.close()
    for b in buffers:
        b.close()


def _run_depth(paths: list[Path], blocks: list[tuple[int, int]], start: int, reads: int, depth: int, block_bytes: int,
               direct: bool) -> tuple[float, list[float]]:
    """``depth`` threads take the next block from a shared counter until ``reads`` are done."""
    readers: list[list[_PosixReader | _WindowsReader]] = []
    buffers: list[mmap.mmap] = []
    try:
        for _ in range(depth):  # every reader its own handles: Windows serialises I/O on one handle
            readers.append([])
            for p in paths:
                readers[-1].append(_reader(str(p), direct))
            buffers.append(mmap.mmap(-1, block_bytes))
    except OSError as e:
        _close(readers, buffers)
        raise InputError(f"cannot open {len(paths)} file(s) {depth} times over for depth {depth} ({e.strerror}); pass "
                         "fewer files or lower depths") from None
    lock = threading.Lock()
    counter = [0]
    latencies: list[float] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(depth + 1)

    def work(k: int) -> None:
        mine: list[float] = []
        try:
            barrier.wait()
            while True:
                with lock:
                    i = counter[0]
                    counter[0] += 1
                if i >= reads:
                    break
                f, off = blocks[(start + i) % len(blocks)]
                t0 = time.perf_counter()
                got = readers[k][f].read(buffers[k], off)
                mine.append(time.perf_counter() - t0)
                if got != block_bytes:
                    raise OSError(errno.EIO, f"short read of {got} bytes at {off} in {paths[f]}")
        except BaseException as e:  # recorded and re-raised in the caller
            errors.append(e)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(depth)]
    try:
        for t in threads:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - t0
    finally:
        _close(readers, buffers)
    if errors:
        raise InputError(f"a read failed at queue depth {depth} ({errors[0]}); check the files are readable and not "
                         "being truncated") from None
    return seconds, latencies


def _sweep(paths: list[Path], blocks: list[tuple[int, int]], depths: Sequence[int], block_bytes: int,
           bytes_per_depth: int, rounds: int, direct: bool, progress: Callable[[str], None],
           label: str) -> list[DepthRow]:
    """``rounds`` passes over the depths, ascending then descending in turn, so a drift in the
    disk's speed (another tenant, burst credits running out) shows as a spread between rounds
    instead of as a shape of the curve; each depth reports its median round."""
    runs: dict[int, list[tuple[float, list[float]]]] = {d: [] for d in depths}
    start = 0
    for k in range(rounds):
        for d in depths if k % 2 == 0 else list(reversed(depths)):
            reads = max(2 * d, bytes_per_depth // block_bytes)
            seconds, lat = _run_depth(paths, blocks, start, reads, d, block_bytes, direct)
            start += reads
            runs[d].append((seconds, lat))
            progress(f"{label} round {k + 1}/{rounds} QD{d}: {reads * block_bytes / seconds / 1e6:,.0f} MB/s")
    rows = []
    for d in depths:
        reads = max(2 * d, bytes_per_depth // block_bytes)
        nbytes = reads * block_bytes
        each = [nbytes / sec / 1e6 for sec, _ in runs[d]]
        lat = [x for _, ls in runs[d] for x in ls]
        mid = median(each)
        rows.append(DepthRow(d, reads, nbytes, nbytes / mid / 1e6, mid, median(lat) * 1e3, max(lat) * 1e3, each))
    return rows


def disk_queue_depth(
    files: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    *,
    depths: Sequence[int] = DEPTHS,
    block_bytes: int = BLOCK_BYTES,
    bytes_per_depth: int = BYTES_PER_DEPTH,
    rounds: int = ROUNDS,
    buffered: bool = False,
    on_progress: Callable[[str], None] | None = None,
) -> DiskSweep:
    """Sweep read throughput over ``depths`` with the page cache bypassed.

    Each depth reads ``max(2 x depth, bytes_per_depth / block_bytes)`` whole blocks per round,
    taken in file order from where the previous run stopped (wrapping at the end), so runs
    read different parts of the files. ``rounds`` passes alternate ascending and descending
    order; a depth's figure is its median round, and the rounds are kept as evidence. With
    ``buffered`` the same sweep is repeated through the page cache as a comparison arm
    (``DiskSweep.buffered_rows``).

    Raises:
        InputError: a file is missing, lives in memory (tmpfs) or refuses the bypass; the
            files are too small to give every reader two reads at the deepest depth.
    """
    t0 = time.perf_counter()
    paths = _expand(files)
    depths = sorted({int(d) for d in depths})
    if not depths or depths[0] < 1:
        raise InputError(f"queue depths must be positive integers, got {list(depths)}")
    page = mmap.PAGESIZE
    if block_bytes < page or block_bytes % page:
        raise InputError(f"block_bytes must be a positive multiple of the page size {page} for an unbuffered read, got "
                         f"{block_bytes}")
    blocks = [(i, k * block_bytes) for i, p in enumerate(paths) for k in range(p.stat().st_size // block_bytes)]
    need = 2 * depths[-1]
    if len(blocks) < need:
        have = sum(p.stat().st_size for p in paths)
        raise InputError(f"the files hold {have / 2**20:.1f} MiB, too small to measure: queue depth {depths[-1]} needs "
                         f"{need * block_bytes / 2**20:.1f} MiB (two reads of {block_bytes / 2**20:g} MiB per reader); "
                         "pass larger files, smaller blocks or fewer depths")
    if rounds < 1:
        raise InputError(f"rounds must be at least 1, got {rounds}")
    _check_bypass(paths, block_bytes)
    progress = on_progress or (lambda _m: None)
    rows = _sweep(paths, blocks, depths, block_bytes, bytes_per_depth, rounds, True, progress, bypass_name())
    optimum, enough, collapse = summarise(rows)
    notes = []
    total = len(blocks) * block_bytes
    read = sum(r.bytes for r in rows) * rounds
    if read > total:
        notes.append(f"the sweep read {read / 2**30:.2f} GiB from {total / 2**30:.2f} GiB of files, so some blocks "
                     "were read twice; a drive's own cache may have served them")
    if _in_vm():
        notes.append("this is a virtual machine: the bypass skips this guest's cache, but the host may still cache the "
                     "disk image")
    worst = max(rows, key=lambda r: r.spread)
    if worst.spread > SPREAD_NOTE:
        notes.append(f"the disk's speed moved while it was measured: QD{worst.depth}'s rounds span {worst.spread:.0%} "
                     f"of their median ({', '.join(f'{x:,.0f}' for x in worst.mb_per_s_rounds)} MB/s), so depths "
                     "closer than that are not told apart")
    top = next(r for r in rows if r.depth == optimum)
    gain = gain_over_shallowest(rows, optimum)
    buffered_rows = _sweep(paths, blocks, depths, block_bytes, bytes_per_depth, rounds, False, progress,
                           "buffered") if buffered else None
    files_info = [{"path": str(p), "size_bytes": p.stat().st_size,
                   "filesystem": filesystem_of(p) if sys.platform.startswith("linux") else None} for p in paths]
    return DiskSweep(files_info, bypass_name(), block_bytes, rows, optimum, top.mb_per_s, enough, collapse,
                     buffered_rows, gain, time.perf_counter() - t0, notes=notes)


def _in_vm() -> bool:
    try:
        from leadline.measure.virt import parse_cpuinfo

        return parse_cpuinfo(Path("/proc/cpuinfo").read_text(errors="replace"))
    except OSError:
        return False
