"""What this GPU really delivers, and whether its timings can be trusted.

:func:`measure_gpu` reads the virtualisation (:mod:`leadline.measure.virt`), then measures on
the card: kernel launch latency, host<->device bandwidth pinned and pageable over sizes up to
where it saturates, the cost of one ``torch.cuda.mem_get_info`` call, device-to-device copy
bandwidth and bf16 matmul TFLOP/s, the last two against the card's datasheet
(:data:`DATASHEETS`). :func:`judge` turns those numbers into findings — a vGPU card, launches
over 10 µs, a direction asymmetry over 2x — as shares of a step when a plan's step times are
given. Every timing is the median of synchronized repeats (``leadline.stats.median``).

torch is imported inside the functions, so ``import leadline.measure.gpu`` stays light.

The pieces live beside this module: the thresholds, the datasheets and :func:`judge` in
:mod:`leadline.measure.gpu_judge` (pure), :class:`GpuReport` in :mod:`leadline.measure.gpu_report`,
the timings in :mod:`leadline.measure.gpu_timings`; every name stays importable from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from leadline.errors import InputError, LeadlineError
from leadline.measure.gpu_judge import (
    ASYMMETRY_LIMIT,
    DATASHEET_SHARE_NOTE,
    DATASHEETS,
    LAUNCH_SHARE_LIMIT,
    LAUNCH_US_LIMIT,
    MEM_INFO_SECONDS_LIMIT,
    MEM_INFO_SHARE_LIMIT,
    MIB,
    PCIE_LANE_GB_PER_S,
    Datasheet,
    Finding,
    StepTimes,
    datasheet_for,
    judge,
    step_times_from_plan,
    verdict_of,
)
from leadline.measure.gpu_report import GpuReport, Transfer
from leadline.measure.gpu_timings import _copy_gb_per_s, _launch_us, _matmul_tflops, _mem_get_info, transfer_bandwidth
from leadline.measure.virt import NvidiaSmiGpu, nvidia_smi_reading, virtualisation
from leadline.plan import Plan

__all__ = ["ASYMMETRY_LIMIT", "DATASHEETS", "DATASHEET_SHARE_NOTE", "LAUNCH_SHARE_LIMIT", "LAUNCH_US_LIMIT",
           "MEM_INFO_SECONDS_LIMIT", "MEM_INFO_SHARE_LIMIT", "MIB", "PCIE_LANE_GB_PER_S", "Datasheet", "Finding",
           "GpuReport", "StepTimes", "Transfer", "datasheet_for", "judge", "measure_gpu", "step_times_from_plan",
           "transfer_bandwidth", "verdict_of"]


def _measure(torch: Any, device: Any, *, quick: bool, on_progress: Callable[[str], None]) -> dict[str, Any]:
    """Every timing on ``device``; runs on a CPU too (no pinned arm, no mem_get_info) for tests."""
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    r: dict[str, Any] = {}
    on_progress("launch latency")
    r["launch_us"], r["launch_sync_us"] = _launch_us(torch, device, sync, batches=9 if quick else 25, per_batch=200)
    sizes = (MIB, 8 * MIB, 64 * MIB) if quick else (4 * MIB, 32 * MIB, 256 * MIB, 1024 * MIB)
    if cuda:
        free, _ = torch.cuda.mem_get_info(device)
        sizes = tuple(s for s in sizes if s <= free // 8) or (MIB,)
    else:
        sizes = (MIB, 4 * MIB)  # the CPU path exists to exercise the code, not to measure
    on_progress("host<->device bandwidth")
    r["transfers"] = transfer_bandwidth(device, sizes, repeats=3 if quick else 5, pinned=cuda)
    r["mem_get_info"] = _mem_get_info(torch, device) if cuda else (None, None)
    on_progress("device copy")
    copy_bytes = (256 * MIB if quick else 1024 * MIB) if cuda else 8 * MIB
    if cuda:
        copy_bytes = min(copy_bytes, max(MIB, torch.cuda.mem_get_info(device)[0] // 8))
    r["copy_gb_per_s"] = _copy_gb_per_s(torch, device, sync, copy_bytes, repeats=5 if quick else 10)
    r["copy_bytes"] = copy_bytes
    on_progress("matmul")
    dtype = torch.bfloat16 if (not cuda or torch.cuda.is_bf16_supported()) else torch.float16
    r["matmul_n"] = (4096 if quick else 8192) if cuda else 256
    r["matmul_dtype"] = str(dtype).replace("torch.", "")
    r["matmul_tflops"] = _matmul_tflops(torch, device, sync, r["matmul_n"], dtype, repeats=3 if quick else 7)
    return r


def _smi_card(torch: Any, dev: Any, gpus: list[NvidiaSmiGpu]) -> NvidiaSmiGpu | None:
    """The nvidia-smi block of ``dev``, matched by PCI bus id (CUDA's order can differ from
    nvidia-smi's); the only block when there is one; else None."""
    if dev.type != "cuda" or not gpus:
        return None
    props = torch.cuda.get_device_properties(dev)
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        want = (f"{int(getattr(props, 'pci_domain_id', 0)):08X}:{int(bus):02X}:"
                f"{int(getattr(props, 'pci_device_id', 0)):02X}.0")
        for g in gpus:
            if g.bus_id.upper() == want:
                return g
    return gpus[0] if len(gpus) == 1 else None


def measure_gpu(
    device: Any = None,
    *,
    plan: Plan | None = None,
    launches_per_step: int | None = None,
    quick: bool = False,
    on_progress: Callable[[str], None] | None = None,
    _allow_cpu: bool = False,
) -> GpuReport:
    """Measure the card and judge it (a minute on a data-centre card; ``quick`` for seconds).

    Reads the virtualisation, times launches, transfers, ``mem_get_info``, a device copy and a
    matmul, compares the last two with the card's :func:`datasheet_for`, and hands the numbers
    to :func:`judge`: with ``plan`` (its t_micro, t_step, grad_accum) the launch and
    mem_get_info costs are judged as shares of its step, launches only with
    ``launches_per_step``. ``on_progress`` receives the name of each measurement as it starts.

    Raises:
        LeadlineError: torch is missing, or ``device`` is not a visible CUDA device (the
            virtualisation is still readable through :func:`leadline.measure.virt.virtualisation`).
        InputError: ``launches_per_step`` is not a positive count.

    Examples:
        >>> measure_gpu("cpu")
        Traceback (most recent call last):
        ...
        leadline.errors.LeadlineError: leadline gpu measures a CUDA device and cpu is not one; run it on a machine ...
    """
    t0 = time.perf_counter()
    try:
        import torch
    except ImportError:
        raise LeadlineError("measuring a GPU needs torch; pip install 'leadline[torch]'") from None
    from leadline.measure.machine import describe_machine

    progress = on_progress or (lambda _msg: None)
    dev = torch.device(device or "cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise LeadlineError("no CUDA device is visible to torch here; run leadline gpu on a machine with an NVIDIA GPU "
                            "and a CUDA build of torch")
    if dev.type != "cuda" and not _allow_cpu:
        raise LeadlineError(f"leadline gpu measures a CUDA device and {dev} is not one; run it on a machine with an "
                            "NVIDIA GPU and a CUDA build of torch")
    if launches_per_step is not None and launches_per_step <= 0:
        raise InputError(f"launches_per_step must be a positive count, got {launches_per_step}")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    progress("virtualisation")
    virt = virtualisation()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    card = _smi_card(torch, dev, virt.gpus)
    r = _measure(torch, dev, quick=quick, on_progress=progress)
    sheet = datasheet_for(name)
    transfers: list[Transfer] = r["transfers"]

    def best(direction: str, memory: str) -> float | None:
        return next((t.best_gb_per_s for t in transfers if t.direction == direction and t.memory == memory), None)

    arm = "pinned" if best("h2d", "pinned") else "pageable"
    gains = [p / q for p, q in ((best(d, "pinned"), best(d, "pageable")) for d in ("h2d", "d2h")) if p and q]
    step = step_times_from_plan(plan) if plan is not None else None
    mem_s, mem_max = r["mem_get_info"]
    findings = judge(
        shared_card=virt.shared_card if card is None else nvidia_smi_reading(card)[0],
        launch_us=r["launch_us"],
        h2d_gb_per_s=best("h2d", arm),
        d2h_gb_per_s=best("d2h", arm),
        mem_get_info_seconds=mem_s,
        step=step,
        launches_per_step=launches_per_step,
        matmul_share_of_datasheet=r["matmul_tflops"] / sheet.bf16_dense_tflops if sheet
        and r["matmul_dtype"] == "bfloat16" else None,
        copy_share_of_datasheet=r["copy_gb_per_s"] / (sheet.memory_tb_per_s * 1000) if sheet else None,
        pinning_gain=max(gains) if gains else None,
    )
    ok, sentence = verdict_of(findings)
    link = None
    if card is not None and card.pcie_generation_max and card.pcie_width_max:
        link = PCIE_LANE_GB_PER_S.get(card.pcie_generation_max, 0.0) * card.pcie_width_max or None
    return GpuReport(
        device=str(dev), device_name=name, virtualisation=virt,
        launch_us=r["launch_us"], launch_sync_us=r["launch_sync_us"], transfers=transfers,
        mem_get_info_seconds=mem_s, mem_get_info_max_seconds=mem_max,
        copy_gb_per_s=r["copy_gb_per_s"], copy_bytes=r["copy_bytes"], matmul_tflops=r["matmul_tflops"],
        matmul_n=r["matmul_n"],
        matmul_dtype=r["matmul_dtype"], datasheet=sheet, pcie_link_gb_per_s=link, step=step,
        findings=findings, trustworthy=ok, verdict=sentence,
        seconds=time.perf_counter() - t0, machine=describe_machine(dev),
    )
