"""What this GPU really delivers, and whether its timings can be trusted.

:func:`measure_gpu` reads the virtualisation (:mod:`leadline.measure.virt`), then measures on
the card: kernel launch latency, host<->device bandwidth pinned and pageable over sizes up to
where it saturates, the cost of one ``torch.cuda.mem_get_info`` call, device-to-device copy
bandwidth and bf16 matmul TFLOP/s, the last two against the card's datasheet
(:data:`DATASHEETS`). :func:`judge` turns those numbers into findings — a vGPU card, launches
over 10 µs, a direction asymmetry over 2x — as shares of a step when a plan's step times are
given. Every timing is the median of synchronized repeats (``leadline.stats.median``).

torch is imported inside the functions, so ``import leadline.measure.gpu`` stays light.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from leadline.errors import InputError, LeadlineError
from leadline.measure.virt import NvidiaSmiGpu, Virtualisation, nvidia_smi_reading, virtualisation
from leadline.plan import Plan, Value
from leadline.stats import median

LAUNCH_US_LIMIT = 10.0  # seed 002: 2-5 µs is normal, 14.7 local, 55-85 rented
ASYMMETRY_LIMIT = 2.0  # seed 002: a fabric gave D2H 457 MB/s against H2D 1502 (3.4x)
LAUNCH_SHARE_LIMIT = 0.05  # with a plan: launches worth more than 5% of a step
MEM_INFO_SHARE_LIMIT = 0.01  # the SpillWatch's budget: 1% of a step (SPEC, Memory)
MEM_INFO_SECONDS_LIMIT = 0.01  # without a plan; a local card answers in tens of µs
DATASHEET_SHARE_NOTE = 0.5  # below half the datasheet: throttled, shared or another SKU
MIB = 1 << 20


@dataclass(frozen=True)
class Datasheet:
    """A card's published figures: dense bf16 tensor TFLOP/s and memory bandwidth."""

    name: str
    bf16_dense_tflops: float
    memory_tb_per_s: float
    source: str


# Dense (no 2:4 sparsity) bf16 tensor-core figures; NVIDIA's datasheets print the sparse
# figure, twice these. Sources: the NVIDIA H200 Tensor Core GPU datasheet (H200 SXM: 1,979
# TFLOPS sparse, 4.8 TB/s; H200 NVL: 1,671, 4.8 TB/s); the NVIDIA H100 datasheet (SXM: 1,979,
# 3.35 TB/s; PCIe: 1,513, 2 TB/s; NVL: 1,671, 3.9 TB/s); the NVIDIA A100 datasheet (312 dense;
# 40GB 1,555 GB/s, 80GB PCIe 1,935, 80GB SXM 2,039); the L40S, L4 and A10 datasheets (362,
# 121, 125; 864, 300, 600 GB/s); the RTX A6000 datasheet (309.7 sparse, 768 GB/s); the Ada
# and GA102 whitepapers (RTX 4090 165.2 with FP32 accumulate, 1,008 GB/s; RTX 3090 71, 936).
DATASHEETS: tuple[tuple[str, Datasheet], ...] = tuple(
    (pattern, Datasheet(name, tflops, tbs, src))
    for pattern, name, tflops, tbs, src in (
        (r"\bh200 nvl\b", "H200 NVL", 835.0, 4.8, "NVIDIA H200 datasheet"),
        (r"\bh200\b", "H200 SXM", 989.0, 4.8, "NVIDIA H200 datasheet"),
        (r"\bh100\b.*\bnvl\b", "H100 NVL", 835.0, 3.9, "NVIDIA H100 datasheet"),
        (r"\bh100\b.*\bpcie\b", "H100 PCIe", 756.0, 2.0, "NVIDIA H100 datasheet"),
        (r"\bh100\b", "H100 SXM", 989.0, 3.35, "NVIDIA H100 datasheet"),
        (r"\ba100\b.*80gb.*pcie|\ba100\b.*pcie.*80gb", "A100 80GB PCIe", 312.0, 1.935, "NVIDIA A100 datasheet"),
        (r"\ba100\b.*80gb", "A100 80GB SXM", 312.0, 2.039, "NVIDIA A100 datasheet"),
        (r"\ba100\b", "A100 40GB", 312.0, 1.555, "NVIDIA A100 datasheet"),
        (r"\bl40s\b", "L40S", 362.0, 0.864, "NVIDIA L40S datasheet"),
        (r"\bl4\b", "L4", 121.0, 0.300, "NVIDIA L4 datasheet"),
        (r"\ba10\b", "A10", 125.0, 0.600, "NVIDIA A10 datasheet"),
        (r"\brtx a6000\b", "RTX A6000", 154.8, 0.768, "NVIDIA RTX A6000 datasheet"),
        (r"\brtx 4090\b", "RTX 4090", 165.2, 1.008, "NVIDIA Ada GPU architecture whitepaper"),
        (r"\brtx 3090\b", "RTX 3090", 71.0, 0.936, "NVIDIA GA102 GPU architecture whitepaper"),
    )
)

