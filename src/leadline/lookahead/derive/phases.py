"""derive()'s phases: each takes what it needs as arguments and returns its result, whose
``as_values()`` the runner puts into the plan (the measuring is in the phase packages; these
adapt their results to the plan). The recipe, :mod:`leadline.lookahead.derive.recipe`, calls them in order,
all by their names here: the corpus, the noise, the memory and the length live in this module,
the step in :mod:`leadline.lookahead.derive.batches`, the burn-in past the format in
:mod:`leadline.lookahead.derive.past_format`, the rate's phases in :mod:`leadline.lookahead.derive.rate_phases`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from leadline.errors import InputError
from leadline.lookahead.derive.batches import StepPhase, batch_of, burn_in_batch, rows_needed, step
from leadline.lookahead.derive.past_format import PastFormatPhase, past_format
from leadline.lookahead.derive.rate_phases import (
    FirstStepPhase,
    RatePhase,
    anchor,
    first_step,
    keep_branch,
    rate,
    warmup,
)
from leadline.lookahead.runner import PhaseRunner, Values
from leadline.lookahead.strategy import Strategy
from leadline.plan import TRAINING_NUMBERS, Plan, Value

__all__ = ["MEMORY_SHARE", "FirstStepPhase", "MemoryPhase", "PastFormatPhase", "RatePhase", "StepPhase", "anchor",
           "batch_of", "burn_in_batch", "draw_seconds", "first_step", "given_profile", "keep_branch", "length",
           "memory", "noise", "past_format", "rate", "rows_needed", "step", "training_numbers", "warmup"]

MEMORY_SHARE = 0.3
"""The share of the time left that the memory ramp may take under ``max_seconds`` (the noise
probe's is the same): the first step, the burn-in and the rate come after it."""


@dataclass(frozen=True)
class MemoryPhase:
    """The memory phase's ramp (this rank's in a job) and the plan's values from it."""

    ramp: Any
    values: Mapping[str, Value]

    def as_values(self) -> Mapping[str, Value]:
        return self.values


def training_numbers(plan: Plan) -> dict[str, Any]:
    """The numbers the run would train with if derive stopped here: the plan's
    :data:`~leadline.plan.TRAINING_NUMBERS`, the rate where none is set the one the plan falls
    back to (:func:`~leadline.lookahead.rate.policy.fallback_rate`). A phase moved the plan when these differ
    after it from before it (``plan.phases``)."""
    from leadline.lookahead.rate.policy import fallback_rate

    out = {n: plan.get(n) for n in TRAINING_NUMBERS if n in plan}
    if "lr" not in out:
        lr = fallback_rate(plan)
        if lr is not None:
            out["lr"] = lr.value
    return out


# ---- corpus and noise -------------------------------------------------------------------
def given_profile(profile: Any) -> Any:
    """The corpus phase on a profile the caller made already (the same rows): it is the result."""
    return profile


def noise(grad_fn: Any, seconds_left: float | None, world: Strategy) -> Any:
    """The noise scale, with 30% of the time left (at least 1 s) under max_seconds; in a job,
    as the job reads it (:meth:`~leadline.lookahead.strategy.Strategy.noise`)."""
    return world.noise(grad_fn, None if seconds_left is None else max(1.0, 0.3 * seconds_left))


# ---- memory -----------------------------------------------------------------------------
def draw_seconds(noise: Any) -> float:
    """The mean seconds of one noise-probe draw (a forward+backward of its rows), 0 when unknown."""
    k, seconds = getattr(noise, "k", 0) or 0, getattr(noise, "seconds", None)
    return float(seconds) / k if k and isinstance(seconds, (int, float)) else 0.0


def memory(step_fn: Any, plan: Plan, lengths: Sequence[int] | None, prior: Plan | None, noise: Any,
           world: Strategy, params: Sequence[Any] = (), runner: PhaseRunner | None = None) -> MemoryPhase:
    """The ramp: the rows a training run fits, bounded by the rows the step needs (a card's
    share of them in a job), and t_micro / t_step at that shape. Under max_seconds it stops when
    one more rung as long as the last would pass :data:`MEMORY_SHARE` of the time left at its
    start, and keeps what it confirmed; it does not start where the least ramp (a warm-up row,
    then one row three times: about two of derive_for's 2-row noise draws) would not fit."""
    length = plan.get("seq_len")
    if length is None:
        raise InputError("the memory ramp needs the run's length: pass data= (and a tokenizer) or seq_len=")
    max_rows = world.rows_per_rank(rows_needed(plan))
    stop = too_long = None
    left = runner.seconds_left() if runner is not None else None
    if runner is not None and left is not None:
        t_start, share = time.perf_counter(), MEMORY_SHARE * left

        def too_long(seconds: float) -> bool:
            return runner.would_overrun(seconds) or time.perf_counter() - t_start + 1.5 * seconds > share

        def stop(rung: Any) -> bool:
            return too_long(rung.seconds)
    start = 1
    if prior is not None and isinstance(prior.get("rows_fit"), int):
        start = max(1, min(prior.get("rows_fit"), max_rows or prior.get("rows_fit")))
    res, values = world.ramp(step_fn, int(length), runner=runner, least_seconds=2.0 * draw_seconds(noise),
                             params=params, lengths=lengths, max_rows=max_rows, start_rows=start, should_stop=stop,
                             too_long=too_long)
    return MemoryPhase(res, values)


# ---- the step ---------------------------------------------------------------------------
# ---- the rate ---------------------------------------------------------------------------
def length(plan: Plan, epochs: float) -> Values:
    """total_steps from epochs: ceil(epochs x scored tokens x the train share / tokens per step)."""
    tokens = float(plan.get("scored_tokens"))
    tokens_step = float(plan.get("tokens_per_step"))
    held = plan.held_out.get("train") if isinstance(plan.held_out.get("train"), list) else None
    rows_total = plan.get("rows")
    share = (len(held) / rows_total) if held is not None and isinstance(rows_total, int) and rows_total > 0 else 1.0
    steps = max(1, math.ceil(epochs * tokens * share / tokens_step))
    how = (f"ceil(epochs {epochs:g} x scored tokens {tokens:,.0f} x train share {share:.2f} / tokens per step "
           f"{tokens_step:,.0f})")
    return Values({"total_steps": Value(steps, "derived", how, unit="steps")})
