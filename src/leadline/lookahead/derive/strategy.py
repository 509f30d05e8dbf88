"""derive() in one process: :class:`OneProcess`, a world of one, each method the one-process
case of the :class:`~leadline.lookahead.strategy.Strategy` a job's processes follow together
(:func:`~leadline.lookahead.strategy.in_a_job`). Loads no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from leadline.lookahead.runner import PhaseRunner
from leadline.lookahead.strategy import Strategy, in_a_job
from leadline.plan import Plan

__all__ = ["OneProcess", "strategy_for"]


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
        from leadline.lookahead.noise import measure_noise_scale

        return measure_noise_scale(grad_fn, budget_s=budget_s)

    def rows_per_rank(self, rows: int | None) -> int | None:
        return rows

    def ramp(self, step_fn: Any, length: int, *, runner: PhaseRunner | None, least_seconds: float,
             params: Sequence[Any], lengths: Sequence[int] | None, max_rows: int | None, start_rows: int,
             should_stop: Callable[[Any], bool] | None,
             too_long: Callable[[float], bool] | None) -> tuple[Any, dict[str, Any]]:
        from leadline.lookahead.memory import ramp

        if runner is not None:  # max_seconds must not start a ramp it cannot end
            runner.ensure(least_seconds)
        res = ramp(step_fn, length, lengths=lengths, max_rows=max_rows, start_rows=start_rows,
                   should_stop=should_stop, too_long=too_long)
        return res, {("rows_fit" if n == "micro_batch" else n): v for n, v in res.as_values().items()}

    def step(self, plan: Plan, noise: Any, *, step_fn: Any = None, rows_per_step: int | None = None,
             step_for: str = "rows", timed: Any = None) -> Any:
        from leadline.lookahead.derive.batches import step

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
    (``world`` None, :func:`~leadline.lookahead.world.current_world`'s answer there), else the job's.

    Examples:
        >>> strategy_for(None).size
        1
    """
    return OneProcess() if world is None else in_a_job(world)
