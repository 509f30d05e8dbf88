"""derive_for() inside a torchrun job whose model is sharded by FSDP: the pieces of a
:class:`~leadline.hf.Task` that run through the sharded model, every rank in step.

Under FSDP every forward and backward is a collective (parameters all-gathered, gradients
reduce-scattered), so no rank may run a forward the others do not run. :class:`ShardedWorldTask`
hands derive():

- ``grad_fn()`` — a :class:`~leadline.lookahead.distributed.ShardedGradFn` (the noise from each rank's
  shard, one all-reduce of three sums a draw), which also gives the anchor the whole tensors'
  norms (``weight_norms``);
- ``step_fn()`` — a :class:`ShardedTrainingStep`: the real training step at lr 0 through the
  sharded model, and ``lockstep_memory``, the memory phase (:func:`lockstep_ramp`);
- ``train_step_of(micro_batch, grad_accum)`` — the world's step is micro_batch x grad_accum x
  W rows, rank r takes micro-batches r, r + W, ... of it, each rank's mean loss scaled by
  W t_r / T so FSDP's averaged reduce-scatter leaves the token-weighted mean of the world's
  step; a non-finite loss is agreed before any rank enters the backward;
- ``held_out_losses()`` — rank r reads rows r, r + W, ..., every rank the same number of
  forwards of the same number of rows (the short rank repeats a row and drops its loss), the
  losses gathered back in the rows' order.

The lockstep ramp: doubling, then bisection, then confirmation
(:class:`~leadline.lookahead.memory.decide.RampSearch`), one real step on every rank per rung; each rank's
outcome (out of memory, an allocator retry, its peak) is all-gathered before the next rung and
a rung fits only where it fitted on every rank. The kept rows are confirmed by ``repeats`` steps
in a row at the same shape, which time ``t_micro``/``t_step`` (the slowest rank's medians), then
on CUDA, as the one-process ramp does, from an emptied cache through the corpus's length mix,
longest first, the full length after each (:func:`~leadline.memory.probe.confirmation_lengths`):
a retry or an OOM there on any rank fails the candidate on every rank.

An out-of-memory (or any error) inside a ramp's sharded step on one rank only leaves the others
inside a collective no agreement can reach: the failing rank waits a few seconds for every
rank's mark in the job's store, and when one is missing it aborts the job's process groups and
every rank raises :class:`~leadline.lookahead.distributed.stopline.WorldAborted` with its sentence
(:mod:`~leadline.lookahead.distributed.stopline`); derive cannot go on after it. The same OOM on every
rank at the same step (identical cards and shapes) is a measurement on every rank. Outside the
ramp (the noise draws, the rate phases' steps, the held-out reads), where no failure is a
measurement, any failure on a rank stops every rank the same way
(:meth:`~leadline.lookahead.distributed.stopline.StopLine.guard`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from leadline.errors import InputError
from leadline.lookahead.distributed.agree import agreed
from leadline.lookahead.distributed.job import check_same_everywhere, rows_digest, step_share
from leadline.lookahead.distributed.sharded import ShardedGradFn, _local
from leadline.lookahead.distributed.stopline import StopLine
from leadline.memory.step import TrainingStep
from leadline.plan import Value

VERDICTS = ("fits", "squeezed", "oom")
"""A rung's verdicts, all-gathered as their index."""

ORIG_PARAMS_SENTENCE = (
    "the model is wrapped by FullyShardedDataParallel without use_orig_params=True, so its trained tensors are flat "
    "buffers leadline cannot name or snapshot; wrap it with FullyShardedDataParallel(..., use_orig_params=True) or "
    "shard it with fully_shard"
)


