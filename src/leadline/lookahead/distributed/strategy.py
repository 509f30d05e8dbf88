"""derive()'s strategy in a ``torch.distributed`` job of several processes: what each phase does
with the other ranks, the :class:`~leadline.lookahead.strategy.Strategy` of a job (derive's
``OneProcess`` is the same for one process). The phases it runs are in
:mod:`leadline.lookahead.distributed.phases`; docs/distributed.md says why each is what it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from leadline.errors import InputError
from leadline.lookahead.pieces import LockstepStep, SelfMeasuringSource
from leadline.lookahead.runner import PhaseRunner, StepPhase
from leadline.plan import Plan

__all__ = ["InAJob"]


@dataclass(frozen=True)
class InAJob:
    """derive() in a job of ``world.world_size`` processes, every rank calling each method in
    the same order (each may be a collective).

    - the runner agrees every phase and takes the least time left on any rank
      (:class:`~leadline.lookahead.distributed.phases.AgreedPhaseRunner`);
    - the noise is read from DDP's all-reduce where the gradient source measures it itself;
    - every rank ramps its own card to its share of the step's rows and the plan takes the
      least (:func:`~leadline.lookahead.distributed.phases.world_memory`), a sharded model's ramp with
      every rank in step;
    - the step counts micro x accumulation x the world (:func:`~leadline.lookahead.distributed.phases.world_step`);
    - the first step takes one card's rows; there is no burn-in past the format;
    - every rank returns rank 0's plan, checked by its digest.

    Examples:
        >>> from types import SimpleNamespace
        >>> job = InAJob(SimpleNamespace(world_size=4, rank=0))
        >>> job.size, job.rows_per_rank(48), job.per_card_burn_in(), job.burns_in_past_format
        (4, 12, True, False)
        >>> job.check(16)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: rows_per_step is not supported in a distributed job yet ...
    """

    world: Any
    burns_in_past_format = False

    @property
    def size(self) -> int:
        return int(self.world.world_size)

    def runner(self, plan: Plan, **kw: Any) -> PhaseRunner:
        from leadline.lookahead.distributed.phases import AgreedPhaseRunner

        return AgreedPhaseRunner(plan, world=self.world, **kw)

    def check(self, rows_per_step: int | None) -> None:
        if rows_per_step is not None:
            raise InputError("rows_per_step is not supported in a distributed job yet (the step there is micro-batch "
                             "x accumulation x world size); leave it out, or derive in one process")

    def noise(self, grad_fn: Any, budget_s: float | None) -> Any:
        if isinstance(grad_fn, SelfMeasuringSource):  # the noise from DDP's all-reduce
            return grad_fn.measure(budget_s=budget_s)
        from leadline.lookahead.noise import measure_noise_scale

        return measure_noise_scale(grad_fn, budget_s=budget_s)

    def rows_per_rank(self, rows: int | None) -> int | None:
        from leadline.lookahead.distributed.phases import rows_needed_per_rank

        return rows_needed_per_rank(rows, self.size)

    def ramp(self, step_fn: Any, length: int, *, runner: PhaseRunner | None, least_seconds: float,
             params: Sequence[Any], lengths: Sequence[int] | None, max_rows: int | None, start_rows: int,
             should_stop: Callable[[Any], bool] | None,
             too_long: Callable[[float], bool] | None) -> tuple[Any, dict[str, Any]]:
        if isinstance(step_fn, LockstepStep):  # a sharded model: every rank in step
            res, values = step_fn.lockstep_memory(length, lengths=lengths, max_rows=max_rows, start_rows=start_rows,
                                                  should_stop=should_stop)
            return res, dict(values)
        from leadline.lookahead.distributed.phases import world_memory
        from leadline.lookahead.memory import ramp

        return world_memory(self.world, lambda: ramp(step_fn, length, lengths=lengths, max_rows=max_rows,
                                                     start_rows=start_rows, should_stop=should_stop),
                            step_fn, params or step_fn.params())

    def step(self, plan: Plan, noise: Any, *, step_fn: Any = None, rows_per_step: int | None = None,
             step_for: str = "rows", timed: Any = None) -> StepPhase:
        from leadline.lookahead.distributed.phases import world_step

        values = world_step(noise, world_size=self.size, rows_fit=int(plan.get("rows_fit")),
                            tokens_per_row=float(plan.get("scored_tokens_per_row") or 1.0),
                            t_step_seconds=plan.get("t_step_seconds"), t_micro_seconds=plan.get("t_micro_seconds"),
                            t_allreduce_seconds=plan.get("t_allreduce_seconds", 0.0),
                            corpus_scored_tokens=plan.get("scored_tokens"), step_for=step_for)
        return StepPhase(None, values)

    def per_card_burn_in(self) -> bool:
        return True

    def unwrap(self, model: Any) -> tuple[Any, bool]:
        from leadline.lookahead.distributed.job import is_sharded, unwrap

        model = unwrap(model)
        return model, is_sharded(model)  # FSDP: the forward goes through the sharded module, every rank in step

    def task_job(self, task: Any, params: Sequence[Any], sharded: bool) -> Any:
        if sharded:
            from leadline.lookahead.distributed.sharded_job import ShardedWorldTask

            return ShardedWorldTask(task, list(params), self.world)
        from leadline.lookahead.distributed.job import WorldTask

        return WorldTask(task, list(params), self.world)

    def finish(self, plan: Plan) -> Plan:
        from leadline.lookahead.distributed.sync import broadcast_plan

        return broadcast_plan(self.world, plan)  # every rank ends with rank 0's plan, checked by its sha256
