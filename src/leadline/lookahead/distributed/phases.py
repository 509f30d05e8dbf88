"""derive()'s phases inside a job: the runner that keeps the ranks in step, the memory phase
that takes the least card, and the step that counts the whole world.

- :class:`AgreedPhaseRunner` — :class:`~leadline.lookahead.runner.PhaseRunner` whose every phase ends in
  an agreement (:func:`~leadline.lookahead.distributed.agree.agreed`), whose time budget is the least
  left on any rank (so every rank skips the same phases, and a look-ahead cut by
  ``max_seconds`` is cut at the same step on every rank), and whose resume file is rank 0's
  (read by rank 0 and broadcast; written by rank 0 only).
- :func:`world_memory` — every rank ramps its own card; the plan takes the least micro-batch
  (an all-gather), the ranks that kept more re-time at that shape, and the timings are the
  slowest rank's; the all-reduce of the trained gradients is timed as DDP sends it.
- :func:`world_step` — B* with the world's micro-batch: a step of B tokens on W GPUs costs
  (B / (W m)) t_micro + t_step + t_allreduce, so B* = sqrt(B_noise × W m × (t_step +
  t_allreduce) / t_micro) (McCandlish et al. 2018, B* with W micro-batches in
  parallel); the micro-batch is per GPU and tokens per step count micro × accum × W.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leadline.errors import InputError
from leadline.lookahead.budget import OutOfTime
from leadline.lookahead.distributed.agree import agreed
from leadline.lookahead.runner import PhaseRunner
from leadline.plan import Plan, Value

BUCKET_BYTES = 25 * 1024 * 1024
"""DDP's default bucket (``bucket_cap_mb=25``): the all-reduce is timed in buckets of this size."""


@dataclass
class AgreedPhaseRunner(PhaseRunner):
    """A :class:`~leadline.lookahead.runner.PhaseRunner` for a job (see the module).

    Every rank builds one and runs the same phases in the same order: each phase is an
    agreement (a failure on any rank is the same :class:`~leadline.lookahead.distributed.RankFailed` on
    every rank), the time left is the least on any rank, and only rank 0 reads and writes the
    resume file.

    Examples:
        Rank 0 of two, where rank 1 has 5 s left and its next phase fails (the replies are rank
        1's side of each collective):

        >>> from leadline.lookahead.runner import Values
        >>> from leadline.lookahead.distributed import RankFailed
        >>> class RankZeroOfTwo:
        ...     rank, world_size, is_main = 0, 2, True
        ...     def broadcast_object(self, obj, src=0): return obj
        ...     def all_min(self, value): return min(value, 5.0)
        ...     def all_gather(self, values): return [list(values), [2]]
        ...     def gather_object(self, obj): return [obj, ("derive's decay phase failed on rank 1 of 2: "
        ...                                                 "ValueError: bad row", False)]
        >>> runner = AgreedPhaseRunner(Plan(), max_seconds=60, world=RankZeroOfTwo())
        >>> runner.seconds_left()
        5.0
        >>> try:
        ...     runner.run("decay", lambda: Values({"weight_decay": Value(0.0, "constant", "no decay")}))
        ... except RankFailed as e:
        ...     print(e)
        derive's decay phase failed on rank 1 of 2: ValueError: bad row
        >>> AgreedPhaseRunner(Plan())
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: AgreedPhaseRunner needs world=, the job's World
    """

    world: Any = None

    def __post_init__(self) -> None:
        if self.world is None:
            raise InputError("AgreedPhaseRunner needs world=, the job's World")
        path = self.resume_path
        self.resume_path = None
        super().__post_init__()
        self.resume_path = Path(path) if path is not None else None
        state: Any = None
        if self.world.is_main and self.resume_path is not None and self.resume_path.exists():
            try:
                self._load()
                state = ("ok", self.finished, self.plan.to_dict(), self.extra)
            except InputError as e:
                state = ("error", str(e))
        state = self.world.broadcast_object(state)
        if state is None:
            return
        if state[0] == "error":
            raise InputError(state[1])
        if not self.world.is_main:
            saved = Plan.from_dict(state[2], origin=str(self.resume_path))
            for name, v in saved.values.items():
                self.plan.set(name, v)
            self.plan.held_out = saved.held_out or self.plan.held_out
            self.restored, self.finished, self.extra = list(state[1]), list(state[1]), dict(state[3])

    def seconds_left(self) -> float | None:
        """The least time left on any rank (an all-reduce MIN); None without ``max_seconds``."""
        if self.max_seconds is None:
            return None
        return self.world.all_min(self.max_seconds - self.elapsed())

    def ensure(self, seconds: float) -> None:
        """As :meth:`PhaseRunner.ensure`, on the slowest rank's last piece of work: the reads and
        steps it guards are collectives, so every rank must stop before the same one."""
        if self.max_seconds is not None and self.would_overrun(self.world.all_max(max(0.0, float(seconds)))):
            raise OutOfTime

    def _save(self) -> None:
        if self.world.is_main:
            super()._save()

    def done(self) -> None:
        if self.world.is_main:
            super().done()

    def _call(self, name: str, call: Callable[[], Any]) -> Any:
        return agreed(self.world, call, f"derive's {name} phase", passthrough=(OutOfTime,))


