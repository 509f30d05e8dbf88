"""Read throughput per queue depth, with the page cache bypassed.

Queue depth here is the number of reader threads, each with one large read in flight (what a
loader with N reader threads does): ``os.preadv`` into a page-aligned ``mmap`` buffer releases
the GIL, so the threads really overlap. The cache is bypassed with ``O_DIRECT`` on Linux,
``F_NOCACHE`` on macOS and ``FILE_FLAG_NO_BUFFERING`` on Windows. A buffered number is never
reported as a disk number: when the bypass is refused, or the file lives in memory (tmpfs),
:func:`disk_queue_depth` says so in one sentence instead of measuring the page cache. The
``buffered`` arm exists only to show, beside the real sweep, what the cache would have claimed.

Stdlib only: no torch, no numpy.

The pieces live beside this module: :class:`DiskSweep` and the rules on its rows in
:mod:`leadline.measure.disk_report`, the unbuffered readers and the filesystem checks in
:mod:`leadline.measure.disk_readers`; every name stays importable from here.
"""

from __future__ import annotations

import errno
import glob
import mmap
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from leadline.errors import InputError
from leadline.measure.disk_readers import (
    MEMORY_FILESYSTEMS,
    _PosixReader,
    _reader,
    _WindowsReader,
    bypass_name,
    filesystem_of,
)
from leadline.measure.disk_report import (
    COLLAPSE_FRACTION,
    ENOUGH_FRACTION,
    DepthRow,
    DiskSweep,
    gain_over_shallowest,
    summarise,
)
from leadline.stats import median

__all__ = ["BLOCK_BYTES", "BYTES_PER_DEPTH", "COLLAPSE_FRACTION", "DEPTHS", "ENOUGH_FRACTION", "MEMORY_FILESYSTEMS",
           "ROUNDS", "SPREAD_NOTE", "DepthRow", "DiskSweep", "bypass_name", "disk_queue_depth", "filesystem_of",
           "gain_over_shallowest", "summarise"]

DEPTHS = (1, 2, 3, 4, 6, 8, 16, 32)
BLOCK_BYTES = 4 << 20  # one read; a multiple of every sector and page size
BYTES_PER_DEPTH = 256 << 20  # per depth and round
ROUNDS = 3
SPREAD_NOTE = 0.25  # rounds of one depth further apart than 25% of their median: say so


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

    Examples:
        >>> import os, tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     path = os.path.join(folder, "w.bin")
        ...     with open(path, "wb") as f:
        ...         _ = f.write(bytes(1 << 20))
        ...     disk_queue_depth(path)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: the files hold 1.0 MiB, too small to measure: queue depth 32 needs 256.0 MiB ...
        >>> disk_queue_depth("/no/such/file.bin")
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: disk file /no/such/file.bin does not exist; pass files on the disk you want ...
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
