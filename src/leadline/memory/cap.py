"""The spill cap and the watch that keeps it where the card is.

:func:`forbid_spill` caps this process at the dedicated memory it can have, free plus what it
already holds (``set_per_process_memory_fraction``), so an allocation past the card's edge
raises at the line that caused it instead of paging to host memory (Windows) or racing other
processes (Linux). A cap set once goes stale: the CUDA context grows as kernels load, other
programs take and give back memory. So it installs a :class:`SpillWatch` that moves the cap
to free + held before every outermost forward and after every optimizer step, throttled so
its readings cost at most ``max_overhead`` (1%) of the time that passes, by their own measured
cost. On Windows it also reads the WDDM
counters (:mod:`leadline.measure.wddm`); spilled or pushed bytes lower the cap by as much and
empty the allocator's cache, so the next step lands in dedicated memory.

No side effect outlives its scope: :func:`lift_cap` (or leaving the ``with`` block, by any
exit) removes the hooks and restores the cap the process had before. Off CUDA there is
nothing to cap; the calls return an inert handle.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from leadline.errors import LeadlineError
from leadline.memory._hooks import OutermostHooks
from leadline.memory_readings import DeviceMemory, format_bytes, memory_for, normalize_device

if TYPE_CHECKING:
    from types import TracebackType

    from leadline.measure.wddm import WddmCounters
    from leadline.memory_readings import Device

MAX_CAP_MOVES = 1000
RECENT_READINGS = 256


class RoomShrank(LeadlineError):
    """An OOM inside a capped block, explained: the cap, and how the room moved since the start.

    Examples:
        Another program takes 1 GB of the card, then the step runs out of memory:

        >>> import textwrap
        >>> from leadline.memory_readings import FixedMemory
        >>> card = FixedMemory("cuda:0", total=6 * 10**9, free=2 * 10**9, held=10**9)  # 1 GB held by this process
        >>> try:
        ...     with forbid_spill(memory=card, wddm=False):
        ...         card.free = 10**9
        ...         raise MemoryError
        ... except RoomShrank as e:
        ...     print(textwrap.fill(str(e), 100))
        the step ran out of memory at the cap of 3.00 GB on cuda:0: the room (free + held) was 3.00 GB when
        the cap was set and is 2.00 GB now; 1.00 GB of it was taken since the watch started; lower the
        micro-batch (rerun the ramp) or free memory on the card
    """


@dataclass
class WatchReport:
    """What a watch saw on one device. Bytes and seconds.

    Attributes:
        readings: readings taken; ``skipped_checks`` hook calls that found no reading due.
        reading_seconds: the readings' own total cost; ``elapsed_seconds`` since install;
            ``overhead_fraction`` their ratio (the throttle holds it at ``max_overhead``).
        start_room_bytes, least_room_bytes: free + held at the first reading, and the least.
        cap_bytes: the cap now; ``cap_moves``: every move ``{t, reason, from_bytes, to_bytes,
            free_bytes, held_bytes, spilled_bytes, pushed_bytes}`` (the first
            ``MAX_CAP_MOVES``; ``cap_moves_dropped`` counts the rest); ``recent_readings``:
            the last ``RECENT_READINGS`` readings; ``last_reading`` the latest.
        peak_spilled_bytes, peak_pushed_bytes: the most of this process's memory demoted to
            shared memory, and of other programs' pushed there by it (WDDM; 0 elsewhere).

    Examples:
        >>> report = WatchReport("cuda:0", readings=12, reading_seconds=0.05, elapsed_seconds=10.0)
        >>> report.overhead_fraction, report.as_dict()["recent_readings"]
        (0.005, [])
    """

    device: str
    active: bool = False
    readings: int = 0
    skipped_checks: int = 0
    reading_seconds: float = 0.0
    elapsed_seconds: float = 0.0
    start_room_bytes: int | None = None
    least_room_bytes: int | None = None
    cap_bytes: int | None = None
    cap_moves: list[dict[str, Any]] = field(default_factory=list)
    cap_moves_dropped: int = 0
    peak_spilled_bytes: int = 0
    peak_pushed_bytes: int = 0
    wddm: bool = False
    hook_errors: int = 0
    last_reading: dict[str, Any] | None = None
    recent_readings: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECENT_READINGS))

    @property
    def overhead_fraction(self) -> float:
        return self.reading_seconds / self.elapsed_seconds if self.elapsed_seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["recent_readings"] = list(self.recent_readings)
        d["overhead_fraction"] = self.overhead_fraction
        return d


class SpillWatch:
    """Moves the cap to free + held before outermost forwards and after optimizer steps.

    Args:
        memory: the device's :class:`~leadline.memory_readings.DeviceMemory`.
        max_overhead: the readings' cost as a share of elapsed time (0.01: 1%). After a reading
            that cost c seconds, the next one waits c / max_overhead.
        ceiling_bytes: a cap the process had before (never raised above it).
        counters: a callable returning a :class:`~leadline.measure.wddm.WddmSample` (Windows).
        clock: the time source (seconds), for tests.

    Until the first optimizer step a global forward pre-hook discovers models: a module not
    seen before is outermost (its submodules are marked inner) and gets a forward pre-hook of
    its own. The first optimizer step removes the global hook, so from there a forward costs
    one hook call (the outermost module's), not one per module (:mod:`leadline.memory._hooks`).
    A model first called after that step is read only after optimizer steps. At most one
    reading per outermost forward, throttled. Hooks never raise into the user's forward: an
    error is counted in ``hook_errors``.

    Examples:
        One reading, no hooks installed: the cap moves to free + held, never above the ceiling.

        >>> from leadline.memory_readings import FixedMemory
        >>> card = FixedMemory("cuda:0", total=6 * 10**9, free=2 * 10**9, held=10**9)  # 1 GB held by this process
        >>> reading = SpillWatch(card).read()
        >>> reading["room_bytes"], reading["cap_bytes"], card.cap
        (3000000000, 3000000000, 3000000000)
        >>> watch = SpillWatch(card, ceiling_bytes=2_500_000_000)
        >>> watch.read()["cap_bytes"], watch.report().cap_moves[0]["from_bytes"]
        (2500000000, 3000000000)
        >>> SpillWatch(card, max_overhead=0)
        Traceback (most recent call last):
        ...
        ValueError: max_overhead must be in (0, 1], got 0
    """

    def __init__(
        self,
        memory: DeviceMemory,
        *,
        max_overhead: float = 0.01,
        ceiling_bytes: int | None = None,
        counters: Callable[[], Any] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not 0 < max_overhead <= 1:
            raise ValueError(f"max_overhead must be in (0, 1], got {max_overhead}")
        self.memory = memory
        self.max_overhead = max_overhead
        self.ceiling_bytes = ceiling_bytes
        self.counters = counters
        self.clock = clock
        self._hooks = OutermostHooks(self._on_forward, self._on_step, self._on_hook_error)
        self._next_due = 0.0
        self._t0 = clock()
        self._tracker: Any = None
        self.report_ = WatchReport(device=memory.device, wddm=counters is not None)

    # ---- hooks --------------------------------------------------------------------------
    @property
    def installed(self) -> bool:
        return self._hooks.installed

    def install(self) -> None:
        """Register the discovery and optimizer-step hooks (idempotent; after :meth:`remove`,
        discovery starts afresh)."""
        if self._hooks.installed:
            return
        self._hooks.install()
        self.report_.active = True

    def remove(self) -> None:
        """Remove every hook (global, per-module, step); safe to call twice."""
        self._hooks.remove()
        self.report_.active = False
        self.report_.elapsed_seconds = self.clock() - self._t0

    def _on_forward(self) -> None:
        self._maybe_read("forward")

    def _on_step(self) -> None:
        self._maybe_read("optimizer step")

    def _on_hook_error(self) -> None:
        self.report_.hook_errors += 1

    def _maybe_read(self, reason: str) -> None:
        if self.clock() < self._next_due:
            self.report_.skipped_checks += 1
            return
        try:
            self.read(reason)
        except Exception:  # a reading must never break the user's step
            self.report_.hook_errors += 1

    # ---- one reading --------------------------------------------------------------------
    def read(self, reason: str = "manual") -> dict[str, Any]:
        """Read the device now and move the cap to free + held (less spilled and pushed bytes)."""
        t0 = self.clock()
        mem, rep = self.memory, self.report_
        free, _ = mem.free_total()
        held = mem.reserved()
        room = free + held
        spilled = pushed = 0
        if self.counters is not None:
            from leadline.measure.wddm import SpillTracker

            if self._tracker is None:
                self._tracker = SpillTracker()
            sample = self.counters()
            if sample is not None:
                spilled, pushed = self._tracker.update(sample, held, free)
                rep.peak_spilled_bytes = self._tracker.peak_spilled_bytes
                rep.peak_pushed_bytes = self._tracker.peak_pushed_bytes
                if spilled or pushed:
                    room -= spilled + pushed
                    mem.empty_cache()
        if rep.start_room_bytes is None:
            rep.start_room_bytes = room
        rep.least_room_bytes = room if rep.least_room_bytes is None else min(rep.least_room_bytes, room)
        cap = room if self.ceiling_bytes is None else min(room, self.ceiling_bytes)
        cap = max(cap, 0)
        old = mem.get_cap()
        t_rel = t0 - self._t0
        reading = {"t": t_rel, "reason": reason, "free_bytes": free, "held_bytes": held, "room_bytes": room,
                   "cap_bytes": cap, "spilled_bytes": spilled, "pushed_bytes": pushed}
        if old != cap:
            mem.set_cap(cap)
            move = {"t": t_rel, "reason": reason, "from_bytes": old, "to_bytes": cap, "free_bytes": free,
                    "held_bytes": held, "spilled_bytes": spilled, "pushed_bytes": pushed}
            if len(rep.cap_moves) < MAX_CAP_MOVES:
                rep.cap_moves.append(move)
            else:
                rep.cap_moves_dropped += 1
        rep.cap_bytes = cap
        rep.readings += 1
        rep.last_reading = reading
        rep.recent_readings.append(reading)
        t1 = self.clock()
        cost = t1 - t0
        rep.reading_seconds += cost
        self._next_due = t1 + cost / self.max_overhead
        return reading

    def report(self) -> WatchReport:
        """A snapshot of what the watch saw so far."""
        rep = self.report_
        if self.installed:
            rep.elapsed_seconds = self.clock() - self._t0
        return _copy(rep)


def _copy(rep: WatchReport) -> WatchReport:
    d = {k: getattr(rep, k) for k in rep.__dataclass_fields__}
    d["cap_moves"] = list(rep.cap_moves)
    d["recent_readings"] = deque(rep.recent_readings, maxlen=RECENT_READINGS)
    d["last_reading"] = dict(rep.last_reading) if rep.last_reading else None
    return WatchReport(**d)


# ---- the cap ----------------------------------------------------------------------------
_ACTIVE: dict[str, SpillCap] = {}
_LAST: dict[str, WatchReport] = {}


class SpillCap:
    """The handle :func:`forbid_spill` returns: the cap is on while it is active.

    As a context manager it lifts the cap on exit (when this handle set it) and turns an OOM
    raised inside the block into :class:`RoomShrank`, one sentence with the cap and how the
    room moved.

    Examples:
        Off CUDA the handle is inert: no watch, nothing to lift.

        >>> cap = forbid_spill("cpu")
        >>> cap.active, cap.watch, cap.owner, cap.lift().readings
        (False, None, False, 0)
    """

    def __init__(self, device: str, memory: DeviceMemory | None, watch: SpillWatch | None,
                 previous_cap: int | None, owner: bool) -> None:
        self.device = device
        self.memory = memory
        self.watch = watch
        self.previous_cap = previous_cap
        self.owner = owner

    @property
    def active(self) -> bool:
        return _ACTIVE.get(self.device) is not None and self.watch is not None and self.watch.installed

    def lift(self) -> WatchReport:
        """Lift the cap and remove the watch when this handle set them."""
        if self.owner:
            return lift_cap(self.device)
        return watched(self.device)

    def __enter__(self) -> SpillCap:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        sentence = explain_oom(self.device) if exc is not None and _is_oom(exc) and self.watch is not None else None
        self.lift()
        if sentence is not None:
            raise RoomShrank(sentence) from exc


def _is_oom(exc: BaseException) -> bool:
    from leadline.memory_readings import is_oom

    return is_oom(exc)


def forbid_spill(device: Device | None = None, *, card_bytes: int | None = None, memory: DeviceMemory | None = None,
                 max_overhead: float = 0.01, wddm: bool | None = None) -> SpillCap:
    """Cap this process at the dedicated memory it can have (free + held) and watch it.

    Usable as a function (the cap stays until :func:`lift_cap`) and as a context manager
    (lifted on exit, by any path). A second call for a device already capped re-reads the
    card and returns a handle that does not own the cap. Off CUDA: an inert handle.

    Args:
        device: ``"cuda:N"`` (default: the current CUDA device, or the CPU without CUDA).
        card_bytes: treat the card as this big (see :class:`~leadline.memory_readings.CudaMemory`).
        memory: the readings to use (tests pass a fake allocator); overrides device.
        max_overhead: the watch's reading cost as a share of elapsed time.
        wddm: read the Windows spill counters (default: where they are available).

    Examples:
        >>> from leadline.memory_readings import FixedMemory
        >>> card = FixedMemory("cuda:0", total=6 * 10**9, free=2 * 10**9, held=10**9)  # 1 GB held by this process
        >>> with forbid_spill(memory=card, wddm=False) as cap:
        ...     print(cap.active, card.cap, watched("cuda:0").readings)
        True 3000000000 1
        >>> cap.active, card.cap  # lifted on exit
        (False, None)
        >>> with forbid_spill("cpu") as cap:  # off CUDA: nothing to cap
        ...     print(cap.active, cap.watch)
        False None
    """
    mem = memory
    dev = mem.device if mem is not None else normalize_device(device)
    existing = _ACTIVE.get(dev)
    if existing is not None and existing.watch is not None:
        existing.watch.read("forbid_spill again")
        return SpillCap(dev, existing.memory, existing.watch, existing.previous_cap, owner=False)
    if mem is None:
        if not dev.startswith("cuda"):
            return SpillCap(dev, None, None, None, owner=False)
        mem = memory_for(dev, card_bytes=card_bytes)
    if not mem.on_cuda:
        return SpillCap(dev, mem, None, None, owner=False)
    counters = _spill_counters(wddm)
    previous = mem.get_cap()
    watch = SpillWatch(mem, max_overhead=max_overhead, ceiling_bytes=previous, counters=counters)
    handle = SpillCap(dev, mem, watch, previous, owner=True)
    _ACTIVE[dev] = handle
    try:
        watch.read("forbid_spill")
        watch.install()
    except BaseException:
        _ACTIVE.pop(dev, None)
        watch.remove()
        mem.set_cap(previous)
        raise
    return handle


def _spill_counters(wddm: bool | None) -> WddmCounters | None:
    """The Windows spill counters of this process where ``wddm`` asks for them (None: where they
    are available); ``wddm=True`` where they are not is refused."""
    if wddm is None or wddm:
        from leadline.measure import wddm as _wddm

        if _wddm.available():
            return _wddm.WddmCounters(pid=os.getpid())
        if wddm:
            from leadline.errors import InputError

            raise InputError("wddm=True needs the Windows WDDM counters, which this platform does not have; leave wddm "
                             "unset")
    return None


def lift_cap(device: Device | None = None) -> WatchReport:
    """Remove the watch's hooks and restore the cap the process had before :func:`forbid_spill`.

    Returns the watch's final report. Safe to call when nothing is capped.

    Examples:
        >>> from leadline.memory_readings import FixedMemory
        >>> card = FixedMemory("cuda:0", total=6 * 10**9, free=2 * 10**9, held=10**9)  # 1 GB held by this process
        >>> card.cap = 4 * 10**9  # a cap the process had before
        >>> cap = forbid_spill(memory=card, wddm=False)
        >>> card.cap
        3000000000
        >>> report = lift_cap("cuda:0")
        >>> card.cap, report.active, report.cap_bytes, report.readings
        (4000000000, False, 4000000000, 1)
        >>> lift_cap("cpu").readings  # nothing capped
        0
    """
    dev = device.device if isinstance(device, DeviceMemory) else normalize_device(device)
    handle = _ACTIVE.pop(dev, None)
    if handle is None or handle.watch is None:
        return watched(dev)
    try:
        handle.watch.remove()
    finally:
        assert handle.memory is not None
        handle.memory.set_cap(handle.previous_cap)
        counters = handle.watch.counters
        if counters is not None and hasattr(counters, "close"):
            counters.close()
    report = handle.watch.report()
    report.active = False
    report.cap_bytes = handle.previous_cap
    _LAST[dev] = report
    return report


def watched(device: Device | None = None) -> WatchReport:
    """What the watch on ``device`` saw: its live report while the cap is on, the last one
    after :func:`lift_cap`, an empty one when none ever ran.

    Examples:
        >>> report = watched("cpu")  # off CUDA no watch ever runs
        >>> report.device, report.active, report.readings, report.cap_bytes
        ('cpu', False, 0, None)
    """
    dev = device.device if isinstance(device, DeviceMemory) else normalize_device(device)
    handle = _ACTIVE.get(dev)
    if handle is not None and handle.watch is not None:
        return handle.watch.report()
    if dev in _LAST:
        return _copy(_LAST[dev])
    return WatchReport(device=dev)


def current_watch(device: Device | None = None) -> SpillWatch | None:
    """The active watch on ``device``, or None.

    Examples:
        >>> current_watch("cpu") is None
        True
    """
    dev = device.device if isinstance(device, DeviceMemory) else normalize_device(device)
    handle = _ACTIVE.get(dev)
    return handle.watch if handle is not None else None


def explain_oom(device: Device | None = None) -> str:
    """One sentence for an OOM under the cap: the cap, the room at the start and now, what to do.

    Examples:
        Without a watch there is no room to report (an example with one: :class:`RoomShrank`):

        >>> explain_oom("cpu")
        'the step ran out of memory on cpu; lower the micro-batch or the length, or rerun the ramp'
    """
    dev = device.device if isinstance(device, DeviceMemory) else normalize_device(device)
    rep = watched(dev)
    if rep.start_room_bytes is None:
        return f"the step ran out of memory on {dev}; lower the micro-batch or the length, or rerun the ramp"
    handle = _ACTIVE.get(dev)
    now = rep.least_room_bytes
    if handle is not None and handle.watch is not None:
        try:
            now = handle.watch.read("after an OOM")["room_bytes"]
        except Exception:
            pass
    shrank = rep.start_room_bytes - (now or 0)
    taken = f"; {format_bytes(shrank)} of it was taken since the watch started" if shrank > 0 else ""
    return (
        f"the step ran out of memory at the cap of {format_bytes(rep.cap_bytes)} on {dev}: the room "
        f"(free + held) was {format_bytes(rep.start_room_bytes)} when the cap was set and is "
        f"{format_bytes(now)} now{taken}; lower the micro-batch (rerun the ramp) or free memory on the card"
    )
