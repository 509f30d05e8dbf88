"""The ramp: the micro-batch a training run fits, found with real training steps.

The driver feeds :mod:`leadline.lookahead.memory.decide` with measurements and nothing else. On CUDA it
runs under the spill cap (it sets one if nothing has, and lifts what it set): each search rung
is one real step from an emptied cache; the candidate is confirmed by ``repeats`` (>= 2) steps
in a row without emptying the cache, then, from an emptied cache, the corpus's length mix,
longest first, with the full length after each of its lengths (the allocator retries on a
full-length step whose cache a shorter step laid out; see
:func:`~leadline.memory.probe.confirmation_lengths`). A candidate that fails any of those
steps is not kept; the search confirms the rung below it the same way. The watch re-reads the
card after every rung, so memory that grew outside the allocator (the CUDA context loading
kernels, other processes) lowers the cap the later rungs meet. An OOM is a measurement: a
rung with verdict ``oom``, never an exception out of the ramp. Off CUDA the rows where rows
per second stop improving, within the RAM room.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from leadline.errors import InputError, LeadlineError
from leadline.lookahead.memory.decide import RampSearch, RampStop, ThroughputSearch
from leadline.memory.probe import Rung, confirmation_lengths, probe
from leadline.memory.step import device_of
from leadline.memory_readings import DeviceMemory, format_bytes, memory_for
from leadline.plan import Value


class WontFit(LeadlineError):
    """Not even the smallest shape fits: one sentence, with the measurement in ``.result``.

    Examples:
        >>> from leadline.memory_readings import FixedMemory
        >>> Host = lambda: FixedMemory(total=8 * 10**9, free=7 * 10**9, held=10**9)  # the peak stays at what is held
        >>> def refused(rows, length, repeats=1):  # every step: the allocator refuses
        ...     raise MemoryError
        >>> try:
        ...     ramp(refused, 128, memory=Host())
        ... except WontFit as e:
        ...     print(e)
        ...     print(e.result.micro_batch, e.result.stop)
        not even 1 row at 128 tokens runs on cpu: the allocator refused it
        0 out_of_memory
    """

    def __init__(self, sentence: str, result: Any = None) -> None:
        super().__init__(sentence)
        self.result = result


@dataclass
class RampResult:
    """What the ramp kept and every rung it ran.

    Attributes:
        micro_batch: the rows kept (the plan's micro-batch before the target step cuts it).
        length: the length every search rung ran at (the run's longest).
        t_micro_seconds, t_step_seconds: medians of synchronized repeats at the kept shape.
        rungs: every step, in order (search, confirm, mix; a mix rung at ``length`` is the
            full-length step after a shorter one).
        rule: ``allocator`` (CUDA) or ``throughput`` (off CUDA).
        budget_bytes: the least room (free + held, under any earlier cap) the ramp met on CUDA;
            the RAM room off CUDA.
        start_room_bytes, outside_growth_bytes: the room at the start, and how much it shrank
            while the ramp ran (memory outside the allocator: the CUDA context, other programs).
        cap_moves: the watch's cap moves during the ramp.
        lengths_mix: the corpus's lengths the confirmation ran, in order, longest first (each
            was followed by a step at ``length``, not listed here).

    Examples:
        >>> result = RampResult(16, 128, 0.17, 0.002, [], "cpu", "throughput",
        ...                     "doubling 16 -> 32 rows gained +3.0% rows per second, less than 5%", stop="no_gain")
        >>> values = result.as_values()
        >>> sorted(values), values["micro_batch"].value, values["micro_batch"].kind
        (['micro_batch', 't_micro_seconds', 't_step_seconds'], 16, 'measured')
        >>> print(result.source())
        measured on the cpu: 16 rows at 128 tokens, where rows per second stopped improving (doubling 16 -> 32 ...)
    """

    micro_batch: int
    length: int
    t_micro_seconds: float | None
    t_step_seconds: float | None
    rungs: list[Rung]
    device: str
    rule: str
    stopped_because: str
    budget_bytes: int | None = None
    stop: RampStop = ""
    start_room_bytes: int | None = None
    outside_growth_bytes: int = 0
    cap_moves: list[dict[str, Any]] = field(default_factory=list)
    max_rows: int | None = None
    lengths_mix: list[int] = field(default_factory=list)
    micro_seconds: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def evidence(self) -> dict[str, Any]:
        """The ``ramp`` plot's evidence (docs/evidence.md) plus what the rule needs to be read."""
        return {
            "plot": "ramp", "budget_bytes": self.budget_bytes, "rungs": [r.as_dict() for r in self.rungs],
            "rule": self.rule, "device": self.device, "length": self.length, "max_rows": self.max_rows,
            "stopped_because": self.stopped_because, "stop": self.stop, "start_room_bytes": self.start_room_bytes,
            "outside_growth_bytes": self.outside_growth_bytes, "cap_moves": self.cap_moves,
            "lengths_mix": self.lengths_mix,
        }

    def source(self) -> str:
        if self.rule == "throughput":
            return (f"measured on the {self.device}: {self.micro_batch} rows at {self.length} tokens, where rows per "
                    f"second stopped improving ({self.stopped_because})")
        mix = (", then from an emptied cache through the length mix, longest first, with the full length after each "
               "of its lengths" if self.lengths_mix else "")
        return (f"measured on {self.device}: the most rows at {self.length} tokens whose real training step ran "
                f"without an allocator retry, twice in a row{mix}, under a cap of "
                f"{format_bytes(self.budget_bytes)} ({self.stopped_because})")

    def as_values(self) -> dict[str, Value]:
        """``micro_batch``, ``t_micro_seconds``, ``t_step_seconds`` for the plan."""
        shape = f"{self.micro_batch} rows x {self.length} tokens on {self.device}"
        n = len(self.micro_seconds)
        out = {"micro_batch": Value(self.micro_batch, "measured", self.source(), self.evidence(), self.seconds, "rows")}
        if self.t_micro_seconds is not None:
            out["t_micro_seconds"] = Value(self.t_micro_seconds, "measured",
                                           f"median of {n} synchronized forward+backward passes of {shape}",
                                           {"repeats_seconds": self.micro_seconds}, 0.0, "s")
        if self.t_step_seconds is not None:
            out["t_step_seconds"] = Value(self.t_step_seconds, "measured",
                                          f"median of {n} synchronized optimizer updates after {shape}",
                                          {"repeats_seconds": self.step_seconds}, 0.0, "s")
        return out

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rungs"] = [r.as_dict() for r in self.rungs]
        return d


def ramp(
    step: Any,
    length: int,
    *,
    lengths: Sequence[int] | None = None,
    max_rows: int | None = None,
    start_rows: int = 1,
    repeats: int = 3,
    mix_steps: int = 16,
    memory: DeviceMemory | None = None,
    card_bytes: int | None = None,
    min_gain: float = 0.05,
    on_rung: Callable[[Rung], None] | None = None,
    should_stop: Callable[[Rung], bool] | None = None,
    too_long: Callable[[float], bool] | None = None,
) -> RampResult:
    """The micro-batch a training run fits at ``length`` tokens, from real steps.

    Args:
        step: a :class:`~leadline.memory.step.TrainingStep` (any ``step(rows, length, repeats)``
            with a ``device``).
        length: the run's longest length; every search rung runs at it.
        lengths: the corpus's own lengths; after its repeats the candidate runs, from an
            emptied cache, up to ``mix_steps // 2`` of those shorter than ``length`` (evenly
            spaced ranks, longest first), each followed by a step at ``length``, without
            emptying the cache between them: ``l1, L, l2, L, ...``.
        mix_steps: the most steps that mix runs per candidate (16: 8 lengths, 8 long steps).
        max_rows: the upper limit (the rows the target step needs): never ramp past it.
        start_rows: the first rung.
        repeats: steps in the kept batch's timed run (at least 2 on CUDA: twice in a row).
        memory: the readings (default: the step's device); card_bytes: a smaller card.
        min_gain: off CUDA, the rows-per-second gain a doubling must bring to go on.
        on_rung: called with every rung as it is measured (progress).
        should_stop: called with every rung; once it returns True (a time budget running
            out) the search stops and keeps what it has: on CUDA the most rows a step fitted
            so far, confirmed the same way; off CUDA the rows with the most rows per second.
        too_long: called before each search rung with the seconds it should take (off CUDA
            the last rung's seconds per row x its rows; on CUDA the try and, should it fit, its
            confirmation and length mix: :func:`candidate_seconds`); True ends the search there
            and keeps what it has, as ``should_stop`` does (max_seconds must not start a rung
            it cannot finish).

    Returns:
        :class:`RampResult`. On CUDA: the most rows that fit (see :mod:`leadline.lookahead.memory.decide`);
        off CUDA: where rows per second stop improving, within the RAM room.

    Raises:
        WontFit: not even ``start_rows`` rows fit (the sentence names the peak and the room;
            the result is attached).
        InputError: a bad argument.

    Examples:
        Off CUDA, a micro-batch costing 10 ms plus 10 ms a row (rows per second 100 r / (1 + r)):

        >>> from leadline.memory_readings import FixedMemory
        >>> Host = lambda: FixedMemory(total=8 * 10**9, free=7 * 10**9, held=10**9)  # the peak stays at what is held
        >>> from leadline.memory.step import StepTiming
        >>> def step(rows, length, repeats=1):
        ...     t = 0.01 + 0.01 * rows
        ...     return StepTiming(rows, length, t, 0.001, [t] * repeats, [0.001] * repeats)
        >>> result = ramp(step, 128, memory=Host())
        >>> result.micro_batch, result.rule, result.stop, [g.rows for g in result.rungs]
        (16, 'throughput', 'no_gain', [1, 1, 2, 4, 8, 16, 32])
        >>> result.stopped_because
        'doubling 16 -> 32 rows gained +3.0% rows per second, less than 5%'
        >>> ramp(step, 128, memory=Host(), max_rows=4).micro_batch
        4
        >>> ramp(step, 0, memory=Host())
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: ramp needs length >= 1 tokens, got 0
    """
    length = int(length)
    if length < 1:
        raise InputError(f"ramp needs length >= 1 tokens, got {length}")
    if max_rows is not None and int(max_rows) < 1:
        raise InputError(f"ramp's max_rows (the rows the target step needs) must be >= 1, got {max_rows}")
    if repeats < 1:
        raise InputError(f"ramp's repeats must be >= 1, got {repeats}")
    mem = memory if memory is not None else memory_for(device_of(step), card_bytes=card_bytes)
    if mem.on_cuda:
        return _ramp_cuda(step, length, lengths, max_rows, start_rows, max(2, repeats), mix_steps, mem, on_rung,
                          should_stop, too_long)
    return _ramp_host(step, length, max_rows, repeats, mem, min_gain, on_rung, should_stop, too_long)


def _ramp_cuda(step: Any, length: int, lengths: Sequence[int] | None, max_rows: int | None, start_rows: int,
               repeats: int, mix_steps: int, mem: DeviceMemory, on_rung: Callable[[Rung], None] | None,
               should_stop: Callable[[Rung], bool] | None = None,
               too_long: Callable[[float], bool] | None = None) -> RampResult:
    from leadline.memory.cap import forbid_spill

    t0 = time.perf_counter()
    rungs: list[Rung] = []
    kept_timing: Any = None
    search = RampSearch(max_rows=max_rows, start_rows=start_rows)
    mix = confirmation_lengths(length, lengths, mix_steps)
    cap = forbid_spill(memory=mem)
    watch = cap.watch
    assert watch is not None
    first = watch.read("ramp start")
    start_room, least_room = first["room_bytes"], first["cap_bytes"]

    least_space = start_room

    def run(rows: int, n: int, reps: int, phase: str, empty: bool) -> tuple[Rung, Any]:
        nonlocal least_room, least_space
        rung, timing = probe(step, mem, rows, n, reps, phase, empty)
        reading = watch.read(f"after {rows} rows x {n} tokens")
        least_room = min(least_room, reading["cap_bytes"])
        least_space = min(least_space, reading["room_bytes"])
        rungs.append(rung)
        if on_rung is not None:
            on_rung(rung)
        if should_stop is not None and not search.hurried and should_stop(rung):
            search.hurry("max_seconds")
        return rung, timing

    try:
        while (move := search.next()) is not None:
            kind, rows = move
            if kind == "try" and too_long is not None and not search.hurried:
                forecast = candidate_seconds(rungs, rows, length, repeats, mix)
                if forecast is not None and too_long(forecast):
                    search.hurry("max_seconds")  # the try and the confirmation it would start do not fit
                    continue
            if kind == "try":
                search.record("try", rows, run(rows, length, 1, "search", True)[0].verdict == "fits")
                continue
            mem.empty_cache()  # the repeats from an emptied cache, never emptied between them
            rung, timing = run(rows, length, repeats, "confirm", False)
            ok = rung.verdict == "fits"
            if ok and mix:
                # the repeats left a full-length layout in the cache, which hides the retry a
                # run meets from an empty cache (its start, and after every retry it pays)
                mem.empty_cache()
            # l1, L, l2, L, ...: any retry or OOM, at a mix length or at the long step after
            # one, fails the candidate; the search then confirms the rung below the same way
            for n in mix if ok else []:
                if run(rows, n, 1, "mix", False)[0].verdict != "fits":
                    ok = False
                    break
            search.record("confirm", rows, ok)
            if ok:
                kept_timing = timing
    finally:
        report = cap.lift() if cap.owner else cap.watch.report()  # type: ignore[union-attr]
    moves = [m for m in report.cap_moves if m["t"] >= first["t"]]
    result = RampResult(
        micro_batch=search.kept or 0, length=length,
        t_micro_seconds=getattr(kept_timing, "t_micro_seconds", None),
        t_step_seconds=getattr(kept_timing, "t_step_seconds", None),
        rungs=rungs, device=mem.device, rule="allocator", stopped_because=search.stopped_because, stop=search.stop,
        budget_bytes=least_room, start_room_bytes=start_room,
        outside_growth_bytes=max(0, start_room - least_space),
        cap_moves=moves, max_rows=max_rows, lengths_mix=mix[0::2],
        micro_seconds=list(getattr(kept_timing, "micro_seconds", [])),
        step_seconds=list(getattr(kept_timing, "step_seconds", [])),
        seconds=time.perf_counter() - t0,
    )
    if result.micro_batch == 0:
        raise WontFit(nothing_fits(result), result)
    return result


def candidate_seconds(rungs: Sequence[Rung], rows: int, length: int, repeats: int,
                      mix: Sequence[int]) -> float | None:
    """What a CUDA try at ``rows`` costs if it fits: the try, the confirmation's ``repeats`` and
    the length mix's steps after it. A step's seconds are the line through the last two
    full-length search rungs that fitted (a fixed cost and a cost a row; never below the last
    rung's), or with one such rung its seconds a row (an overestimate, never an under-); a mix
    step at n tokens pays the rows' share n/length. None before any rung fitted.

    Examples:
        Two fitted rungs, 1.0 s at 1 row and 1.5 s at 2: 0.5 s fixed plus 0.5 s a row. A try at 4
        rows (2.5 s), its 2 repeats and a mix of 256 then 512 tokens (1.5 s + 2.5 s):

        >>> rungs = [Rung(1, 512, None, None, 0, "fits", 1.0), Rung(2, 512, None, None, 0, "fits", 1.5)]
        >>> candidate_seconds(rungs, 4, 512, 2, [256, 512])
        11.5
        >>> candidate_seconds([Rung(1, 512, None, None, 0, "oom", 1.0)], 1, 512, 2, []) is None
        True
    """
    fitted = [r for r in rungs if r.verdict == "fits" and r.length == length and r.rows > 0 and r.phase == "search"]
    if not fitted:
        return None
    last = fitted[-1]
    prev = next((r for r in reversed(fitted) if r.rows < last.rows), None)
    per_row = last.seconds / last.rows
    fixed = 0.0
    if prev is not None:
        per_row = max(0.0, (last.seconds - prev.seconds) / (last.rows - prev.rows))
        fixed = max(0.0, last.seconds - per_row * last.rows)
    full = max(last.seconds, fixed + per_row * rows)
    return full * (1 + repeats) + sum(fixed + per_row * rows * n / length for n in mix)


def _ramp_host(step: Any, length: int, max_rows: int | None, repeats: int, mem: DeviceMemory, min_gain: float,
               on_rung: Callable[[Rung], None] | None, should_stop: Callable[[Rung], bool] | None = None,
               too_long: Callable[[float], bool] | None = None) -> RampResult:
    t0 = time.perf_counter()
    warm, _ = probe(step, mem, 1, length, 1, "warmup", False)  # lazy initialisation, not timed
    rungs: list[Rung] = [warm]
    room = mem.room()
    if warm.verdict != "fits":
        refused = RampResult(micro_batch=0, length=length, t_micro_seconds=None, t_step_seconds=None, rungs=rungs,
                             device=mem.device, rule="throughput", stopped_because="1 row ran out of host memory",
                             stop="out_of_memory", budget_bytes=room, start_room_bytes=room, max_rows=max_rows,
                             seconds=time.perf_counter() - t0)
        raise WontFit(f"not even 1 row at {length} tokens runs on {mem.device}: the allocator refused it", refused)
    search = ThroughputSearch(room_bytes=room, max_rows=max_rows, min_gain=min_gain, baseline_bytes=mem.reserved())
    timings: dict[int, Any] = {}
    while (rows := search.next()) is not None:
        last = rungs[-1]
        if (too_long is not None and search.points and last.seconds
                and too_long(last.seconds * rows / max(1, last.rows))):
            search.hurry("max_seconds")  # the next rung, at the last one's seconds a row, would not fit
            continue
        rung, timing = probe(step, mem, rows, length, repeats, "search", False)
        rungs.append(rung)
        if on_rung is not None:
            on_rung(rung)
        if rung.verdict != "fits" or not rung.rows_per_second:
            search.kept = max((r.rows for r in rungs if r.verdict == "fits" and r.phase == "search"), default=0)
            search.stopped_because = f"{rows} rows ran out of host memory"
            search.stop = "out_of_memory"
            break
        timings[rows] = timing
        repeats_s = [t for t in getattr(timing, "micro_seconds", None) or [] if t > 0]
        search.record(rows, rung.rows_per_second, rung.peak_bytes or 0, [rows / t for t in repeats_s])
        if should_stop is not None and should_stop(rung):
            search.hurry("max_seconds")
    kept = search.kept or 0
    timing = timings.get(kept)
    result = RampResult(
        micro_batch=kept, length=length,
        t_micro_seconds=getattr(timing, "t_micro_seconds", None),
        t_step_seconds=getattr(timing, "t_step_seconds", None),
        rungs=rungs, device=mem.device, rule="throughput",
        stopped_because=search.stopped_because, stop=search.stop,
        budget_bytes=room, start_room_bytes=room, max_rows=max_rows,
        micro_seconds=list(getattr(timing, "micro_seconds", [])),
        step_seconds=list(getattr(timing, "step_seconds", [])),
        seconds=time.perf_counter() - t0,
    )
    if kept == 0:
        raise WontFit(nothing_fits(result), result)
    return result


def nothing_fits(result: RampResult) -> str:
    """The sentence for a ramp that kept nothing: the rung at the fewest rows that failed (a
    search OOM, or a retry in the repeats or the length mix), its peak, and the fix.

    Examples:
        >>> import textwrap
        >>> oom = Rung(1, 2048, 5_800_000_000, 5_900_000_000, 0, "oom", 0.4)
        >>> result = RampResult(0, 2048, None, None, [oom], "cuda:0", "allocator", "not even 1 row fit",
        ...                     budget_bytes=5_900_000_000)
        >>> print(textwrap.fill(nothing_fits(result), 100))
        not even 1 row at 2048 tokens fits on cuda:0: the step ran out of memory (peak 5.80 GB before it
        stopped) against 5.90 GB of room; shorten the length, turn on gradient checkpointing or lower the
        LoRA rank
    """
    fewest = min((r.rows for r in result.rungs), default=1)
    at = [r for r in result.rungs if r.rows == fewest]
    bad = next((r for r in reversed(at) if r.verdict != "fits"), at[-1] if at else None)
    rows = f"{fewest} row{'s' if fewest != 1 else ''}"
    head = f"not even {rows} at {result.length} tokens fits on {result.device}"
    room = f"{format_bytes(result.budget_bytes)} of room"
    fixes = "shorten the length, turn on gradient checkpointing or lower the LoRA rank"
    if bad is None:
        return f"{head}: no step ran against {room}; {fixes}"
    where = {"confirm": "on a repeat",
             "mix": f"at {bad.length} tokens through the corpus's length mix"}.get(bad.phase, "")
    if bad.verdict == "squeezed":
        return (f"{head}: the step {where + ' ' if where else ''}ran only because the allocator emptied its cache and "
                f"retried (peak {format_bytes(bad.peak_bytes)} allocated, {format_bytes(bad.reserved_bytes)} reserved, "
                "against "
                f"{room}); {fixes}, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against the fragmentation")
    peak = f" (peak {format_bytes(bad.peak_bytes)} before it stopped)" if bad.peak_bytes else ""
    what = "ran out of memory" if bad.verdict == "oom" else f"met {bad.verdict}"
    return f"{head}: the step {where + ' ' if where else ''}{what}{peak} against {room}; {fixes}"