# PCIe raw rate per lane and direction, GB/s, after line coding (PCI-SIG base specifications).
PCIE_LANE_GB_PER_S = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def _pct(x: float) -> str:
    """A share as a percentage with 3 significant digits (0.0021 -> '0.21%')."""
    return f"{x * 100:.3g}%"


def datasheet_for(device_name: str) -> Datasheet | None:
    """The datasheet entry whose pattern matches ``device_name`` (as torch reports it)."""
    name = re.sub(r"\s+", " ", device_name.lower().replace("-", " "))
    for pattern, sheet in DATASHEETS:
        if re.search(pattern, name):
            return sheet
    return None


@dataclass
class Transfer:
    """One direction and memory kind: GB/s per size and the best (saturated) figure."""

    direction: str  # "h2d" or "d2h"
    memory: str  # "pinned" or "pageable"
    sizes: list[dict[str, float]]  # [{"bytes", "seconds", "gb_per_s"}], seconds a median
    best_gb_per_s: float
    saturated: bool  # the two largest sizes within 10% of each other


@dataclass
class StepTimes:
    """A plan's step: one forward+backward (t_micro), the optimizer update (t_step), grad_accum."""

    t_micro_seconds: float
    t_step_seconds: float
    grad_accum: int

    @property
    def step_seconds(self) -> float:
        """One whole optimizer step: grad_accum micro-batches plus the update."""
        return self.t_micro_seconds * self.grad_accum + self.t_step_seconds


def step_times_from_plan(plan: Plan) -> StepTimes | None:
    """The plan's t_micro / t_step / grad_accum values (``*_seconds`` spellings too), or None."""
    def pick(*names: str) -> float | None:
        for n in names:
            if n in plan and isinstance(plan.get(n), (int, float)):
                return float(plan.get(n))
        return None

    t_micro = pick("t_micro_seconds", "t_micro")
    if t_micro is None or t_micro <= 0:
        return None
    t_step = pick("t_step_seconds", "t_step") or 0.0
    accum = int(pick("grad_accum") or 1)
    return StepTimes(t_micro, t_step, max(1, accum))


@dataclass
class Finding:
    """One thing that would (``lies``) or might make timings here mislead."""

    what: str
    reading: float | str | None
    threshold: float | None
    share_of_step: float | None
    lies: bool
    sentence: str


