"""The report of :func:`leadline.measure.gpu.measure_gpu`: :class:`Transfer` (one direction and
memory kind, GB/s per size) and :class:`GpuReport` (every figure with its evidence and the
verdict), with the text a person reads and the values a plan takes. No torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from leadline.measure.gpu_judge import MIB, Datasheet, Finding, StepTimes
from leadline.measure.virt import Virtualisation
from leadline.plan import Value


@dataclass
class Transfer:
    """One direction and memory kind: GB/s per size and the best figure over the sizes.

    ``saturated``: the two largest sizes' GB/s lie within 10% of each other, so a larger copy
    would not be faster.

    Examples:
        >>> rows = [{"bytes": 4 * MIB, "seconds": 1.0e-4, "gb_per_s": 41.9},
        ...         {"bytes": 32 * MIB, "seconds": 6.2e-4, "gb_per_s": 54.1}]
        >>> t = Transfer("h2d", "pinned", rows, best_gb_per_s=54.1, saturated=False)
        >>> t.best_gb_per_s == max(r["gb_per_s"] for r in t.sizes)
        True
    """

    direction: str  # "h2d" or "d2h"
    memory: str  # "pinned" or "pageable"
    sizes: list[dict[str, float]]  # [{"bytes", "seconds", "gb_per_s"}], seconds a median
    best_gb_per_s: float
    saturated: bool  # the two largest sizes within 10% of each other


@dataclass
class GpuReport:
    """Everything :func:`measure_gpu` measured, with its evidence and the verdict.

    ``text()`` is what ``leadline gpu`` prints, ``to_dict()`` its ``--json``, ``as_values()``
    the figures a plan takes.

    Examples:
        >>> from leadline.measure.gpu_judge import datasheet_for, judge, verdict_of
        >>> rows = [{"bytes": 4 * MIB, "seconds": 1.6e-4, "gb_per_s": 26.2},
        ...         {"bytes": 32 * MIB, "seconds": 1.3e-3, "gb_per_s": 25.8}]
        >>> transfers = [Transfer("h2d", "pinned", rows, 26.2, True), Transfer("d2h", "pinned", rows, 26.2, True)]
        >>> findings = judge(shared_card=False, launch_us=5.0, h2d_gb_per_s=26.2, d2h_gb_per_s=26.2,
        ...                  mem_get_info_seconds=None)
        >>> ok, verdict = verdict_of(findings)
        >>> name = "NVIDIA H100 80GB HBM3"
        >>> r = GpuReport("cuda:0", name, Virtualisation(), 5.0, 11.0, transfers, None, None,
        ...               copy_gb_per_s=2680.0, copy_bytes=1024 * MIB, matmul_tflops=742.0, matmul_n=4096,
        ...               matmul_dtype="bfloat16", datasheet=datasheet_for(name), pcie_link_gb_per_s=None,
        ...               step=None, findings=findings, trustworthy=ok, verdict=verdict)
        >>> print(r.text())
        leadline gpu: NVIDIA H100 80GB HBM3 (cuda:0), datasheet H100 SXM
        virtualisation: no card reading, on an unknown host
        launch latency   5.00 µs per kernel back-to-back; 11.0 µs for one launch + synchronize
        transfers        best GB/s over sizes 4-32 MiB (median of repeats)
                            pinned  pageable
          host->device       26.20         -
          device->host       26.20         -
        device copy      2,680 GB/s counting read + write (1024 MiB) = 80% of the 3.35 TB/s datasheet
        bfloat16 matmul  742.0 TFLOP/s (4096^3) = 75% of the 989 TFLOP/s dense bf16 datasheet
        verdict: timings here can be trusted: no vGPU; launches, transfers and mem_get_info within limits
          ok   launch latency: a kernel launch costs 5.0 µs (within the 10 µs a local card gives)
          ok   direction asymmetry: both directions run at the same speed (within 2x)
        >>> r.transfer("h2d", "pinned").best_gb_per_s, r.transfer("h2d", "pageable")
        (26.2, None)
        >>> sorted(r.as_values())[:3]
        ['gpu_copy_gb_per_s', 'gpu_d2h_pinned_gb_per_s', 'gpu_h2d_pinned_gb_per_s']
    """

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
        """The :class:`Transfer` of ``direction`` (``h2d``/``d2h``) and ``memory``
        (``pinned``/``pageable``), or None where that arm was not measured."""
        return next((t for t in self.transfers if t.direction == direction and t.memory == memory), None)

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON-ready data (``leadline gpu --json``)."""
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