def check_supported(model: Any) -> None:
    """Refuse, with one sentence (:data:`ORIG_PARAMS_SENTENCE`), a sharding derive_for cannot run
    through: FSDP1 without ``use_orig_params``. Any other model passes.

    Examples:
        >>> import torch
        >>> check_supported(torch.nn.Linear(4, 2)) is None
        True
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    if any(isinstance(m, FullyShardedDataParallel) and not getattr(m, "_use_orig_params", False)
           for m in model.modules()):
        raise InputError(ORIG_PARAMS_SENTENCE)


def free_gathered(model: Any) -> None:
    """Free the parameters FSDP keeps gathered after a forward that no backward follows.

    Neither ``FullyShardedDataParallel`` nor ``fully_shard`` reshards the root module after its
    forward (the backward is expected to use its parameters), and the next forward reuses what
    it gathered: a weight written into the shards in between (a snapshot put back, a step along
    a line) is not read, and the held-out loss stays the old weights'. Every forward derive runs
    without a backward is a held-out read; this runs after each. A model with no sharded part
    is left as it is.

    Examples:
        >>> import torch
        >>> model = torch.nn.Linear(4, 2)
        >>> free_gathered(model)           # nothing sharded, nothing gathered: a no-op
        >>> model.weight.shape
        torch.Size([2, 4])
    """
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp._runtime_utils import _reshard

    for m in FullyShardedDataParallel.fsdp_modules(model):
        handle = getattr(m, "_handle", None)
        if handle is not None and handle.uses_sharded_strategy:
            _reshard(m, handle, True)
    try:
        from torch.distributed.fsdp import FSDPModule  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - torch before FSDP2
        return
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


class ShardedTrainingStep(TrainingStep):
    """A :class:`~leadline.memory.TrainingStep` through the sharded model, and the memory phase
    that runs it on every rank in step (``lockstep_memory``: derive()'s ``_memory`` calls it in a job).

    Examples:
        The memory phase on a world of one rank (its collectives return its own part), a
        ``Linear(4, 2)`` standing for the sharded model, the ramp held to 2 rows:

        >>> import torch
        >>> class One:
        ...     rank, world_size = 0, 1
        ...     def all_gather(self, values): return [list(values)]
        ...     def gather_object(self, obj): return [obj]
        >>> model = torch.nn.Linear(4, 2)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> step = ShardedTrainingStep(lambda rows, length: model(torch.ones(rows, length, 4)).pow(2).mean(), opt,
        ...                            One())
        >>> ramp, values = step.lockstep_memory(8, max_rows=2)
        >>> ramp.micro_batch, ramp.rule, ramp.stopped_because
        (2, 'lockstep', 'reached the upper limit of 2 rows')
        >>> sorted(values), values["rows_fit"].value
        (['rows_fit', 't_micro_seconds', 't_step_seconds'], 2)
    """

    def __init__(self, loss_of: Callable[[int, int], Any], optimizer: Any, world: Any) -> None:
        super().__init__(loss_of, optimizer)
        self.world = world

    def lockstep_memory(self, length: int, *, lengths: Sequence[int] | None = None, max_rows: int | None = None,
                        start_rows: int = 1,
                        should_stop: Callable[[Any], bool] | None = None) -> tuple[Any, dict[str, Value]]:
        """:func:`lockstep_ramp` at ``length`` tokens and its plan values (:func:`lockstep_values`)."""
        res, ranks = lockstep_ramp(self, self.world, length, lengths=lengths, max_rows=max_rows, start_rows=start_rows,
                                   should_stop=should_stop)
        return res, lockstep_values(res, ranks, self.world)


def _mix_on(mem: Any) -> bool:
    """Whether the confirmation runs the length mix: on CUDA, where the allocator's layout can
    make a shorter step's cache fail a full-length one (off CUDA nothing retries)."""
    return getattr(mem.device, "type", None) == "cuda"


def lockstep_ramp(step: Any, world: Any, length: int, *, lengths: Sequence[int] | None = None,
                  max_rows: int | None = None,
                  start_rows: int = 1, repeats: int = 3, mix_steps: int = 16,
                  should_stop: Callable[[Any], bool] | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """The rows a training step fits at ``length`` tokens on every rank, one rung at a time on
    every rank (see the module). ``lengths`` (the corpus's) and ``mix_steps`` make the length mix
    the candidate is confirmed through on CUDA. Returns this rank's
    :class:`~leadline.memory.RampResult`, its timings the slowest rank's, and every rank's rungs
    (``[{"rank", "rungs"}]``).

    Raises:
        WontFit: on every rank, when not even ``start_rows`` rows fit on every rank.

    Examples:
        On a world of one rank (its collectives return its own part), a ``Linear(4, 2)``
        standing for the sharded model: doubling to the limit of 2 rows, then 3 steps in a row
        to confirm them.

        >>> import torch
        >>> from leadline.memory import TrainingStep
        >>> class One:
        ...     rank, world_size = 0, 1
        ...     def all_gather(self, values): return [list(values)]
        ...     def gather_object(self, obj): return [obj]
        >>> model = torch.nn.Linear(4, 2)
        >>> step = TrainingStep(lambda rows, length: model(torch.ones(rows, length, 4)).pow(2).mean(),
        ...                     torch.optim.SGD(model.parameters(), lr=0.1))
        >>> ramp, ranks = lockstep_ramp(step, One(), 8, max_rows=2)
        >>> [(r.rows, r.phase, r.verdict) for r in ramp.rungs]
        [(1, 'search', 'fits'), (2, 'search', 'fits'), (2, 'confirm', 'fits')]
        >>> [(r["rows"], r["verdict"]) for r in ranks[0]["rungs"]]       # what rank 0 read, for the evidence
        [(1, 'fits'), (2, 'fits'), (2, 'fits')]
    """
    from leadline.lookahead.memory.decide import RampSearch
    from leadline.lookahead.memory.ramp import RampResult, WontFit, nothing_fits
    from leadline.memory.probe import confirmation_lengths
    from leadline.memory_readings import memory_for

    t0 = time.perf_counter()
    mem = memory_for(step.device)
    search = RampSearch(max_rows=max_rows, start_rows=start_rows)
    mix = confirmation_lengths(length, lengths, mix_steps) if _mix_on(mem) else []
    ls = _Lockstep(step, world, mem)
    kept: tuple[list[float], list[float], float, float] | None = None
    while (move := search.next()) is not None:
        kind, rows = move
        reps, phase = (1, "search") if kind == "try" else (repeats, "confirm")
        rung, timing, got = ls.everywhere(rows, length, reps, phase, True)
        ok = all(int(g[0]) == 0 for g in got)
        if ok:
            ls.fitted = max(ls.fitted, rows)
        if ok and kind == "confirm" and mix:
            ok = ls.through_mix(rows, mix)
        search.record(kind, rows, ok)
        if ok and kind == "confirm":
            kept = ls.slowest(timing, got)
        if should_stop is not None and not search.hurried and world.all_max(float(bool(should_stop(rung)))) > 0:
            search.hurry("max_seconds")
    result = RampResult(
        micro_batch=search.kept or 0, length=int(length),
        t_micro_seconds=kept[2] if kept else None, t_step_seconds=kept[3] if kept else None,
        rungs=ls.rungs, device=mem.device, rule="lockstep", stopped_because=search.stopped_because, stop=search.stop,
        max_rows=max_rows, lengths_mix=mix[0::2], micro_seconds=kept[0] if kept else [],
        step_seconds=kept[1] if kept else [],
        seconds=time.perf_counter() - t0,
    )
    if result.micro_batch == 0:
        raise WontFit(nothing_fits(result) + f" (on at least one of {world.world_size} ranks, through the sharded "
                                             "model)", result)
    return result, ls.ranks


class _Lockstep:
    """The lockstep ramp's rungs, each on every rank: the step, the card's memory, the stop line
    that ends the job when one rank fails inside the sharded step, and what every rank read."""

    def __init__(self, step: Any, world: Any, mem: Any) -> None:
        self.step, self.world, self.mem = step, world, mem
        self.rungs: list[Any] = []
        self.ranks: list[dict[str, Any]] = [{"rank": r, "rungs": []} for r in range(world.world_size)]
        self.line = StopLine(world)
        self.fitted = 0  # the most rows that fitted on every rank so far (for the stop's sentence)

    def everywhere(self, rows: int, n: int, reps: int, phase: str, empty: bool) -> tuple[Any, Any, list[list[float]]]:
        """One rung on every rank; every rank's outcome, all-gathered. A rank that ran out of
        memory (or failed) inside the sharded step while another is still inside its
        collectives stops the job with one sentence on every rank (:mod:`~leadline.lookahead.distributed.stopline`)."""
        from leadline.memory.probe import probe

        world = self.world
        what = f"the lockstep ramp's step at {rows} rows x {n} tokens"
        error: Exception | None = None
        got_rung: Any = None
        t1 = time.perf_counter()
        with self.line.watching():
            try:
                got_rung = probe(self.step, self.mem, rows, n, reps, phase, empty)
            except Exception as e:  # agreed below, unless a rank stopped the job
                stop = self.line.stopped()
                if stop is not None:
                    raise stop from e
                error = e
        oom = error is None and got_rung[0].verdict == "oom"
        self.line.left(error is not None or oom, lambda inside: self._sentence(what, oom, error, inside), oom,
                       wait_s=3.0 * (time.perf_counter() - t1))

        def outcome() -> Any:
            if error is not None:
                raise error
            return got_rung

        rung, timing = agreed(world, outcome, what)
        self.rungs.append(rung)
        got = world.all_gather([float(VERDICTS.index(rung.verdict)), float(rung.peak_bytes or 0), float(rung.retries),
                                getattr(timing, "t_micro_seconds", 0.0), getattr(timing, "t_step_seconds", 0.0)])
        for r, g in enumerate(got):
            self.ranks[r]["rungs"].append({"rows": rows, "length": n, "phase": phase, "verdict": VERDICTS[int(g[0])],
                                           "peak_bytes": int(g[1]), "retries": int(g[2])})
        return rung, timing, got

    def _sentence(self, what: str, oom: bool, error: Exception | None, inside: list[int]) -> str:
        """The stop line's sentence: which rank failed how, while which stayed inside the collectives."""
        world = self.world
        how = "ran out of memory" if oom else f"failed ({type(error).__name__}: {error})"
        fix = (f"the other ranks' cards held that step: free memory on rank {world.rank}'s card and derive again"
               + (f" (the most rows that fitted on every rank so far: {self.fitted})" if self.fitted else "")
               if oom else "fix that error and derive again")
        return (f"{what} {how} on rank {world.rank} of {world.world_size} inside the sharded model's forward or "
                "backward "
                f"while rank(s) {', '.join(map(str, inside))} stayed inside its collectives, so leadline aborted "
                "the job's "
                f"process groups (FSDP cannot go on past one rank's failure there); {fix}")

    def through_mix(self, rows: int, mix: Sequence[int]) -> bool:
        """The confirmed rows through the corpus's length mix, on every rank: True when every rung fits."""
        # the repeats left a full-length layout in the cache: the mix starts from an emptied
        # one, as a run does (and as it is after every retry it pays)
        self.mem.empty_cache()
        for n in mix:
            if any(int(g[0]) != 0 for g in self.everywhere(rows, n, 1, "mix", False)[2]):
                return False
        return True

    def slowest(self, timing: Any, got: list[list[float]]) -> tuple[list[float], list[float], float, float]:
        """The slowest rank's timings of a confirmed rung (micro-batch and step apart), each rank's on its record."""
        world = self.world
        slow_micro = max(range(world.world_size), key=lambda r: got[r][3])
        slow_step = max(range(world.world_size), key=lambda r: got[r][4])
        reps_of = world.gather_object((list(timing.micro_seconds), list(timing.step_seconds)))
        kept = (reps_of[slow_micro][0], reps_of[slow_step][1], got[slow_micro][3], got[slow_step][4])
        for r in range(world.world_size):
            self.ranks[r].update(t_micro_seconds=got[r][3], t_step_seconds=got[r][4])
        return kept


def lockstep_values(res: Any, ranks: list[dict[str, Any]], world: Any) -> dict[str, Value]:
    """The plan's ``rows_fit``, ``t_micro_seconds``, ``t_step_seconds`` from :func:`lockstep_ramp`:
    the rows that fitted on every rank, and the slowest rank's timings of them.

    Examples:
        A ramp on a world of one rank (its collectives return its own part), as in
        :func:`lockstep_ramp`:

        >>> import torch
        >>> from leadline.memory import TrainingStep
        >>> class One:
        ...     rank, world_size = 0, 1
        ...     def all_gather(self, values): return [list(values)]
        ...     def gather_object(self, obj): return [obj]
        >>> model = torch.nn.Linear(4, 2)
        >>> step = TrainingStep(lambda rows, length: model(torch.ones(rows, length, 4)).pow(2).mean(),
        ...                     torch.optim.SGD(model.parameters(), lr=0.1))
        >>> values = lockstep_values(*lockstep_ramp(step, One(), 8, max_rows=2), One())
        >>> values["rows_fit"].value, values["rows_fit"].evidence["world_size"]
        (2, 1)
        >>> values["t_micro_seconds"].source
        'the slowest of 1 ranks (rank 0): median of 3 synchronized forward+backward passes of 2 rows x 8 tokens ...'
    """
    w = world.world_size
    shape = f"{res.micro_batch} rows x {res.length} tokens"
    slow_micro = max(range(w), key=lambda r: ranks[r].get("t_micro_seconds", 0.0))
    slow_step = max(range(w), key=lambda r: ranks[r].get("t_step_seconds", 0.0))
    ev = {**res.evidence(), "ranks": ranks, "world_size": w}
    n = len(res.micro_seconds)
    mix = (f", then from an emptied cache through the corpus's length mix ({len(res.lengths_mix)} lengths, longest "
           "first, "
           f"the full length after each)" if res.lengths_mix else "")
    return {
        "rows_fit": Value(res.micro_batch, "measured",
                          f"the lockstep ramp through the sharded model on {w} ranks: the most rows at {res.length} "
                          "tokens whose real "
                          "training step (at lr 0, the optimizer's state held) ran on every rank without running out "
                          "of memory or an "
                          f"allocator retry, then {n} steps in a row at that shape{mix} ({res.stopped_because})",
                          ev, res.seconds, "rows"),
        "t_micro_seconds": Value(res.t_micro_seconds, "measured",
                                 f"the slowest of {w} ranks (rank {slow_micro}): median of {n} synchronized "
                                 "forward+backward passes of "
                                 f"{shape} through the sharded model (its all-gathers and reduce-scatters included)",
                                 {"ranks": ranks, "repeats_seconds": res.micro_seconds}, 0.0, "s"),
        "t_step_seconds": Value(res.t_step_seconds, "measured",
                                f"the slowest of {w} ranks (rank {slow_step}): median of {n} synchronized optimizer "
                                f"updates of the shards after {shape}",
                                {"ranks": ranks, "repeats_seconds": res.step_seconds}, 0.0, "s"),
    }


class ShardedWorldTask:
    """The FSDP side of a :class:`~leadline.hf.Task` (see the module).

    Args:
        task: the :class:`~leadline.hf.Task`, built on the sharded model (the forward goes
            through it).
        params: the trained tensors as the sharded model holds them.
        world: the :class:`~leadline.lookahead.distributed.World`.

    Raises:
        InputError: FSDP1 without ``use_orig_params`` (:data:`ORIG_PARAMS_SENTENCE`), or the
            ranks' tokenized rows differ; on every rank.

    Examples:
        Rank 0 of two, each holding a shard of 6 of a tensor's 12 entries (the replies stand
        for rank 1 holding the same rows and as many entries):

        >>> import torch
        >>> from types import SimpleNamespace
        >>> class RankZeroOfTwo:
        ...     rank, world_size, group = 0, 2, None
        ...     def gather_object(self, obj): return [obj, obj]
        ...     def all_reduce(self, values, op="sum"): return [2 * v for v in values]
        >>> rows = [SimpleNamespace(input_ids=[1, 2, 3], labels=[-100, 2, 3])]
        >>> task = SimpleNamespace(model=torch.nn.Linear(4, 2), rows=rows, order=[0], device="cpu")
        >>> sharded = ShardedWorldTask(task, list(task.model.parameters()), RankZeroOfTwo())
        >>> sharded.world_numel([torch.zeros(6)])        # the whole tensor's entries
        12
    """

    def __init__(self, task: Any, params: list[Any], world: Any) -> None:
        check_supported(task.model)
        self.task, self.params, self.world = task, params, world
        self.line = StopLine(world)  # a failure on one rank inside FSDP's collectives stops every rank
        self.notes: list[str] = []
        self._noise: ShardedGradFn | None = None
        check_same_everywhere(world, "the tokenized training rows", rows_digest(task.rows, task.order),
                              "give every rank the same data file, tokenizer and seed")

    def grad_fn(self) -> ShardedGradFn:
        """derive()'s noise source: :class:`ShardedGradFn` on the sharded model, each draw guarded
        by the stop line."""
        self._noise = ShardedGradFn(self.task.model, self.task.micro_batch_of, self.params, group=self.world.group,
                                    guard=lambda what: self.line.guard(what, passthrough=(InputError,)))
        return self._noise

    def step_fn(self) -> ShardedTrainingStep:
        """derive()'s training step and memory phase through the sharded model."""
        return ShardedTrainingStep(self.task.loss_of, self.task.optimizer, self.world)

    def world_numel(self, tensors: list[Any]) -> int:
        """The entries of the whole ``tensors``: each rank's shards' entries, summed over the ranks
        (see the class's example)."""
        return int(self.world.all_reduce([float(sum(_local(t.detach()).numel() for t in tensors))], "sum")[0])

    def train_step_of(self, micro_batch: int, grad_accum: int) -> Callable[[int], float]:
        """``train_step(step)``: this rank's share of the world's step ``step`` through the
        sharded model; returns the world's token-weighted mean loss (the same on every rank)."""
        import torch

        task, world = self.task, self.world
        n_w = world.world_size

        def train_step(step: int) -> float:
            with self.line.guard(f"the sharded training step {step}", passthrough=(InputError,)):
                return one_step(step)

        def one_step(step: int) -> float:
            mine, total = step_share(task, world, step, micro_batch, grad_accum)
            loss_sum = 0.0
            for k, m in enumerate(mine):
                with torch.enable_grad():
                    out = task.model(**m.to(task.device).model_inputs())
                    if m.scored_tokens:
                        value = float(out.loss.detach())
                        loss = out.loss * (n_w * m.scored_tokens / total)
                    else:  # nothing scored here: the backward still runs, for the world's collectives
                        value, loss = 0.0, out.logits.sum() * 0.0
                bad = world.all_reduce([float(not math.isfinite(value))], "sum")[0]
                if bad:  # agreed before the backward, whose collectives every rank must enter
                    raise InputError(f"the loss of step {step}'s micro-batch {k} is not finite on {int(bad)} rank(s) "
                                     "under FSDP "
                                     "(the sharded model's step); check these rows and the model's dtype")
                loss.backward()
                loss_sum += value * m.scored_tokens
                del out, loss
            return world.all_reduce([loss_sum], "sum")[0] / total

        return train_step

    def held_out_losses(self) -> Callable[[], list[float]]:
        """The held-out rows' losses, each rank reading every W-th row in as many forwards as
        every other rank, gathered in order."""
        from leadline.corpus.losses import MAX_TOKENS, row_losses

        task, world = self.task, self.world
        rows = [task.rows[i] for i in task.split.held_out]
        if not rows:
            raise InputError("the split has no held_out rows; give split_rows a larger held_out")
        w = world.world_size
        mine = rows[world.rank::w]
        # the same count on every rank
        padded = mine + [mine[-1] if mine else rows[0]] * (-(-len(rows) // w) - len(mine))
        per_forward = max(1, MAX_TOKENS // max(len(r.input_ids) for r in rows))  # the same on every rank

        def losses() -> list[float]:
            def read() -> list[float]:
                try:
                    with self.line.guard("the sharded held-out read"):
                        return row_losses(task.model, padded, per_forward, task.device, pad_id=task.pad_id)[:len(mine)]
                finally:
                    free_gathered(task.model)

            local = agreed(world, read, "the held-out read")
            parts = world.gather_object([float(x) for x in local])
            out: list[float] = [0.0] * len(rows)
            for r, part in enumerate(parts):
                out[r::w] = part
            return out

        return losses

    def close(self) -> None:
        """Put back the ``.grad`` the noise probe found and free what a forward left gathered (the
        caller's next forward reads the shards derive put back)."""
        if self._noise is not None:
            self._noise.close()
            self._noise = None
        free_gathered(self.task.model)