@dataclass
class GpuReport:
    """Everything :func:`measure_gpu` measured, with its evidence and the verdict."""

    device: str
    device_name: str
    virtualisation: Virtualisation
    launch_us: float  # back-to-back, per kernel
    launch_sync_us: float  # one launch + synchronize
    transfers: list[Transfer]
    mem_get_info_seconds: float | None
    mem_get_info_max_seconds: float | None
    copy_gb_per_s: float  # device-to-device, read + write bytes
    copy_bytes: int
    matmul_tflops: float
    matmul_n: int
    matmul_dtype: str
    datasheet: Datasheet | None
    pcie_link_gb_per_s: float | None
    step: StepTimes | None
    findings: list[Finding] = field(default_factory=list)
    trustworthy: bool = True
    verdict: str = ""
    seconds: float = 0.0
    machine: dict[str, Any] = field(default_factory=dict)

    def transfer(self, direction: str, memory: str) -> Transfer | None:
        return next((t for t in self.transfers if t.direction == direction and t.memory == memory), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        """The report as a person reads it: every figure, its reference, the verdict."""
        sheet = self.datasheet
        lines = [f"leadline gpu: {self.device_name} ({self.device}), datasheet "
                 f"{sheet.name if sheet else 'unknown for this card'}", self.virtualisation.text()]
        lines.append(f"launch latency   {self.launch_us:.2f} µs per kernel back-to-back; {self.launch_sync_us:.1f} µs "
                     "for one launch + synchronize")
        sizes = sorted({int(r['bytes']) for t in self.transfers for r in t.sizes})
        link = (f"; the PCIe link's raw rate is {self.pcie_link_gb_per_s:.1f} GB/s per direction"
                if self.pcie_link_gb_per_s else "")
        lines.append(f"transfers        best GB/s over sizes {sizes[0] / MIB:g}-{sizes[-1] / MIB:g} MiB (median of "
                     f"repeats){link}")
        lines.append(f"{'':17}{'pinned':>9}{'pageable':>10}")
        for d, label in (("h2d", "host->device"), ("d2h", "device->host")):
            cells = []
            for m in ("pinned", "pageable"):
                t = self.transfer(d, m)
                cells.append(f"{t.best_gb_per_s:.2f}{'' if t.saturated else '*'}" if t else "-")
            lines.append(f"  {label:15}{cells[0]:>9}{cells[1]:>10}")
        if any(not t.saturated for t in self.transfers):
            lines.append("  * not saturated: the two largest sizes differ by more than 10%")
        if self.mem_get_info_seconds is not None:
            lines.append(f"mem_get_info     {self.mem_get_info_seconds * 1e3:.3g} ms per call (median; slowest "
                         f"{self.mem_get_info_max_seconds * 1e3:.3g} ms)")
        ref = (f" = {self.copy_gb_per_s / (sheet.memory_tb_per_s * 1000):.0%} of the {sheet.memory_tb_per_s:g} TB/s "
               "datasheet" if sheet else "")
        lines.append(f"device copy      {self.copy_gb_per_s:,.0f} GB/s counting read + write "
                     f"({self.copy_bytes / MIB:g} MiB){ref}")
        ref = (f" = {self.matmul_tflops / sheet.bf16_dense_tflops:.0%} of the {sheet.bf16_dense_tflops:g} TFLOP/s "
               "dense bf16 datasheet" if sheet and self.matmul_dtype == "bfloat16" else "")
        lines.append(f"{self.matmul_dtype + ' matmul':<17}{self.matmul_tflops:,.1f} TFLOP/s ({self.matmul_n}^3){ref}")
        if self.step is not None:
            lines.append(f"judged against the plan's step: {self.step.step_seconds:.3g} s ({self.step.grad_accum} x "
                         f"{self.step.t_micro_seconds:.3g} s micro-batches + {self.step.t_step_seconds:.3g} s update)")
        lines.append(f"verdict: {self.verdict}")
        lines += [f"  {'LIES' if f.lies else 'ok  '} {f.what}: {f.sentence}" for f in self.findings]
        return "\n".join(lines)

    def as_values(self) -> dict[str, Value]:
        """The card's figures as plan values (each measured here, its evidence attached)."""
        ev = {"device_name": self.device_name, "verdict": self.verdict}
        out = {
            "gpu_launch_us": Value(self.launch_us, "measured", "median per-kernel time of back-to-back tiny kernels",
                                   ev, unit="µs"),
            "gpu_matmul_tflops": Value(self.matmul_tflops, "measured",
                                       f"median of {self.matmul_dtype} {self.matmul_n}³ matmuls",
                                       {**ev, "datasheet": asdict(self.datasheet) if self.datasheet else None},
                                       unit="TFLOP/s"),
            "gpu_copy_gb_per_s": Value(self.copy_gb_per_s, "measured",
                                       "device-to-device copy, read plus write bytes over the median time", ev,
                                       unit="GB/s"),
        }
        for t in self.transfers:
            out[f"gpu_{t.direction}_{t.memory}_gb_per_s"] = Value(t.best_gb_per_s, "measured",
                                                                  f"{t.direction} {t.memory}: the best median over "
                                                                  "sizes", {"sizes": t.sizes, "saturated": t.saturated},
                                                                  unit="GB/s")
        if self.mem_get_info_seconds is not None:
            out["gpu_mem_get_info_seconds"] = Value(self.mem_get_info_seconds, "measured",
                                                    "median wall time of one torch.cuda.mem_get_info call",
                                                    {"max_seconds": self.mem_get_info_max_seconds})
        return out


def judge(
    *,
    shared_card: bool | None,
    launch_us: float,
    h2d_gb_per_s: float | None,
    d2h_gb_per_s: float | None,
    mem_get_info_seconds: float | None,
    step: StepTimes | None = None,
    launches_per_step: int | None = None,
    matmul_share_of_datasheet: float | None = None,
    copy_share_of_datasheet: float | None = None,
    pinning_gain: float | None = None,
) -> list[Finding]:
    """The findings, pure. With ``step`` the launch and mem_get_info costs are judged as shares
    of one optimizer step (launches: ``launches_per_step`` x launch time; mem_get_info: one
    call per micro-batch, as the SpillWatch reads it); without it, against raw thresholds."""
    f: list[Finding] = []
    if shared_card:
        f.append(Finding("vGPU card", "shared", None, None, True,
                         "the driver reports a vGPU (shared) card: other guests' work runs on it, so any timing here "
                         "can lie"))
    elif shared_card is None:
        f.append(Finding("virtualisation unknown", None, None, None, False,
                         "the driver's virtualization mode could not be read (no nvidia-smi), so a vGPU cannot be "
                         "ruled out"))
    launch_share = None
    if step is not None and launches_per_step:
        launch_share = launches_per_step * launch_us * 1e-6 / step.step_seconds
        lies = launch_share > LAUNCH_SHARE_LIMIT
        s = (f"{launches_per_step:,} launches at {launch_us:.1f} µs are {_pct(launch_share)} of this plan's "
             f"{step.step_seconds:.3g} s step (limit {LAUNCH_SHARE_LIMIT:.0%})")
    else:
        lies = launch_us > LAUNCH_US_LIMIT
        s = (f"a kernel launch costs {launch_us:.1f} µs ({'over' if lies else 'within'} the {LAUNCH_US_LIMIT:g} µs a "
             "local card gives)")
        if step is not None:
            s += (f"; launches reach {LAUNCH_SHARE_LIMIT:.0%} of this plan's {step.step_seconds:.3g} s step at "
                  f"{LAUNCH_SHARE_LIMIT * step.step_seconds / (launch_us * 1e-6):,.0f} per step")
    f.append(Finding("launch latency", launch_us, LAUNCH_US_LIMIT, launch_share, lies, s))
    if h2d_gb_per_s and d2h_gb_per_s:
        ratio = max(h2d_gb_per_s, d2h_gb_per_s) / min(h2d_gb_per_s, d2h_gb_per_s)
        slow = "device-to-host" if d2h_gb_per_s < h2d_gb_per_s else "host-to-device"
        lies = ratio > ASYMMETRY_LIMIT
        s = (f"{slow} is {ratio:.3g}x slower than the other direction ({'over' if lies else 'within'} "
             f"{ASYMMETRY_LIMIT:g}x){': a fabric, not a local PCIe link' if lies else ''}")
        f.append(Finding("direction asymmetry", ratio, ASYMMETRY_LIMIT, None, lies, s))
    if pinning_gain is not None and pinning_gain < 1.1:
        f.append(Finding("pinning buys nothing", pinning_gain, 1.1, None, False,
                         f"pinned memory is only {pinning_gain:.2g}x faster than pageable: the link, not the host "
                         "copy, is the limit"))
    if mem_get_info_seconds is not None:
        if step is not None:
            share = mem_get_info_seconds / step.t_micro_seconds
            lies = share > MEM_INFO_SHARE_LIMIT
            s = (f"one mem_get_info costs {mem_get_info_seconds * 1e3:.3g} ms, {_pct(share)} of a "
                 f"{step.t_micro_seconds:.3g} s micro-batch (limit {MEM_INFO_SHARE_LIMIT:.0%})")
        else:
            share = None
            lies = mem_get_info_seconds > MEM_INFO_SECONDS_LIMIT
            s = (f"one mem_get_info costs {mem_get_info_seconds * 1e3:.3g} ms ({'over' if lies else 'within'} "
                 f"{MEM_INFO_SECONDS_LIMIT * 1e3:g} ms; seed 002 met 1.5 s on a fabric)")
        f.append(Finding("mem_get_info cost", mem_get_info_seconds, MEM_INFO_SECONDS_LIMIT, share, lies, s))
    for what, share in (("matmul", matmul_share_of_datasheet), ("device copy", copy_share_of_datasheet)):
        if share is not None and share < DATASHEET_SHARE_NOTE:
            f.append(Finding(f"{what} below datasheet", share, DATASHEET_SHARE_NOTE, None, False,
                             f"{what} reaches {share:.0%} of the datasheet: a throttled, shared (MIG) or "
                             "differently-built card"))
    return f


def verdict_of(findings: list[Finding]) -> tuple[bool, str]:
    """(trustworthy, one sentence) from the findings."""
    lies = [x.what for x in findings if x.lies]
    if lies:
        return False, "do not trust timings on this machine: " + ", ".join(lies)
    card = "the card's virtualisation unknown" if any(x.what == "virtualisation unknown"
                                                      for x in findings) else "no vGPU"
    return True, f"timings here can be trusted: {card}; launches, transfers and mem_get_info within limits"


# ---- the drivers (torch) ------------------------------------------------------------------
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
    """H2D and D2H GB/s (10^9 bytes/s) for pageable and, with ``pinned``, pinned host memory."""
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

    Raises:
        LeadlineError: no CUDA device is visible (the virtualisation is still readable
            through :func:`leadline.measure.virt.virtualisation`).
    """
    t0 = time.perf_counter()
    try:
        import torch
    except ImportError:
        raise LeadlineError("measuring a GPU needs torch; pip install 'leadline[torch]'") from None
    from leadline.provenance import describe_machine

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
