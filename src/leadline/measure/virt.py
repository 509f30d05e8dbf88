"""Is this card, or this machine, virtualised — and what does each reading mean for timings?

Three sources, each parsed by a pure function tested on recorded outputs:

- ``nvidia-smi -q``: the driver's *Virtualization Mode* per GPU (None, Pass-Through, VGPU,
  Host VGPU, Host VSGA — NVML's ``nvmlGpuVirtualizationMode``) and the PCIe link it reports.
- ``/proc/cpuinfo``: the ``hypervisor`` CPU flag, set by every mainstream hypervisor.
- ``systemd-detect-virt --vm`` / ``--container``: which hypervisor or container runtime.

Only a vGPU slice (or the host that shares its card with vGPU guests) makes the card's own
timings lie; a virtual machine or a passed-through card is reported with what it risks, and the
transfer numbers of :mod:`leadline.measure.gpu` decide. A card reached over a fabric reads
"None" too (measured: docs/measure.md), so "None" is never proof that a card is local.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# NVML's modes as nvidia-smi prints them (lower-cased) -> (is the card shared, meaning).
_NVSMI_MODES: dict[str, tuple[bool, str]] = {
    "none": (False,
             "the driver runs the card directly (no vGPU); a card reached over a fabric also reads None, so the "
             "transfer numbers decide whether it is local"),
    "pass-through": (False,
                     "the whole card is passed through to a virtual machine: kernels run at native speed, host "
                     "transfers cross the hypervisor's IOMMU"),
    "vgpu": (True,
             "the card is a vGPU slice inside a virtual machine: other guests share its time and memory bandwidth, so "
             "timings here can lie"),
    "host vgpu": (True,
                  "this is the hypervisor host of a vGPU setup: guests share this card, so timings depend on their "
                  "load"),
    "host vsga": (True,
                  "this is the hypervisor host of a vSGA setup: guests share this card, so timings depend on their "
                  "load"),
}

# systemd-detect-virt's container names that reach the GPU through another OS layer.
_CONTAINER_NOTES: dict[str, str] = {
    "wsl": "WSL2: the card is reached through Windows' GPU paravirtualisation (WDDM), whose memory can spill to host "
           "RAM",
}


@dataclass(frozen=True)
class NvidiaSmiGpu:
    """One GPU block of ``nvidia-smi -q``: name, virtualization mode, PCIe link (None: not printed).

    Examples:
        >>> g = NvidiaSmiGpu("00000000:18:00.0", "NVIDIA H800", "None", None, 5, 4, 16, 16)
        >>> g.virtualization_mode, g.pcie_generation_max, g.pcie_width_max
        ('None', 5, 16)
    """

    bus_id: str
    product_name: str | None
    virtualization_mode: str | None
    host_vgpu_mode: str | None
    pcie_generation_max: int | None
    pcie_generation_current: int | None
    pcie_width_max: int | None
    pcie_width_current: int | None


@dataclass(frozen=True)
class Reading:
    """One source's reading (None: the source was unavailable) and what it means for the timings
    measured here.

    Examples:
        >>> Reading("systemd-detect-virt --vm", "kvm", "a kvm virtual machine").reading
        'kvm'
    """

    source: str
    reading: str | None
    meaning: str


@dataclass
class Virtualisation:
    """What every source said, and the two conclusions drawn from them.

    Attributes:
        readings: one :class:`Reading` per source (a missing tool is a reading too).
        shared_card: True when the driver reports a vGPU slice or a vGPU host (the card's
            time is shared, so timings can lie); False when it reports None or Pass-Through;
            None when nvidia-smi could not be read.
        vm: True when the CPU flag or systemd-detect-virt says this is a virtual machine.
        container: the container runtime systemd-detect-virt names, or None.
        gpus: the parsed ``nvidia-smi -q`` blocks.

    Examples:
        >>> v = Virtualisation(shared_card=False, vm=True, container="docker")
        >>> v.summary()
        'an unshared card, inside a virtual machine, in a docker container'
        >>> Virtualisation().text()  # nothing read yet
        'virtualisation: no card reading, on an unknown host'
    """

    readings: list[Reading] = field(default_factory=list)
    shared_card: bool | None = None
    vm: bool | None = None
    container: str | None = None
    gpus: list[NvidiaSmiGpu] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON-ready data."""
        return asdict(self)

    def text(self) -> str:
        """The summary, then one line per reading with what it means."""
        lines = [f"virtualisation: {self.summary()}"]
        lines += [f"  {r.source}: {r.reading if r.reading is not None else 'unavailable'} — {r.meaning}"
                  for r in self.readings]
        return "\n".join(lines)

    def summary(self) -> str:
        """One sentence: the card, the machine, the container."""
        card = {True: "a shared (vGPU) card", False: "an unshared card", None: "no card reading"}[self.shared_card]
        vm = {True: "inside a virtual machine", False: "on bare metal", None: "on an unknown host"}[self.vm]
        cont = f", in a {self.container} container" if self.container else ""
        return f"{card}, {vm}{cont}"