# ---- the memory phase ---------------------------------------------------------------------
def allreduce_seconds(world: Any, params: Sequence[Any], repeats: int = 5) -> dict[str, Any]:
    """Time the all-reduce of the trained gradients as DDP sends it: buckets of
    :data:`BUCKET_BYTES`, synchronized, ``repeats`` times; per repeat the slowest rank's time,
    and their median. Returns the measurement as data (``seconds`` the median).

    Examples:
        Nothing trained, nothing to time: refused before any collective.

        >>> allreduce_seconds(None, [])
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: timing the all-reduce needs the trained tensors; none were given
    """
    import torch
    import torch.distributed as dist

    numel = int(sum(p.numel() for p in params))
    if numel == 0:
        raise InputError("timing the all-reduce needs the trained tensors; none were given")
    dtype = params[0].dtype
    elem = torch.empty(0, dtype=dtype).element_size()
    bucket = max(1, min(numel, BUCKET_BYTES // elem))
    n_buckets = -(-numel // bucket)
    buf = agreed(world, lambda: torch.zeros(bucket, dtype=dtype, device=world.device), "the all-reduce timing's buffer")
    dist.all_reduce(buf, group=world.group)  # the first call sets up the channels: not timed
    mine = []
    for _ in range(repeats):
        world.barrier()
        world.synchronize()
        t0 = time.perf_counter()
        for _ in range(n_buckets):
            dist.all_reduce(buf, group=world.group)
        world.synchronize()
        mine.append(time.perf_counter() - t0)
    del buf
    per_rank = world.all_gather(mine)
    slowest = [max(r[i] for r in per_rank) for i in range(repeats)]
    return {"seconds": statistics.median(slowest), "repeats_seconds": slowest, "bytes": numel * elem,
            "buckets": n_buckets, "bucket_bytes": bucket * elem, "dtype": str(dtype).replace("torch.", ""),
            "world_size": world.world_size, "backend": world.backend}


def world_memory(world: Any, run_ramp: Callable[[], Any], step_fn: Any,
                 params: Sequence[Any]) -> tuple[Any, dict[str, Value]]:
    """The memory phase in a job: this rank's ramp (``run_ramp()``, agreed: a rank on which not
    even one row fits stops every rank with its sentence), the least kept micro-batch over the
    ranks, the timings at that shape from the slowest rank, and the all-reduce's time.

    Returns this rank's :class:`~leadline.memory.RampResult` and the plan's values
    ``rows_fit``, ``t_micro_seconds``, ``t_step_seconds``, ``t_allreduce_seconds``.

    Examples:
        A ramp that fails on a rank stops every rank with that rank's sentence (here a world of
        one rank, whose collectives return its own part):

        >>> from leadline.errors import InputError
        >>> class One:
        ...     rank, world_size = 0, 1
        ...     def all_gather(self, values): return [list(values)]
        ...     def gather_object(self, obj): return [obj]
        >>> def ramp():
        ...     raise InputError("not even one row of 4,096 tokens fits on cuda:0")
        >>> world_memory(One(), ramp, None, [])
        Traceback (most recent call last):
        ...
        leadline.lookahead.distributed.agree.RankFailed: the memory ramp failed on rank 0 of 1: not even one row ...
    """
    res = agreed(world, run_ramp, "the memory ramp")
    kept = [int(g[0]) for g in world.all_gather([float(res.micro_batch)])]
    rows = min(kept)

    def timing() -> tuple[float, float, list[float], list[float]]:
        if res.micro_batch == rows and res.t_micro_seconds is not None:
            return res.t_micro_seconds, res.t_step_seconds or 0.0, list(res.micro_seconds), list(res.step_seconds)
        t = step_fn(rows, res.length, 3)
        return t.t_micro_seconds, t.t_step_seconds, list(t.micro_seconds), list(t.step_seconds)

    t_micro, t_step, micro_reps, step_reps = agreed(world, timing, f"the timing at {rows} rows")
    times = world.all_gather([t_micro, t_step])
    slow_micro = max(range(world.world_size), key=lambda r: times[r][0])
    slow_step = max(range(world.world_size), key=lambda r: times[r][1])
    ar = allreduce_seconds(world, params)
    ranks = [{"rank": r, "rows_kept": kept[r], "t_micro_seconds": times[r][0], "t_step_seconds": times[r][1]}
             for r in range(world.world_size)]
    per_rank = ", ".join(f"rank {r}: {k}" for r, k in enumerate(kept))
    shape = f"{rows} rows x {res.length} tokens"
    ev = {**res.evidence(), "ranks": ranks, "world_size": world.world_size}
    values = {
        "rows_fit": Value(rows, "measured", f"the least of {world.world_size} ranks' ramps, each on its own card "
                                            f"({per_rank}); rank {world.rank}'s: {res.source()}",
                          ev, res.seconds, "rows"),
        "t_micro_seconds": Value(times[slow_micro][0], "measured", f"the slowest of {world.world_size} ranks (rank "
                                                                   f"{slow_micro}): median of 3 synchronized "
                                                                   f"forward+backward passes of {shape}",
                                 {"ranks": ranks, "repeats_seconds": micro_reps}, 0.0, "s"),
        "t_step_seconds": Value(times[slow_step][1], "measured", f"the slowest of {world.world_size} ranks (rank "
                                                                 f"{slow_step}): median of 3 synchronized optimizer "
                                                                 f"updates after {shape}",
                                {"ranks": ranks, "repeats_seconds": step_reps}, 0.0, "s"),
        "t_allreduce_seconds": Value(ar["seconds"], "measured",
                                     f"median of {len(ar['repeats_seconds'])} synchronized all-reduces of the trained "
                                     f"gradients ({ar['bytes']:,} bytes {ar['dtype']}, "
                                     f"{ar['buckets']} bucket(s) as DDP sends them) over {world.world_size} ranks "
                                     f"({world.backend}), the slowest rank's; "
                                     "DDP overlaps it with the backward, so as a per-step cost it is an upper bound",
                                     ar, 0.0, "s"),
    }
    return res, values


# ---- the step ---------------------------------------------------------------------------
def world_step(noise: Any, *, world_size: int, rows_fit: int, tokens_per_row: float, t_step_seconds: float,
               t_micro_seconds: float, t_allreduce_seconds: float = 0.0,
               corpus_scored_tokens: float | None = None, step_for: str = "time") -> dict[str, Value]:
    """Tokens per step over W GPUs, the micro-batch per GPU and grad_accum (pure math).

    B* = sqrt(B_noise × W m × (t_step + t_allreduce) / t_micro), m = rows_fit × tokens a row,
    clamped as :func:`~leadline.lookahead.noise.tokens_per_step` clamps it (``step_for="rows"``: then cut to
    the step for the rows, :func:`~leadline.lookahead.noise.step.rows_step_rule`, with the update and the
    all-reduce as a step's fixed seconds and a micro-batch over the world as its rows' seconds);
    rows a step are spread over
    the W GPUs (at least one row each): grad_accum = ceil(rows a step / (W rows_fit)),
    micro_batch = ceil(rows a step / (W grad_accum)); a step is micro_batch × grad_accum × W
    rows.

    Returns the plan's ``tokens_per_step`` (the world's), ``micro_batch`` (per GPU),
    ``grad_accum`` and ``world_size``.

    References:
        McCandlish et al. (2018), arXiv:1812.06162, eq. 2.11.

    Examples:
        B_noise 40,000 tokens on 2 GPUs that each fit 8 rows of 125 tokens: B* = sqrt(40,000 ×
        2 × 1,000 × (0.04 + 0.01) / 0.2) = 4,472 tokens, 36 rows; ceil(36 / (2 × 8)) = 3
        micro-batches a GPU of ceil(36 / (2 × 3)) = 6 rows.

        >>> v = world_step(40_000, world_size=2, rows_fit=8, tokens_per_row=125, t_step_seconds=0.04,
        ...                t_micro_seconds=0.2, t_allreduce_seconds=0.01)
        >>> round(v["tokens_per_step"].value), v["micro_batch"].value, v["grad_accum"].value, v["world_size"].value
        (4472, 6, 3, 2)
        >>> v["tokens_per_step"].evidence["rows_per_step"]      # 6 x 3 x 2
        36
        >>> world_step(40_000, world_size=0, rows_fit=8, tokens_per_row=125, t_step_seconds=0.04,
        ...            t_micro_seconds=0.2)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: world_step(world_size=0) needs the whole number of GPUs, >= 1
    """
    from leadline.lookahead.noise import tokens_per_step
    from leadline.lookahead.noise.step import format_tokens

    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise InputError(f"world_step(world_size={world_size!r}) needs the whole number of GPUs, >= 1")
    w = world_size
    m = rows_fit * float(tokens_per_row)
    sp = tokens_per_step(noise, rows_fit=w * rows_fit, tokens_per_micro_batch=w * m,
                         t_step_seconds=float(t_step_seconds) + float(t_allreduce_seconds),
                         t_micro_seconds=t_micro_seconds,
                         corpus_scored_tokens=corpus_scored_tokens, step_for=step_for)
    accum = sp.grad_accum
    wanted = max(w, sp.inputs["rows_wanted"])
    micro = min(rows_fit, max(1, -(-wanted // (w * accum))))
    rows_step = micro * accum * w
    clamp = f", clamped to {sp.clamped_by}" if sp.clamped_by else ""
    rule = sp.inputs.get("rows_rule")
    for_rows = "" if not rule else (
        f"; for the rows: {rule['rows']} rows of its {rule['least_time_rows']}, the fewest whose time a row is at most "
        f"its {rule['least_time_seconds_a_row']:.4g} s a row times the {rule['passes_to_its_loss']:.3g} passes it "
        "needs to its rows' loss at a small step")
    ev = {**sp.inputs, "b_star_tokens": sp.b_star_tokens, "clamped_by": sp.clamped_by, "world_size": w,
          "rows_fit_per_gpu": rows_fit, "tokens_per_micro_batch_per_gpu": m,
          "t_optimizer_seconds": float(t_step_seconds),
          "t_allreduce_seconds": float(t_allreduce_seconds), "rows_per_step": rows_step,
          "scored_tokens_per_step": rows_step * float(tokens_per_row)}
    b = sp.inputs["b_noise_tokens"]
    return {
        "tokens_per_step": Value(
            sp.tokens_per_step, "derived",
            f"B* = sqrt(B_noise {format_tokens(b)} × {w} GPUs × {format_tokens(m)} tokens a micro-batch × (t_step "
            f"{float(t_step_seconds):.4g} s + all-reduce "
            f"{float(t_allreduce_seconds):.4g} s) / t_micro {float(t_micro_seconds):.4g} s) = "
            f"{format_tokens(sp.b_star_tokens)}{clamp}: the world's step "
            f"(the least time to a loss, McCandlish et al. 2018){for_rows}; "
            f"{micro} x {accum} x {w} = {rows_step} rows, "
            f"{format_tokens(rows_step * float(tokens_per_row))} tokens",
            evidence=ev, unit="scored tokens"),
        "micro_batch": Value(
            micro, "derived",
            f"per GPU: the step's {wanted} rows over {w} GPUs in {accum} micro-batch{'es' if accum > 1 else ''} each, "
            f"{micro} rows of the {rows_fit} that fit on the smallest card" + (" (cut)" if micro < rows_fit else ""),
            evidence=ev, unit="rows"),
        "grad_accum": Value(
            accum, "derived",
            f"ceil({wanted} rows a step / ({w} GPUs x {rows_fit} that fit)) = {accum} "
            f"micro-batch{'es' if accum > 1 else ''} a GPU a step",
            evidence=ev),
        "world_size": Value(w, "measured", "torch.distributed's world size: the GPUs the data-parallel step is spread "
                                           "over", unit="GPUs"),
    }


def rows_needed_per_rank(rows_needed: int | None, world_size: int) -> int | None:
    """The ramp's upper limit on one of W cards: ceil(the step's rows / W), at least 1 (None:
    no limit).

    Examples:
        >>> rows_needed_per_rank(48, 4), rows_needed_per_rank(49, 4), rows_needed_per_rank(3, 8)
        (12, 13, 1)
        >>> rows_needed_per_rank(None, 4) is None
        True
    """
    return None if rows_needed is None else max(1, math.ceil(rows_needed / world_size))
