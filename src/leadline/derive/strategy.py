"""How derive() works with the other processes of its job: one strategy object the phases call,
so each phase has one code path. One process is a world of one (:class:`OneProcess`); a
``torch.distributed`` job of several processes is
:class:`~leadline.distributed.strategy.InAJob`, beside the job's own phases in
:mod:`leadline.distributed`. Loads no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from leadline.derive.runner import PhaseRunner
from leadline.plan import Plan

__all__ = ["OneProcess", "Strategy", "strategy_for"]


class Strategy(Protocol):
    """What derive()'s phases ask of the processes they run in."""

    size: int
    """The processes in the job (1: this one alone)."""
    burns_in_past_format: bool
    """Whether the burn-in past the format and its late noise reading run (one process only)."""

    def runner(self, plan: Plan, **kw: Any) -> PhaseRunner:
        """The runner of derive's phases: the time budget, progress and the resume file."""
        ...

    def check(self, rows_per_step: int | None) -> None:
        """Refuse, in one sentence, what this strategy cannot derive."""
        ...

    def noise(self, grad_fn: Any, budget_s: float | None) -> Any:
        """The noise scale (:class:`~leadline.noise.NoiseScale`)."""
        ...

    def rows_per_rank(self, rows: int | None) -> int | None:
        """The ramp's upper limit on one card, for a step of ``rows`` rows over the job."""
        ...

    def ramp(self, step_fn: Any, length: int, *, runner: PhaseRunner | None, least_seconds: float,
             params: Sequence[Any], lengths: Sequence[int] | None, max_rows: int | None, start_rows: int,
             should_stop: Callable[[Any], bool] | None,
             too_long: Callable[[float], bool] | None) -> tuple[Any, dict[str, Any]]:
        """The memory ramp: ``(this card's RampResult, the plan's values)``. ``least_seconds``: what
        the least ramp takes, which max_seconds must leave room for before it starts."""
        ...

    def step(self, plan: Plan, noise: Any, *, step_fn: Any = None, rows_per_step: int | None = None,
             step_for: str = "rows", timed: Any = None) -> Any:
        """The step phase: tokens per step, the micro-batch and the accumulation."""
        ...

    def per_card_burn_in(self) -> bool:
        """Whether the first step takes one card's rows (a job's ``rows_fit`` is a rank's)."""
        ...

    def unwrap(self, model: Any) -> tuple[Any, bool]:
        """The model as measured (a job's wrapper taken off) and whether it is sharded (FSDP)."""
        ...

    def task_job(self, task: Any, params: Sequence[Any], sharded: bool) -> Any:
        """The pieces a job's ranks share for a Hugging Face task (:mod:`leadline.distributed.job`),
        None in one process."""
        ...

    def finish(self, plan: Plan) -> Plan:
        """The plan every process returns."""
        ...


class OneProcess:
    """derive() in one process: a world of one, each method the one-process case of what a job's
    processes do together.

    Examples:
        >>> one = OneProcess()
        >>> one.size, one.rows_per_rank(48), one.per_card_burn_in(), one.burns_in_past_format
        (1, 48, False, True)
        >>> plan = Plan()
        >>> one.finish(plan) is plan, one.unwrap("the model"), one.task_job(None, [], False)
        (True, ('the model', False), None)
    """

    size = 1
    burns_in_past_format = True

    def runner(self, plan: Plan, **kw: Any) -> PhaseRunner:
        return PhaseRunner(plan, **kw)

    def check(self, rows_per_step: int | None) -> None:
        return None

    def noise(self, grad_fn: Any, budget_s: float | None) -> Any:
        from leadline.noise import measure_noise_scale

        return measure_noise_scale(grad_fn, budget_s=budget_s)

    def rows_per_rank(self, rows: int | None) -> int | None:
        return rows

    def ramp(self, step_fn: Any, length: int, *, runner: PhaseRunner | None, least_seconds: float,
             params: Sequence[Any], lengths: Sequence[int] | None, max_rows: int | None, start_rows: int,
             should_stop: Callable[[Any], bool] | None,
             too_long: Callable[[float], bool] | None) -> tuple[Any, dict[str, Any]]:
        from leadline.memory import ramp

        if runner is not None:  # max_seconds must not start a ramp it cannot end
            runner.ensure(least_seconds)
        res = ramp(step_fn, length, lengths=lengths, max_rows=max_rows, start_rows=start_rows,
                   should_stop=should_stop, too_long=too_long)
        return res, {("rows_fit" if n == "micro_batch" else n): v for n, v in res.as_values().items()}

    def step(self, plan: Plan, noise: Any, *, step_fn: Any = None, rows_per_step: int | None = None,
             step_for: str = "rows", timed: Any = None) -> Any:
        from leadline.derive.batches import step

        return step(plan, noise, step_fn=step_fn, rows_per_step=rows_per_step, step_for=step_for, timed=timed)

    def per_card_burn_in(self) -> bool:
        return False

    def unwrap(self, model: Any) -> tuple[Any, bool]:
        return model, False

    def task_job(self, task: Any, params: Sequence[Any], sharded: bool) -> Any:
        return None

    def finish(self, plan: Plan) -> Plan:
        return plan


def strategy_for(world: Any) -> Strategy:
    """The strategy for this process: :class:`OneProcess` outside a job of several processes
    (``world`` None, :func:`~leadline.distributed.current_world`'s answer there), else the job's.

    Examples:
        >>> strategy_for(None).size
        1
    """
    if world is None:
        return OneProcess()
    from leadline.distributed.strategy import InAJob

    return InAJob(world)