def _blocks(text: str) -> list[tuple[str, dict[str, str]]]:
    """Split ``nvidia-smi -q`` into GPU blocks of ``"Section/Sub/Key" -> value``."""
    blocks: list[tuple[str, dict[str, str]]] = []
    current: dict[str, str] | None = None
    stack: list[tuple[int, str]] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        line = raw.strip()
        m = re.match(r"^GPU\s+([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+)\s*$", line)
        if m:
            current = {}
            blocks.append((m.group(1), current))
            stack = [(indent, "")]
            continue
        if current is None:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key, sep, value = line.partition(":")
        key = key.strip()
        parents = [name for _, name in stack if name]
        if sep and value.strip():
            current["/".join([*parents, key])] = value.strip()
        else:
            stack.append((indent, key))
    return blocks


def _find(block: dict[str, str], *suffixes: str) -> str | None:
    for suffix in suffixes:
        for k, v in block.items():
            if k.lower() == suffix.lower() or k.lower().endswith("/" + suffix.lower()):
                return v
    return None


def _int(text: str | None) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def parse_nvidia_smi(text: str) -> list[NvidiaSmiGpu]:
    """Parse ``nvidia-smi -q`` (any driver since the mode was added) into one record per GPU.

    A block starts at a ``GPU <bus id>`` line; keys are found by their indented path
    (``GPU Virtualization Mode/Virtualization Mode``, ``PCIe Generation/Max``...).

    Examples:
        >>> smi = "\\n".join(["GPU 00000000:18:00.0", "    Product Name : NVIDIA H800", "    GPU Virtualization Mode",
        ...                   "        Virtualization Mode : None", "    PCI", "        GPU Link Info",
        ...                   "            PCIe Generation", "                Max : 5", "                Current : 4",
        ...                   "            Link Width", "                Max : 16x", "                Current : 16x"])
        >>> (g,) = parse_nvidia_smi(smi)
        >>> g.bus_id, g.product_name, g.virtualization_mode, g.pcie_generation_max, g.pcie_generation_current
        ('00000000:18:00.0', 'NVIDIA H800', 'None', 5, 4)
        >>> g.pcie_width_max, g.host_vgpu_mode
        (16, None)
        >>> parse_nvidia_smi("No devices were found")
        []
    """
    gpus = []
    for bus_id, b in _blocks(text):
        mode = _find(b, "GPU Virtualization Mode/Virtualization Mode", "Virtualization Mode")
        gpus.append(
            NvidiaSmiGpu(
                bus_id=bus_id,
                product_name=_find(b, "Product Name"),
                virtualization_mode=mode,
                host_vgpu_mode=_find(b, "GPU Virtualization Mode/Host VGPU Mode", "Host VGPU Mode"),
                pcie_generation_max=_int(_find(b, "PCIe Generation/Max")),
                pcie_generation_current=_int(_find(b, "PCIe Generation/Current")),
                pcie_width_max=_int(_find(b, "Link Width/Max")),
                pcie_width_current=_int(_find(b, "Link Width/Current")),
            )
        )
    return gpus


