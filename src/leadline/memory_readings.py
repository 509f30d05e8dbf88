"""Device memory readings: the one place leadline reads how much memory there is and who holds it.

Everything that asks the card or the host about memory goes through a :class:`DeviceMemory`:

- :class:`CudaMemory`: ``torch.cuda.mem_get_info`` (free and total on the card, all processes),
  ``memory_allocated`` / ``memory_reserved`` and their peaks, ``memory_stats()["num_alloc_retries"]``
  (how often the caching allocator had to empty its cache and retry), and the process cap
  (``set_per_process_memory_fraction``). ``card_bytes=`` makes the card look smaller than it is:
  the first ``card_bytes`` of the real card, with every process's use counted against it, so a
  141 GB card can stand in for a 6 GB one.
- :class:`HostMemory`: the CPU. Free is ``MemAvailable`` (psutil when installed, else
  ``/proc/meminfo``), held is this process's resident set, the peak is the kernel's high-water
  mark ``VmHWM`` (reset through ``/proc/self/clear_refs``). Nothing caps the host and nothing
  retries.

The ramp, the cap, the watch and the fit pre-flight only see this interface, so the tests hand
them a fake allocator with recorded peaks, retries and OOMs. torch is imported inside the
methods: importing this module stays light. It stands under :mod:`leadline.memory` and
:mod:`leadline.rate` (the snapshots ask it for the card's room), beside :mod:`leadline.stats`.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import TypeAlias

    import torch

    Device: TypeAlias = str | int | torch.device
    """A device as the functions here take it: ``"cuda:1"``, ``"cpu"``, a ``torch.device``, a CUDA index."""


def format_bytes(n: float | None) -> str:
    """Bytes as a person reads them: GB (10^9) with two decimals, MB below 1 GB.

    Examples:
        >>> format_bytes(3_047_382_528), format_bytes(450e6), format_bytes(None)
        ('3.05 GB', '450 MB', 'unknown')
    """
    if n is None:
        return "unknown"
    if abs(n) >= 1e9:
        return f"{n / 1e9:.2f} GB"
    return f"{n / 1e6:.0f} MB"


def is_cuda(device: Device | None) -> bool:
    """True when ``device`` names a CUDA device (``"cuda"``, ``"cuda:1"``, a torch.device, an int).

    Examples:
        >>> is_cuda("cuda:1"), is_cuda(0), is_cuda("cpu")
        (True, True, False)
    """
    if isinstance(device, int):
        return True
    return str(device).startswith("cuda")


def normalize_device(device: Device | None = None) -> str:
    """``"cuda:N"`` or ``"cpu"``: the key caps and watches are filed under.

    ``None`` means the current CUDA device when CUDA is available, else the CPU.

    Examples:
        >>> normalize_device("cuda:1"), normalize_device(2), normalize_device("cpu"), normalize_device("mps:0")
        ('cuda:1', 'cuda:2', 'cpu', 'mps')
    """
    if device is None:
        if "torch" in sys.modules or _cuda_probably_present():
            import torch

            if torch.cuda.is_available():
                return f"cuda:{torch.cuda.current_device()}"
        return "cpu"
    if isinstance(device, int):
        return f"cuda:{device}"
    text = str(device)
    if text == "cuda":
        import torch

        return f"cuda:{torch.cuda.current_device()}"
    if text.startswith("cuda"):
        return text
    return text.split(":")[0]


def _cuda_probably_present() -> bool:
    return Path("/proc/driver/nvidia/version").exists() or os.name == "nt"


# ---- the host ---------------------------------------------------------------------------
def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name.strip()] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def host_memory_bytes() -> tuple[int, int]:
    """(available, total) bytes of host RAM: psutil when installed, else ``/proc/meminfo``.

    Examples:
        >>> available, total = host_memory_bytes()
        >>> 0 < available <= total
        True
    """
    try:
        import psutil  # type: ignore[import-untyped]

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
    except ImportError:
        pass
    info = _meminfo()
    if "MemAvailable" in info and "MemTotal" in info:
        return info["MemAvailable"], info["MemTotal"]
    raise OSError("cannot read host memory: no psutil and no /proc/meminfo")


def _status_bytes(field: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            parts = line.split()
            return int(parts[1]) * 1024
    return None


def process_rss_bytes() -> int:
    """This process's resident set now (``VmRSS``; psutil or ``getrusage`` where there is no ``/proc``).

    Examples:
        >>> process_rss_bytes() > 0
        True
    """
    rss = _status_bytes("VmRSS")
    if rss is not None:
        return rss
    try:
        import psutil  # type: ignore[import-untyped]

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def process_peak_rss_bytes() -> int:
    """The resident set's high-water mark (``VmHWM``) since the last :func:`reset_process_peak_rss`.

    Examples:
        >>> now = process_rss_bytes()
        >>> process_peak_rss_bytes() >= now
        True
    """
    hwm = _status_bytes("VmHWM")
    return hwm if hwm is not None else process_rss_bytes()


def reset_process_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current resident set (Linux ``clear_refs`` 5); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# ---- the interface ----------------------------------------------------------------------
class DeviceMemory:
    """What the ramp, the cap, the watch and the fit pre-flight read and set. Bytes throughout.

    ``room()`` is free plus held: what this process could have if it asked now. The tests (and
    the examples here) hand the ramp, the cap and the fit a subclass with set numbers.

    Examples:
        >>> class Card(DeviceMemory):  # a 6 GB card: 2 GB free, 1 GB held by this process
        ...     device, on_cuda = "cuda:0", True
        ...     free_total = lambda self: (2 * 10**9, 6 * 10**9)
        ...     reserved = lambda self: 10**9
        >>> Card().room(), Card().get_cap(), Card().alloc_retries()
        (3000000000, None, 0)
    """

    device: str = "cpu"
    on_cuda: bool = False
    card_bytes: int | None = None

    def free_total(self) -> tuple[int, int]:
        """(free, total) of the device as every process sees it."""
        raise NotImplementedError

    def allocated(self) -> int:
        raise NotImplementedError

    def reserved(self) -> int:
        """What this process holds (the allocator's reserved bytes; the resident set on the host)."""
        raise NotImplementedError

    def peak_allocated(self) -> int:
        raise NotImplementedError

    def peak_reserved(self) -> int:
        raise NotImplementedError

    def reset_peak(self) -> None:
        raise NotImplementedError

    def alloc_retries(self) -> int:
        """How often the allocator emptied its cache and retried (0 where it never does)."""
        return 0

    def synchronize(self) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_cap(self) -> int | None:
        """The bytes the process may reserve, or None when uncapped."""
        return None

    def set_cap(self, cap_bytes: int | None) -> None:
        """Cap the process at ``cap_bytes`` (None: lift it). A no-op where nothing can cap."""
        return None

    def room(self) -> int:
        """Free plus held: the most this process could reserve if it asked now."""
        free, _ = self.free_total()
        return free + self.reserved()


class FixedMemory(DeviceMemory):
    """Readings with set numbers: a card (a ``cuda`` device) or a host of ``total`` bytes, ``free``
    of them free and ``held`` held by this process. ``peak`` is what the peak readings return
    (held where not set; a step can set it to model its own peak) and ``cap`` what
    :meth:`set_cap` last set. What a what-if, an example or a test hands the ramp, the cap, the
    watch and the fit in place of a real device.

    Examples:
        >>> card = FixedMemory("cuda:0", total=6 * 10**9, free=2 * 10**9, held=10**9)
        >>> card.room(), card.on_cuda, card.get_cap()
        (3000000000, True, None)
        >>> card.set_cap(card.room()); card.get_cap()
        3000000000
    """

    def __init__(self, device: str = "cpu", *, total: int, free: int, held: int, peak: int | None = None) -> None:
        self.device, self.on_cuda = device, str(device).startswith("cuda")
        self.total, self.free, self.held = int(total), int(free), int(held)
        self.peak = self.held if peak is None else int(peak)
        self.cap: int | None = None

    def free_total(self) -> tuple[int, int]:
        return self.free, self.total

    def allocated(self) -> int:
        return self.held

    def reserved(self) -> int:
        return self.held

    def peak_allocated(self) -> int:
        return self.peak

    def peak_reserved(self) -> int:
        return self.peak

    def reset_peak(self) -> None:
        return None

    def get_cap(self) -> int | None:
        return self.cap

    def set_cap(self, cap_bytes: int | None) -> None:
        self.cap = cap_bytes


class CudaMemory(DeviceMemory):
    """One CUDA device, through torch's caching allocator.

    Args:
        device: ``"cuda"``, ``"cuda:N"``, an int or a torch.device.
        card_bytes: treat the card as this big (the first ``card_bytes`` of it, every process's
            use counted against it); None: the real card.
    """

    on_cuda = True

    def __init__(self, device: Device = "cuda", card_bytes: int | None = None) -> None:
        import torch

        if not torch.cuda.is_available():
            from leadline.errors import InputError

            raise InputError(f"device {device} is a CUDA device but torch sees no CUDA here; pass device='cpu'")
        self.device = normalize_device(device)
        self.index = int(self.device.split(":")[1])
        self._torch = torch
        self.card_bytes = int(card_bytes) if card_bytes else None
        self._cap: int | None = None

    def real_free_total(self) -> tuple[int, int]:
        free, total = self._torch.cuda.mem_get_info(self.index)
        return int(free), int(total)

    def free_total(self) -> tuple[int, int]:
        free, total = self.real_free_total()
        if self.card_bytes is None or self.card_bytes >= total:
            return free, total
        used = total - free
        return max(0, self.card_bytes - used), self.card_bytes

    def allocated(self) -> int:
        return int(self._torch.cuda.memory_allocated(self.index))

    def reserved(self) -> int:
        return int(self._torch.cuda.memory_reserved(self.index))

    def peak_allocated(self) -> int:
        return int(self._torch.cuda.max_memory_allocated(self.index))

    def peak_reserved(self) -> int:
        return int(self._torch.cuda.max_memory_reserved(self.index))

    def reset_peak(self) -> None:
        self._torch.cuda.reset_peak_memory_stats(self.index)

    def alloc_retries(self) -> int:
        return int(self._torch.cuda.memory_stats(self.index).get("num_alloc_retries", 0))

    def synchronize(self) -> None:
        self._torch.cuda.synchronize(self.index)

    def empty_cache(self) -> None:
        self._torch.cuda.empty_cache()

    def get_cap(self) -> int | None:
        """The cap in bytes: the one this object set, else the fraction torch holds (None at 1.0)."""
        if self._cap is not None:
            return self._cap
        getter = getattr(self._torch.cuda, "get_per_process_memory_fraction", None)
        fraction = float(getter(self.index)) if getter is not None else 1.0
        if fraction >= 1.0:
            return None
        return int(fraction * self.real_free_total()[1])

    def set_cap(self, cap_bytes: int | None) -> None:
        _, total = self.real_free_total()
        if cap_bytes is None:
            self._torch.cuda.set_per_process_memory_fraction(1.0, self.index)
            self._cap = None
            return
        cap = max(0, min(int(cap_bytes), total))
        self._torch.cuda.set_per_process_memory_fraction(cap / total, self.index)
        self._cap = cap


class HostMemory(DeviceMemory):
    """The CPU: RAM available, this process's resident set and its high-water mark.

    Args:
        limit_bytes: treat the host as having at most this much room for the process (the room
            is then ``min(available + resident, limit_bytes)``); None: the real RAM.

    Examples:
        A 1 MB limit, which this process's resident set already exceeds: no room is free.

        >>> host = HostMemory(limit_bytes=10**6)
        >>> host.device, host.on_cuda, host.room(), host.free_total()
        ('cpu', False, 1000000, (0, 1000000))
    """

    on_cuda = False

    def __init__(self, limit_bytes: int | None = None) -> None:
        self.device = "cpu"
        self.card_bytes = int(limit_bytes) if limit_bytes else None
        self._peak_resettable = True

    def free_total(self) -> tuple[int, int]:
        avail, total = host_memory_bytes()
        if self.card_bytes is None:
            return avail, total
        held = process_rss_bytes()
        return max(0, min(avail, self.card_bytes - held)), self.card_bytes

    def room(self) -> int:
        """Available RAM plus this process's resident set, at most ``limit_bytes``."""
        avail, _ = host_memory_bytes()
        room = avail + process_rss_bytes()
        return room if self.card_bytes is None else min(room, self.card_bytes)

    def allocated(self) -> int:
        return process_rss_bytes()

    def reserved(self) -> int:
        return process_rss_bytes()

    def peak_allocated(self) -> int:
        return process_peak_rss_bytes()

    def peak_reserved(self) -> int:
        return process_peak_rss_bytes()

    def reset_peak(self) -> None:
        self._peak_resettable = reset_process_peak_rss()

    def synchronize(self) -> None:
        return None


def memory_for(device: Device | None = None, card_bytes: int | None = None) -> DeviceMemory:
    """The :class:`DeviceMemory` for ``device``: :class:`CudaMemory` on CUDA, else :class:`HostMemory`
    (``card_bytes`` its ``limit_bytes``).

    Examples:
        >>> host = memory_for("cpu", card_bytes=8 * 10**9)
        >>> type(host).__name__, host.card_bytes
        ('HostMemory', 8000000000)
    """
    dev = normalize_device(device)
    if is_cuda(dev):
        return CudaMemory(dev, card_bytes=card_bytes)
    return HostMemory(limit_bytes=card_bytes)


def is_oom(exc: BaseException) -> bool:
    """True for the allocator refusing memory: ``torch.OutOfMemoryError``, the CPU
    allocator's ``RuntimeError`` that it cannot allocate, or the system's ENOMEM (an ``OSError``:
    under a bound on the process's data, Python itself can be refused, importing a module).

    Examples:
        >>> import errno
        >>> is_oom(MemoryError()), is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
        (True, True)
        >>> is_oom(OSError(errno.ENOMEM, "Cannot allocate memory")), is_oom(ValueError("out of memory"))
        (True, False)
    """
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return True
    if "torch" in sys.modules:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, RuntimeError):
        msg = str(exc)
        return "out of memory" in msg.lower() or "can't allocate memory" in msg.lower()
    return False
