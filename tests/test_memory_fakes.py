"""A fake caching allocator and a fake training step whose peaks, retries and OOMs the tests set.

No tests here: the memory tests import these. The allocator follows torch's rules closely
enough for the ramp's decisions: a step whose peak exceeds the limit (the cap, or what the
card has left) raises ``torch.OutOfMemoryError``; a step that fits only when the cache is
emptied first (its reserved need, with the fragmentation a dirty cache adds, exceeds the
limit) increments ``num_alloc_retries``; after a step the cache holds its blocks (dirty).
``since_empty`` lists the lengths whose blocks the cache holds (the steps since it was last
emptied, by ``empty_cache``, an OOM or a retry), for fragmentation that depends on them.
"""

from __future__ import annotations

from leadline.memory.step import StepTiming
from leadline.memory_readings import DeviceMemory


class FakeAllocator(DeviceMemory):
    """A card of ``total`` bytes; ``resident`` allocated by this process (its weights);
    ``other`` held by everything else (other processes, the CUDA context)."""

    on_cuda = True

    def __init__(self, total: int = 1000, resident: int = 100, other: int = 0, device: str = "cuda:0",
                 squeeze_margin: int = 0, clock=None) -> None:
        self.device = device
        self.total, self.resident, self.other = total, resident, other
        self.cached = 0
        self.dirty_length: int | None = None
        self.since_empty: list[int] = []
        self.cap: int | None = None
        self.retries = 0
        self.peak = resident
        self.peak_res = resident
        self.squeeze_margin = squeeze_margin
        self.empties = 0
        self.steps: list[tuple[int, int, str]] = []
        self.caps_set: list[int | None] = []
        self.clock = clock
        self.fail_reads = False

    # the interface
    def free_total(self):
        if self.fail_reads:
            raise RuntimeError("driver went away")
        if self.clock is not None:
            self.clock.advance(0.001)
        return self.total - self.other - self.reserved(), self.total

    def allocated(self):
        return self.resident

    def reserved(self):
        return self.resident + self.cached

    def peak_allocated(self):
        return self.peak

    def peak_reserved(self):
        return self.peak_res

    def reset_peak(self):
        self.peak, self.peak_res = self.allocated(), self.reserved()

    def alloc_retries(self):
        return self.retries

    def empty_cache(self):
        self.cached = 0
        self.dirty_length = None
        self.since_empty = []
        self.empties += 1

    def get_cap(self):
        return self.cap

    def set_cap(self, cap_bytes):
        self.cap = cap_bytes
        self.caps_set.append(cap_bytes)

    # what a step does to it
    def limit(self) -> int:
        card = self.total - self.other
        return card if self.cap is None else min(card, self.cap)

    def run(self, need: int, frag: int, length: int) -> str:
        """One step that needs ``need`` bytes allocated at its peak (resident included); a dirty
        cache from another shape adds ``frag`` bytes of reserved overhead."""
        import torch

        limit = self.limit()
        if need > limit:
            self.peak = max(self.peak, limit)
            self.cached = 0
            self.dirty_length = None
            self.since_empty = []
            self.steps.append((need, length, "oom"))
            raise torch.OutOfMemoryError(f"fake: tried to allocate {need} with limit {limit}")
        extra = frag if self.dirty_length is not None else 0
        reserved_need = need + extra
        verdict = "fits"
        if reserved_need > limit or need > limit - self.squeeze_margin:
            self.retries += 1  # emptied the cache and retried
            reserved_need = need
            verdict = "squeezed"
            self.since_empty = []
        self.peak = max(self.peak, need)
        self.peak_res = max(self.peak_res, reserved_need)
        self.cached = reserved_need - self.resident
        self.dirty_length = length
        self.since_empty.append(length)
        self.steps.append((need, length, verdict))
        return verdict


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class FakeStep:
    """``step(rows, length, repeats)`` against a :class:`FakeAllocator`: the peak is
    ``resident + per_token * rows * length`` unless ``peak_of`` says otherwise; ``frag_of``
    the reserved overhead a dirty cache adds; ``seconds_of`` the forward+backward time."""

    def __init__(self, mem: FakeAllocator, per_token: int = 5, peak_of=None, frag_of=None, seconds_of=None,
                 after_call=None) -> None:
        self.mem = mem
        self.device = mem.device
        self.per_token = per_token
        self.peak_of = peak_of or (lambda r, n: mem.resident + per_token * r * n)
        self.frag_of = frag_of or (lambda r, n: 0)
        self.seconds_of = seconds_of or (lambda r, n: 0.01 * r)
        self.after_call = after_call
        self.calls: list[tuple[int, int, int]] = []

    def __call__(self, rows: int, length: int, repeats: int = 1) -> StepTiming:
        self.calls.append((rows, length, repeats))
        try:
            for _ in range(repeats):
                self.mem.run(self.peak_of(rows, length), self.frag_of(rows, length), length)
        finally:
            if self.after_call is not None:
                self.after_call(self, rows, length)
        t = self.seconds_of(rows, length)
        return StepTiming(rows, length, t, 0.001, [t] * repeats, [0.001] * repeats)


class FakeHost(DeviceMemory):
    """The CPU side: a RAM room, and peaks set by the step (``peak`` attribute)."""

    on_cuda = False

    def __init__(self, room: int = 10_000, baseline: int = 100) -> None:
        self.device = "cpu"
        self._room = room
        self.baseline = baseline
        self.peak = baseline

    def free_total(self):
        return self._room - self.baseline, self._room

    def room(self):
        return self._room

    def allocated(self):
        return self.baseline

    def reserved(self):
        return self.baseline

    def peak_allocated(self):
        return self.peak

    def peak_reserved(self):
        return self.peak

    def reset_peak(self):
        self.peak = self.baseline


class FakeHostStep:
    def __init__(self, host: FakeHost, seconds_of, peak_of=None) -> None:
        self.host, self.device = host, "cpu"
        self.seconds_of = seconds_of
        self.peak_of = peak_of or (lambda r, n: host.baseline + 10 * r)
        self.calls: list[int] = []

    def __call__(self, rows: int, length: int, repeats: int = 1) -> StepTiming:
        self.calls.append(rows)
        self.host.peak = max(self.host.peak, self.peak_of(rows, length))
        t = self.seconds_of(rows)
        return StepTiming(rows, length, t, 0.002, [t] * repeats, [0.002] * repeats)
