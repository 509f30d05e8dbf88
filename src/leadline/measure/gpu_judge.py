"""The pure half of :mod:`leadline.measure.gpu`: the thresholds a timing is judged against, the
datasheet table and the PCIe lane rates, a plan's step times (:class:`StepTimes`), and
:func:`judge` / :func:`verdict_of`, which turn measured numbers into findings and one verdict.
No torch: every function here takes numbers or names and returns numbers or sentences.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from leadline.plan import Plan

LAUNCH_US_LIMIT = 10.0  # a local card launches in a few µs, one behind a fabric in tens (measured: docs/measure.md)
ASYMMETRY_LIMIT = 2.0  # one direction over 2x slower than the other: a fabric, not a PCIe link (docs/measure.md)
LAUNCH_SHARE_LIMIT = 0.05  # with a plan: launches worth more than 5% of a step
MEM_INFO_SHARE_LIMIT = 0.01  # the SpillWatch's budget: 1% of a step (SPEC, Memory)
MEM_INFO_SECONDS_LIMIT = 0.01  # without a plan; a local card answers in tens of µs
DATASHEET_SHARE_NOTE = 0.5  # below half the datasheet: throttled, shared or another SKU
MIB = 1 << 20


@dataclass(frozen=True)
class Datasheet:
    """A card's published figures: dense bf16 tensor TFLOP/s and memory bandwidth (TB/s).

    Examples:
        >>> sheet = Datasheet("H100 SXM", 989.0, 3.35, "NVIDIA H100 datasheet")
        >>> sheet.bf16_dense_tflops, sheet.memory_tb_per_s * 1000  # GB/s, as a device copy is read
        (989.0, 3350.0)
    """

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
    """The first :data:`DATASHEETS` entry whose pattern matches ``device_name`` (as torch reports
    it, lower-cased, hyphens as spaces), or None: an unknown card gets no percentage, never a guess.

    Examples:
        >>> datasheet_for("NVIDIA H100 80GB HBM3").name, datasheet_for("NVIDIA A100-SXM4-80GB").name
        ('H100 SXM', 'A100 80GB SXM')
        >>> datasheet_for("NVIDIA H200 NVL")
        Datasheet(name='H200 NVL', bf16_dense_tflops=835.0, memory_tb_per_s=4.8, source='NVIDIA H200 datasheet')
        >>> datasheet_for("Tesla T4") is None
        True
    """
    name = re.sub(r"\s+", " ", device_name.lower().replace("-", " "))
    for pattern, sheet in DATASHEETS:
        if re.search(pattern, name):
            return sheet
    return None


@dataclass
class StepTimes:
    """A plan's step: one forward+backward (t_micro), the optimizer update (t_step), grad_accum.

    Examples:
        >>> StepTimes(t_micro_seconds=0.2, t_step_seconds=0.05, grad_accum=8).step_seconds  # 8 x 0.2 + 0.05
        1.65...
    """

    t_micro_seconds: float
    t_step_seconds: float
    grad_accum: int

    @property
    def step_seconds(self) -> float:
        """One whole optimizer step: ``grad_accum x t_micro_seconds + t_step_seconds``."""
        return self.t_micro_seconds * self.grad_accum + self.t_step_seconds


def step_times_from_plan(plan: Plan) -> StepTimes | None:
    """The plan's t_micro / t_step / grad_accum values (``*_seconds`` spellings first), or None
    when the plan has no positive t_micro. A missing t_step reads 0, a missing grad_accum 1.

    Examples:
        >>> from leadline.plan import Plan, Value
        >>> plan = Plan()
        >>> plan.set("t_micro", Value(0.2, "measured", "timed micro-batches"))
        >>> plan.set("grad_accum", Value(8, "derived", "the split of the step"))
        >>> step_times_from_plan(plan)
        StepTimes(t_micro_seconds=0.2, t_step_seconds=0.0, grad_accum=8)
        >>> step_times_from_plan(Plan()) is None
        True
    """
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
    """One thing that would (``lies``) or might make timings here mislead.

    Attributes:
        reading: the measured figure (µs, a ratio, seconds, a share) or a word.
        threshold: the limit it was judged against, None where there is none.
        share_of_step: the reading as a share of the plan's step, when a plan was given.

    Examples:
        >>> f = Finding("launch latency", 4.0, LAUNCH_US_LIMIT, None, False, "a kernel launch costs 4.0 µs")
        >>> f.lies, f.reading < f.threshold
        (False, True)
    """

    what: str
    reading: float | str | None
    threshold: float | None
    share_of_step: float | None
    lies: bool
    sentence: str


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
    """The findings on measured numbers, pure.

    Lies: a vGPU card (``shared_card``); a launch over :data:`LAUNCH_US_LIMIT` µs; one
    direction over :data:`ASYMMETRY_LIMIT` x slower than the other; one ``mem_get_info`` over
    :data:`MEM_INFO_SECONDS_LIMIT` s. With ``step`` the launch and mem_get_info costs are judged
    as shares of one optimizer step instead: launches (``launches_per_step`` x launch time)
    over :data:`LAUNCH_SHARE_LIMIT` of the step, one mem_get_info call over
    :data:`MEM_INFO_SHARE_LIMIT` of a micro-batch (one call per micro-batch, as the SpillWatch
    reads it). Noted, never lies: an unknown virtualisation, pinning under 1.1x pageable, a
    matmul or device copy under :data:`DATASHEET_SHARE_NOTE` of the datasheet.

    Examples:
        >>> rented = judge(shared_card=False, launch_us=55.0, h2d_gb_per_s=1.502, d2h_gb_per_s=0.457,
        ...                mem_get_info_seconds=None)
        >>> [(f.what, f.lies) for f in rented]
        [('launch latency', True), ('direction asymmetry', True)]
        >>> rented[1].sentence
        'device-to-host is 3.29x slower than the other direction (over 2x): a fabric, not a local PCIe link'
        >>> local = judge(shared_card=False, launch_us=4.0, h2d_gb_per_s=25.0, d2h_gb_per_s=26.0,
        ...               mem_get_info_seconds=2e-5, step=StepTimes(0.2, 0.05, 8), launches_per_step=40_000)
        >>> local[0].sentence  # 40,000 x 4 µs = 0.16 s of a 1.65 s step
        "40,000 launches at 4.0 µs are 9.7% of this plan's 1.65 s step (limit 5%)"
        >>> [(f.what, f.lies) for f in local]
        [('launch latency', True), ('direction asymmetry', False), ('mem_get_info cost', False)]
    """
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
        head = (f"{slow} is {ratio:.3g}x slower than the other direction" if round(ratio, 2) > 1
                else "both directions run at the same speed")
        s = (f"{head} ({'over' if lies else 'within'} "
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
                 f"{MEM_INFO_SECONDS_LIMIT * 1e3:g} ms; a rented card behind a fabric took 1.5 s)")
        f.append(Finding("mem_get_info cost", mem_get_info_seconds, MEM_INFO_SECONDS_LIMIT, share, lies, s))
    for what, share in (("matmul", matmul_share_of_datasheet), ("device copy", copy_share_of_datasheet)):
        if share is not None and share < DATASHEET_SHARE_NOTE:
            f.append(Finding(f"{what} below datasheet", share, DATASHEET_SHARE_NOTE, None, False,
                             f"{what} reaches {share:.0%} of the datasheet: a throttled, shared (MIG) or "
                             "differently-built card"))
    return f


def verdict_of(findings: list[Finding]) -> tuple[bool, str]:
    """(trustworthy, one sentence) from the findings: untrustworthy when any finding lies.

    Examples:
        >>> verdict_of(judge(shared_card=True, launch_us=4.0, h2d_gb_per_s=None, d2h_gb_per_s=None,
        ...                  mem_get_info_seconds=None))
        (False, 'do not trust timings on this machine: vGPU card')
        >>> verdict_of(judge(shared_card=False, launch_us=4.0, h2d_gb_per_s=25.0, d2h_gb_per_s=26.0,
        ...                  mem_get_info_seconds=2e-5))[1]
        'timings here can be trusted: no vGPU; launches, transfers and mem_get_info within limits'
    """
    lies = [x.what for x in findings if x.lies]
    if lies:
        return False, "do not trust timings on this machine: " + ", ".join(lies)
    card = "the card's virtualisation unknown" if any(x.what == "virtualisation unknown"
                                                      for x in findings) else "no vGPU"
    return True, f"timings here can be trusted: {card}; launches, transfers and mem_get_info within limits"
