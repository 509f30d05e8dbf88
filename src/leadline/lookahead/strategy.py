"""How derive()'s phases work with the other processes of their job: the :class:`Strategy` they
call, so each phase has one code path. One process is a world of one
(:class:`~leadline.lookahead.derive.strategy.OneProcess`); a ``torch.distributed`` job of several processes
is :class:`~leadline.lookahead.distributed.strategy.InAJob` (:func:`in_a_job`). derive reaches the job's
strategy through this module alone, and :mod:`leadline.lookahead.distributed` imports nothing of derive.
Loads no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from leadline.lookahead.runner import PhaseRunner
from leadline.plan import Plan

__all__ = ["Strategy", "in_a_job"]


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
        """The noise scale (:class:`~leadline.lookahead.noise.NoiseScale`)."""
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
        """The pieces a job's ranks share for a Hugging Face task (:mod:`leadline.lookahead.distributed.job`),
        None in one process."""
        ...

    def finish(self, plan: Plan) -> Plan:
        """The plan every process returns."""
        ...


def in_a_job(world: Any) -> Strategy:
    """The strategy of a job of several processes, ``world`` this process's
    :class:`~leadline.lookahead.world.World` in it.

    Examples:
        >>> from types import SimpleNamespace
        >>> in_a_job(SimpleNamespace(world_size=2, rank=1)).size
        2
    """
    from leadline.lookahead.distributed.strategy import InAJob

    return InAJob(world)
