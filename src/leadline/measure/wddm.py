"""Windows' own GPU memory counters (WDDM): where a spill to host memory shows.

On Windows a batch past the card's edge does not raise: the driver pages the excess into
shared (host) memory and the step crawls. The performance counters ``GPU Process Memory``
and ``GPU Adapter Memory`` report ``Dedicated Usage`` and ``Shared Usage`` per process and per
card; this module reads them through the PDH API (``pdh.dll``, by ctypes) and turns a pair of
readings into the two numbers the spill watch acts on:

- **spilled** — this process's own allocations demoted to shared memory. An allocation past
  the edge raises the process's shared usage *and* lowers its dedicated usage minus the
  allocator's reserved bytes by the same amount; pinned host memory raises shared alone. So
  ``spilled = max(0, min(Δ process shared, Δ (reserved - process dedicated)))``, both
  changes taken from the watch's first reading.
- **pushed** — another program pushed out of dedicated memory by this one: the *card's*
  shared usage growing by more than this process's own, ``Δ card shared - Δ process shared``,
  counted only when the card is at its edge, i.e. when the card's free dedicated memory is
  smaller than that growth (had there been room, nothing needed to move).

Import-safe everywhere: on other platforms :func:`available` is False and nothing loads.
The arithmetic is pure and is tested with recorded counter sequences.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

PROCESS_COUNTERS = (r"\GPU Process Memory(*)\Dedicated Usage", r"\GPU Process Memory(*)\Shared Usage")
ADAPTER_COUNTERS = (r"\GPU Adapter Memory(*)\Dedicated Usage", r"\GPU Adapter Memory(*)\Shared Usage")

_INSTANCE = re.compile(r"^(?:pid_(?P<pid>\d+)_)?luid_(?P<luid>0x[0-9a-fA-F]+_0x[0-9a-fA-F]+)_phys_(?P<phys>\d+)")


@dataclass(frozen=True)
class WddmSample:
    """One reading of the counters for this process on one card, bytes.

    Examples:
        >>> s = WddmSample(process_dedicated=6000, process_shared=0, card_dedicated=7000, card_shared=100)
        >>> s.card_dedicated - s.process_dedicated  # what other programs hold on the card
        1000
    """

    process_dedicated: int
    process_shared: int
    card_dedicated: int
    card_shared: int
    luid: str = ""


def parse_instance(name: str) -> tuple[int | None, str, int] | None:
    """A counter instance's (pid, luid, phys): the luid lower-cased, None as the pid of an
    adapter instance; None for a name that is neither.

    Examples:
        >>> parse_instance("pid_1234_luid_0x00000000_0x0000C0E8_phys_0")
        (1234, '0x00000000_0x0000c0e8', 0)
        >>> parse_instance("luid_0x00000000_0x0000C0E8_phys_0"), parse_instance("_Total")
        ((None, '0x00000000_0x0000c0e8', 0), None)
    """
    m = _INSTANCE.match(name.strip())
    if not m:
        return None
    pid = int(m["pid"]) if m["pid"] else None
    return pid, m["luid"].lower(), int(m["phys"])


def _sum_for(items: Iterable[tuple[str, int]], luid: str, pid: int | None) -> int:
    total = 0
    for name, value in items:
        parsed = parse_instance(name)
        if parsed and parsed[1] == luid and (pid is None or parsed[0] == pid):
            total += int(value)
    return total


def aggregate(
    process_dedicated: Iterable[tuple[str, int]],
    process_shared: Iterable[tuple[str, int]],
    card_dedicated: Iterable[tuple[str, int]],
    card_shared: Iterable[tuple[str, int]],
    pid: int,
    luid: str | None = None,
) -> WddmSample | None:
    """This process's sample on one card from the counters' instance arrays.

    The card is ``luid`` when given, else the card where this process has the most dedicated
    memory (the one its CUDA context lives on). Instances of one card on several physical
    adapters (``phys_N``) are summed. None when the process has no instance.

    Examples:
        >>> card = "luid_0x00000000_0x0000C0E8_phys_0"
        >>> dedicated = [("pid_42_" + card, 6000), ("pid_7_" + card, 500)]
        >>> shared = [("pid_42_" + card, 10)]
        >>> s = aggregate(dedicated, shared, [(card, 7000)], [(card, 100)], pid=42)
        >>> s.process_dedicated, s.process_shared, s.card_dedicated, s.card_shared, s.luid
        (6000, 10, 7000, 100, '0x00000000_0x0000c0e8')
        >>> aggregate(dedicated, shared, [(card, 7000)], [(card, 100)], pid=99) is None
        True
    """
    pd, ps = list(process_dedicated), list(process_shared)
    cd, cs = list(card_dedicated), list(card_shared)
    if luid is None:
        best: tuple[int, str] | None = None
        for name, value in pd:
            parsed = parse_instance(name)
            if parsed and parsed[0] == pid and (best is None or int(value) > best[0]):
                best = (int(value), parsed[1])
        if best is None:
            return None
        luid = best[1]
    luid = luid.lower()
    # The card's adapter instances have no pid; summing process instances would double count.
    card_d = _sum_for(((n, v) for n, v in cd if (parse_instance(n) or (0,))[0] is None), luid, None)
    card_s = _sum_for(((n, v) for n, v in cs if (parse_instance(n) or (0,))[0] is None), luid, None)
    return WddmSample(_sum_for(pd, luid, pid), _sum_for(ps, luid, pid), card_d, card_s, luid)


def spilled_bytes(base: WddmSample, now: WddmSample, reserved_base: int, reserved_now: int) -> int:
    """This process's allocations demoted to shared memory since ``base``:
    ``max(0, min(Δ process shared, Δ (reserved - process dedicated)))`` (see the module docstring).

    Examples:
        >>> base, now = WddmSample(6000, 0, 7000, 100), WddmSample(6000, 1000, 8000, 1600)
        >>> spilled_bytes(base, now, reserved_base=6000, reserved_now=7000)  # 1000 reserved, none of it dedicated
        1000
        >>> spilled_bytes(base, now, reserved_base=6000, reserved_now=6000)  # shared grew alone: pinned host memory
        0
    """
    d_shared = now.process_shared - base.process_shared
    d_demoted = (reserved_now - now.process_dedicated) - (reserved_base - base.process_dedicated)
    return max(0, min(d_shared, d_demoted))


def pushed_bytes(base: WddmSample, now: WddmSample, card_free_bytes: int) -> int:
    """Other programs' memory pushed to shared by this one since ``base``: the card's shared
    growth beyond this process's own, counted only when the card's free dedicated memory is
    smaller than that growth (the card is at its edge).

    Examples:
        >>> base, now = WddmSample(6000, 0, 7000, 100), WddmSample(6000, 1000, 8000, 1600)
        >>> pushed_bytes(base, now, card_free_bytes=100)  # card shared +1500, this process's +1000
        500
        >>> pushed_bytes(base, now, card_free_bytes=4000)  # room was left: nothing needed to move
        0
    """
    beyond = (now.card_shared - base.card_shared) - (now.process_shared - base.process_shared)
    if beyond <= 0 or card_free_bytes >= beyond:
        return 0
    return beyond


@dataclass
class SpillTracker:
    """Spilled and pushed bytes of each reading against the first one it saw, and their peaks.

    Examples:
        >>> t = SpillTracker()
        >>> t.update(WddmSample(6000, 0, 7000, 100), reserved_bytes=6000, card_free_bytes=4000)
        (0, 0)
        >>> t.update(WddmSample(6000, 1000, 8000, 1600), reserved_bytes=7000, card_free_bytes=100)
        (1000, 500)
        >>> t.peak_spilled_bytes, t.peak_pushed_bytes
        (1000, 500)
    """

    base: WddmSample | None = None
    reserved_base: int = 0
    peak_spilled_bytes: int = 0
    peak_pushed_bytes: int = 0

    def update(self, sample: WddmSample, reserved_bytes: int, card_free_bytes: int) -> tuple[int, int]:
        """(spilled, pushed) now; the first call sets the baseline and returns (0, 0)."""
        if self.base is None:
            self.base, self.reserved_base = sample, int(reserved_bytes)
            return 0, 0
        spilled = spilled_bytes(self.base, sample, self.reserved_base, int(reserved_bytes))
        pushed = pushed_bytes(self.base, sample, int(card_free_bytes))
        self.peak_spilled_bytes = max(self.peak_spilled_bytes, spilled)
        self.peak_pushed_bytes = max(self.peak_pushed_bytes, pushed)
        return spilled, pushed


# ---- the platform API -------------------------------------------------------------------
def available() -> bool:
    """True on Windows where ``pdh.dll`` loads; False everywhere else (nothing is loaded there).

    Examples:
        >>> available()  # off Windows
        False
    """
    if sys.platform != "win32":
        return False
    try:
        import ctypes

        ctypes.WinDLL("pdh.dll")
    except (OSError, AttributeError):
        return False
    return True


class WddmCounters:
    """The four counter arrays through PDH; calling the object returns a :class:`WddmSample`.

    Args:
        pid: the process (default: this one).
        luid: the card's LUID as ``"0xHIGH_0xLOW"``; default: where the process has the most
            dedicated memory.

    Raises:
        OSError: off Windows, or when PDH refuses the query.

    Examples:
        >>> try:  # off Windows
        ...     WddmCounters()
        ... except OSError as e:
        ...     print(e)
        the WDDM counters exist on Windows only
    """

    _PDH_FMT_LARGE = 0x00000400
    _PDH_MORE_DATA = 0x800007D2

    def __init__(self, pid: int | None = None, luid: str | None = None) -> None:
        if not available():
            raise OSError("the WDDM counters exist on Windows only")
        import ctypes
        from ctypes import wintypes

        class _Value(ctypes.Structure):
            _fields_ = [("CStatus", wintypes.DWORD), ("largeValue", ctypes.c_longlong)]

        class _Item(ctypes.Structure):
            _fields_ = [("szName", wintypes.LPWSTR), ("FmtValue", _Value)]

        self._ct, self._wt, self._Item = ctypes, wintypes, _Item
        self.pid = os.getpid() if pid is None else int(pid)
        self.luid = luid
        self._pdh = ctypes.WinDLL("pdh.dll")
        self._query = wintypes.HANDLE()
        self._check(self._pdh.PdhOpenQueryW(None, 0, ctypes.byref(self._query)), "PdhOpenQueryW")
        self._counters: list[Any] = []
        for path in (*PROCESS_COUNTERS, *ADAPTER_COUNTERS):
            h = wintypes.HANDLE()
            self._check(self._pdh.PdhAddEnglishCounterW(self._query, path, 0, ctypes.byref(h)), path)
            self._counters.append(h)

    def _check(self, status: int, what: str) -> None:
        if status & 0xFFFFFFFF:
            raise OSError(f"PDH {what} failed with status 0x{status & 0xFFFFFFFF:08X}")

    def _array(self, counter: Any) -> list[tuple[str, int]]:
        ct, wt = self._ct, self._wt
        size, count = wt.DWORD(0), wt.DWORD(0)
        status = self._pdh.PdhGetFormattedCounterArrayW(counter, self._PDH_FMT_LARGE, ct.byref(size), ct.byref(count),
                                                        None)
        if status & 0xFFFFFFFF != self._PDH_MORE_DATA:
            self._check(status, "PdhGetFormattedCounterArrayW")
            return []
        buf = (ct.c_byte * size.value)()
        self._check(self._pdh.PdhGetFormattedCounterArrayW(counter, self._PDH_FMT_LARGE, ct.byref(size),
                                                           ct.byref(count), buf), "PdhGetFormattedCounterArrayW")
        items = ct.cast(buf, ct.POINTER(self._Item))
        return [(items[i].szName or "", int(items[i].FmtValue.largeValue)) for i in range(count.value)]

    def __call__(self) -> WddmSample | None:
        """Collect the counters once: this process's :class:`WddmSample` on its card, or None."""
        self._check(self._pdh.PdhCollectQueryData(self._query), "PdhCollectQueryData")
        arrays = [self._array(c) for c in self._counters]
        sample = aggregate(*arrays, pid=self.pid, luid=self.luid)
        if sample is not None and self.luid is None:
            self.luid = sample.luid
        return sample

    def close(self) -> None:
        """Close the PDH query (a second call does nothing)."""
        if getattr(self, "_query", None) is not None:
            self._pdh.PdhCloseQuery(self._query)
            self._query = None
