"""The timings behind :func:`leadline.measure.gpu.measure_gpu`, each on the device: kernel launch
latency, host<->device bandwidth pinned and pageable (:func:`transfer_bandwidth`), the cost of one
``torch.cuda.mem_get_info`` call, device-to-device copy bandwidth and matmul TFLOP/s. Every timing
is the median of synchronized repeats; torch is passed in, or imported inside
:func:`transfer_bandwidth`, so importing this module loads no torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from leadline.measure.gpu_judge import MIB
from leadline.measure.gpu_report import Transfer
from leadline.stats import median


def _timed(fn: Callable[[], Any], sync: Callable[[], None], repeats: int, warmup: int = 1) -> list[float]:
    """Wall seconds of ``fn`` between synchronizations, ``repeats`` times after ``warmup``."""
    for _ in range(warmup):
        fn()
    sync()
    out = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return out


def _launch_us(torch: Any, device: Any, sync: Callable[[], None], batches: int, per_batch: int) -> tuple[float, float]:
    x = torch.zeros(1, device=device)

    def burst() -> None:
        for _ in range(per_batch):
            x.add_(1.0)

    per_launch = [s / per_batch * 1e6 for s in _timed(burst, sync, batches)]
    one = [s * 1e6 for s in _timed(lambda: x.add_(1.0), sync, batches * 4)]
    return median(per_launch), median(one)


def transfer_bandwidth(device: Any = None, sizes_bytes: tuple[int, ...] = (4 * MIB, 32 * MIB, 256 * MIB, 1024 * MIB),
                       repeats: int = 5, pinned: bool = True) -> list[Transfer]:
    """H2D and D2H GB/s (10^9 bytes/s) for pageable and, with ``pinned``, pinned host memory.

    A size's figure is ``bytes / median seconds`` over ``repeats`` synchronized copies of a
    uint8 tensor; a :class:`Transfer`'s best is the fastest size, and it is ``saturated`` when
    its two largest sizes lie within 10% of each other (a single size counts as saturated).
    ``device`` defaults to ``"cuda"``; a CPU device runs the same code (no pinned arm there).

    Examples:
        >>> out = transfer_bandwidth("cpu", (MIB,), repeats=1, pinned=False)
        >>> [(t.direction, t.memory, [r["bytes"] for r in t.sizes], t.saturated) for t in out]
        [('h2d', 'pageable', [1048576], True), ('d2h', 'pageable', [1048576], True)]
        >>> all(t.best_gb_per_s == t.sizes[0]["gb_per_s"] > 0 for t in out)
        True
    """
    import torch

    device = torch.device(device or "cuda")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = []
    for memory in (["pinned"] if pinned else []) + ["pageable"]:
        for direction in ("h2d", "d2h"):
            rows = []
            for n in sizes_bytes:
                host = torch.ones(n, dtype=torch.uint8, pin_memory=memory == "pinned")
                dev = torch.ones(n, dtype=torch.uint8, device=device)
                nb = memory == "pinned"
                fn = ((lambda d=dev, h=host, nb=nb: d.copy_(h, non_blocking=nb)) if direction == "h2d"
                      else (lambda d=dev, h=host, nb=nb: h.copy_(d, non_blocking=nb)))
                s = median(_timed(fn, sync, repeats))
                rows.append({"bytes": n, "seconds": s, "gb_per_s": n / s / 1e9})
                del host, dev
            best = max(r["gb_per_s"] for r in rows)
            sat = (len(rows) < 2
                   or abs(rows[-1]["gb_per_s"] - rows[-2]["gb_per_s"]) <= 0.1 * max(rows[-1]["gb_per_s"],
                                                                                    rows[-2]["gb_per_s"]))
            out.append(Transfer(direction, memory, rows, best, sat))
    return out


def _mem_get_info(torch: Any, device: Any, budget_seconds: float = 3.0, calls: int = 20) -> tuple[float, float]:
    torch.cuda.mem_get_info(device)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < calls and (len(times) < 3 or time.perf_counter() - start < budget_seconds):
        t0 = time.perf_counter()
        torch.cuda.mem_get_info(device)
        times.append(time.perf_counter() - t0)
    return median(times), max(times)


def _copy_gb_per_s(torch: Any, device: Any, sync: Callable[[], None], nbytes: int, repeats: int) -> float:
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    s = median(_timed(lambda: dst.copy_(src), sync, repeats))
    return 2 * nbytes / s / 1e9  # a copy reads and writes every byte


def _matmul_tflops(torch: Any, device: Any, sync: Callable[[], None], n: int, dtype: Any, repeats: int,
                   per_batch: int = 10) -> float:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)

    def batch() -> None:
        for _ in range(per_batch):
            torch.mm(a, b, out=c)

    s = median(_timed(batch, sync, repeats, warmup=2))
    return 2.0 * n**3 * per_batch / s / 1e12