def nvidia_smi_reading(gpu: NvidiaSmiGpu) -> tuple[bool | None, str]:
    """(is the card shared, what the mode means) for one parsed GPU.

    Shared: ``VGPU``, ``Host VGPU``, ``Host VSGA``; not shared: ``None``, ``Pass-Through``;
    None (unknown) for a missing, ``N/A`` or unrecognised mode.

    Examples:
        >>> from dataclasses import replace
        >>> g = NvidiaSmiGpu("00000000:02:00.0", "NVIDIA A10-24Q", "VGPU", None, None, None, None, None)
        >>> nvidia_smi_reading(g)
        (True, 'the card is a vGPU slice inside a virtual machine: other guests share its time and memory ...')
        >>> nvidia_smi_reading(replace(g, virtualization_mode="Pass-Through"))[0]
        False
        >>> nvidia_smi_reading(replace(g, virtualization_mode="N/A"))
        (None, 'the driver does not report a virtualization mode for this card')
    """
    mode = (gpu.virtualization_mode or "").strip().lower()
    if mode in _NVSMI_MODES:
        return _NVSMI_MODES[mode]
    if not mode or mode == "n/a":
        return None, "the driver does not report a virtualization mode for this card"
    return None, (f"the driver reports an unknown virtualization mode {gpu.virtualization_mode!r}; treat the card as "
                  "possibly shared")


def parse_cpuinfo(text: str) -> bool:
    """True when any ``flags`` line of ``/proc/cpuinfo`` carries ``hypervisor``.

    Examples:
        >>> parse_cpuinfo("processor : 0\\nflags : fpu sse2 hypervisor avx2"), parse_cpuinfo("flags : fpu sse2")
        (True, False)
    """
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags" and "hypervisor" in value.split():
            return True
    return False


def parse_detect_virt(output: str) -> str | None:
    """The technology ``systemd-detect-virt`` names, or None for ``none``/empty output.

    Examples:
        >>> parse_detect_virt("kvm\\n"), parse_detect_virt("none\\n"), parse_detect_virt("")
        ('kvm', None, None)
    """
    word = output.strip().splitlines()[0].strip() if output.strip() else ""
    return None if word in ("", "none") else word


def interpret(
    nvidia_smi: str | None,
    cpuinfo: str | None,
    detect_vm: str | None,
    detect_container: str | None,
) -> Virtualisation:
    """Turn the four raw outputs (None where a source was unavailable) into readings.

    Pure: the recorded outputs in the tests go through exactly this. The card is shared when
    any GPU's mode is shared, unshared when every GPU's mode says so, else unknown; the machine
    is a VM when the CPU flag or ``systemd-detect-virt --vm`` says so.

    Examples:
        >>> smi = "\\n".join(["GPU 00000000:18:00.0", "    Product Name : NVIDIA H800", "    GPU Virtualization Mode",
        ...                   "        Virtualization Mode : VGPU", "    PCI", "        GPU Link Info",
        ...                   "            PCIe Generation", "                Max : 5", "                Current : 4",
        ...                   "            Link Width", "                Max : 16x", "                Current : 16x"])
        >>> v = interpret(smi, "flags : fpu hypervisor", "kvm\\n", "none\\n")
        >>> v.shared_card, v.vm, v.container
        (True, True, None)
        >>> v.summary()
        'a shared (vGPU) card, inside a virtual machine'
        >>> print(interpret(None, None, None, None).text())
        virtualisation: no card reading, on an unknown host
          nvidia-smi -q: unavailable — nvidia-smi is not available, so the driver's virtualization mode is unknown
          /proc/cpuinfo: unavailable — no /proc/cpuinfo here, so the CPU's hypervisor flag is unknown
          systemd-detect-virt --vm: unavailable — systemd-detect-virt is not available
    """
    v = Virtualisation()
    if nvidia_smi is None:
        v.readings.append(Reading("nvidia-smi -q", None,
                                  "nvidia-smi is not available, so the driver's virtualization mode is unknown"))
    else:
        v.gpus = parse_nvidia_smi(nvidia_smi)
        if not v.gpus:
            v.readings.append(Reading("nvidia-smi -q", None, "nvidia-smi printed no GPU block"))
        shared: list[bool | None] = []
        for g in v.gpus:
            is_shared, meaning = nvidia_smi_reading(g)
            shared.append(is_shared)
            name = f" ({g.product_name}, {g.bus_id})" if g.product_name else f" ({g.bus_id})"
            v.readings.append(Reading(f"nvidia-smi -q{name}", g.virtualization_mode, meaning))
        if any(s is True for s in shared):
            v.shared_card = True
        elif shared and all(s is False for s in shared):
            v.shared_card = False
    flags: list[bool] = []
    if cpuinfo is None:
        v.readings.append(Reading("/proc/cpuinfo", None,
                                  "no /proc/cpuinfo here, so the CPU's hypervisor flag is unknown"))
    else:
        hyp = parse_cpuinfo(cpuinfo)
        flags.append(hyp)
        v.readings.append(
            Reading(
                "/proc/cpuinfo",
                "hypervisor" if hyp else "no hypervisor flag",
                "the CPU runs under a hypervisor (a virtual machine): launches and host transfers pass through it, and "
                "leadline gpu's launch and transfer numbers say what that costs"
                if hyp
                else "the CPU reports no hypervisor: bare metal, or a hypervisor that hides itself",
            )
        )
    if detect_vm is None:
        v.readings.append(Reading("systemd-detect-virt --vm", None, "systemd-detect-virt is not available"))
    else:
        tech = parse_detect_virt(detect_vm)
        flags.append(tech is not None)
        v.readings.append(
            Reading(
                "systemd-detect-virt --vm",
                tech or "none",
                f"a {tech} virtual machine" if tech else "no virtual machine detected",
            )
        )
    if detect_container is not None:
        cont = parse_detect_virt(detect_container)
        v.container = cont
        meaning = _CONTAINER_NOTES.get(cont or "",
                                       f"a {cont} container: it shares the host's kernel and adds no cost to GPU "
                                       "timings by itself") if cont else "no container detected"
        v.readings.append(Reading("systemd-detect-virt --container", cont or "none", meaning))
    v.vm = any(flags) if flags else None
    return v


def _run(cmd: list[str], runner: Callable[..., Any]) -> str | None:
    """stdout of ``cmd``, or None when the tool is missing or hangs (a 'none' exit of 1 is fine)."""
    try:
        r = runner(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    out = r.stdout or ""
    if r.returncode not in (0, 1) or (r.returncode == 1 and not out.strip()):
        return None
    return out


def virtualisation(
    *, runner: Callable[..., Any] = subprocess.run, cpuinfo_path: str = "/proc/cpuinfo"
) -> Virtualisation:
    """Read every source on this machine (missing tools are recorded, never fatal).

    Runs ``nvidia-smi -q`` and ``systemd-detect-virt --vm/--container`` through ``runner``
    (``subprocess.run``'s signature; 20 s each) and reads ``cpuinfo_path``, then :func:`interpret`.

    Examples:
        >>> def no_tools(cmd, **kwargs):  # a machine without nvidia-smi or systemd
        ...     raise FileNotFoundError(cmd[0])
        >>> v = virtualisation(runner=no_tools, cpuinfo_path="/nonexistent/cpuinfo")
        >>> v.summary(), [r.source for r in v.readings]
        ('no card reading, on an unknown host', ['nvidia-smi -q', '/proc/cpuinfo', 'systemd-detect-virt --vm'])
    """
    try:
        cpuinfo: str | None = Path(cpuinfo_path).read_text(errors="replace")
    except OSError:
        cpuinfo = None
    return interpret(
        nvidia_smi=_run(["nvidia-smi", "-q"], runner),
        cpuinfo=cpuinfo,
        detect_vm=_run(["systemd-detect-virt", "--vm"], runner),
        detect_container=_run(["systemd-detect-virt", "--container"], runner),
    )
