"""The step phase (tokens per step, micro-batch and accumulation from the noise and the card's
timings) and the batch a phase trains at before the plan has its own: the rows the step can
need, and how the first step and the burn-in past the format split them over the card (the same
rows a step on every card, accumulated where fewer fit)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from leadline.lookahead.noise.step import DEFAULT_STEP_FOR
from leadline.lookahead.runner import StepPhase
from leadline.plan import Plan

Timings = tuple[list[float], list[float], list[float]]
"""One row's times, the rows-fit times and the rows-fit updates, taken in turn (:func:`paired_timings`)."""


def step(plan: Plan, noise: Any, step_fn: Any = None, rows_per_step: int | None = None,
         step_for: str = DEFAULT_STEP_FOR, timed: StepPhase | None = None) -> StepPhase:
    """tokens_per_step (B*), the micro-batch cut to it, grad_accum; ``noise`` the noise result,
    or the plan's ``noise_scale_tokens`` where it was resumed (one process; a job's step is its
    strategy's, :meth:`~leadline.lookahead.strategy.Strategy.step`). With ``step_fn``,
    one row and the rows that fit are timed in turn for the fixed cost of a micro-batch and the
    cost of a row (:func:`paired_timings`, noise/step.py); without it, the ramp's timings.
    ``rows_per_step``: the step the caller fixed, fitted to the card (B* in its evidence).
    ``step_for``: ``time`` or ``rows`` (:func:`~leadline.lookahead.noise.step.rows_step_rule`).
    ``timed``: an earlier step phase whose paired timings are reused where it timed the same
    rows_fit (the card is timed again only after the ramp moved, and more pairs are added only
    while this step is not resolved: :func:`resolved_timings`)."""
    from leadline.lookahead.noise import tokens_per_step

    rows_fit = int(plan.get("rows_fit"))
    per_row = float(plan.get("scored_tokens_per_row") or 1.0)
    def plan_for(timings: Timings | None, t_micro: Any, t_step: Any) -> Any:
        return tokens_per_step(noise, rows_fit=rows_fit, tokens_per_micro_batch=rows_fit * per_row,
                               t_step_seconds=t_step, t_micro_seconds=t_micro,
                               corpus_scored_tokens=plan.get("scored_tokens"),
                               t_micro_one_row_seconds=timings[0] if timings else None,
                               rows_per_step=rows_per_step, step_for=step_for)

    timings, resolution = None, None
    if step_fn is not None and rows_fit > 1 and plan.get("seq_len"):  # the fixed cost of a micro-batch
        b_noise = getattr(noise, "b_noise_tokens", noise)
        bootstrap = rows_per_step is None and isinstance(b_noise, (int, float)) and b_noise / per_row <= MOST_ROWS
        timings, resolution = resolved_timings(
            step_fn, rows_fit, int(plan.get("seq_len")),
            (lambda t: plan_for(t, t[1], t[2]).rows_per_step) if bootstrap else None,
            taken=timings_of(timed, rows_fit))
    if timings is not None:
        sp = plan_for(timings, timings[1], timings[2])
        sp.inputs["timed_in_turn"] = True
        if resolution is not None:
            sp.inputs["step_resolution"] = resolution
    else:
        sp = plan_for(None, plan.get("t_micro_seconds"), plan.get("t_step_seconds"))
    return StepPhase(sp, sp.as_values())


PAIRS = 3
"""Repeats of the one-row and the rows-fit step, taken in turn (their medians are used)."""
MAX_PAIRS = 9
"""The most pairs :func:`resolved_timings` takes while the step is not resolved."""
STEP_SPREAD = 1.2
"""The step is resolved when the 90th percentile of its rows over the pairs' bootstrap is at
most this times the 10th."""
RESAMPLES = 40
"""Resamples of the pairs a bootstrap draws (seeded: the same timings give the same answer)."""
MOST_ROWS = 20_000
"""Above this many rows in B_noise the step is not bootstrapped (each resample searches every
whole number of rows up to it); the first pairs decide it."""


def bootstrap_rows(timings: Timings, rows_of: Callable[[Timings], int], resamples: int = RESAMPLES,
                   seed: int = 0) -> tuple[int, int]:
    """The 10th and 90th percentiles of ``rows_of`` over ``resamples`` resamples of the pairs
    (drawn whole, with replacement, so each keeps its one-row and rows-fit times together)."""
    one, fit, update = timings
    rng = random.Random(seed)
    n = len(one)
    rows = sorted(rows_of(([one[i] for i in ix], [fit[i] for i in ix], [update[i] for i in ix]))
                  for ix in ([rng.randrange(n) for _ in range(n)] for _ in range(resamples)))
    return rows[int(0.1 * (resamples - 1))], rows[math.ceil(0.9 * (resamples - 1))]


def resolved_timings(step_fn: Any, rows_fit: int, length: int, rows_of: Callable[[Timings], int] | None,
                     pairs: int = PAIRS, max_pairs: int = MAX_PAIRS, spread: float = STEP_SPREAD,
                     taken: Timings | None = None) -> tuple[Timings, dict[str, Any] | None]:
    """:func:`paired_timings`, and more pairs, one at a time, while the step they give is not
    resolved: while the 90th percentile of the rows a step over the pairs' bootstrap
    (:func:`bootstrap_rows`) is above ``spread`` times the 10th, up to ``max_pairs`` pairs.

    The step reads the per-row cost from the difference of two timings a few percent apart; on a
    card bound by its fixed cost three pairs left that difference loose enough that three derives
    of one task on one card took steps up to 1.28x apart (docs/results.md). ``rows_of`` maps
    timings to the rows a step; None (a step the caller fixed) takes the first pairs only.
    ``taken``: pairs an earlier step phase took at the same shape, reused (the step read again
    past the format starts from them and adds pairs only where its own step is not resolved).
    Returns the timings and the resolution (pairs, the interval, whether it resolved), None
    without ``rows_of``.
    """
    one, fit, update = taken if taken is not None else paired_timings(step_fn, rows_fit, length, pairs)
    if rows_of is None:
        return (one, fit, update), None
    while True:
        lo, hi = bootstrap_rows((one, fit, update), rows_of)
        if hi <= spread * lo or len(one) >= max_pairs:
            break
        o, f, u = paired_timings(step_fn, rows_fit, length, 1)
        one, fit, update = one + o, fit + f, update + u
    return (one, fit, update), {"pairs": len(one), "rows_p10": lo, "rows_p90": hi, "spread": spread,
                                "resolved": hi <= spread * lo}


def timings_of(timed: StepPhase | None, rows_fit: int) -> Timings | None:
    """The paired timings a step phase took, where it took them at ``rows_fit`` rows (None otherwise)."""
    inputs = getattr(getattr(timed, "step", None), "inputs", None)
    if not isinstance(inputs, dict) or inputs.get("rows_fit") != rows_fit or not inputs.get("timed_in_turn"):
        return None
    one = (inputs.get("fixed_cost") or {}).get("t_micro_one_row_repeats")
    fit, update = inputs.get("t_micro_repeats"), inputs.get("t_step_repeats")
    return (list(one), list(fit), list(update)) if one and fit and update else None


def paired_timings(step_fn: Any, rows_fit: int, length: int, pairs: int = PAIRS) -> Timings:
    """One forward+backward of one row and of ``rows_fit`` rows, timed in turn ``pairs`` times:
    the one-row times, the rows-fit times and the rows-fit updates.

    The step reads the per-row cost from the difference of the two, a few milliseconds a row
    against a fixed cost of 0.2 s a micro-batch on an H200 (SmolLM2-135M, LoRA). Timed at
    different moments — the rows that fit in the memory ramp, one row after it — a card whose
    speed drifts in between moved that difference several-fold: three derives of one task on one
    card read 0.5 to 4.5 ms a row and took 19 to 30 rows a step (docs/results.md). Taken in turn,
    a drift touches both alike.
    """
    one: list[float] = []
    fit: list[float] = []
    update: list[float] = []
    for _ in range(pairs):
        one.extend(step_fn(1, length, repeats=1).micro_seconds)
        timed = step_fn(rows_fit, length, repeats=1)
        fit.extend(timed.micro_seconds)
        update.extend(timed.step_seconds)
    return one, fit, update


def rows_needed(plan: Plan) -> int | None:
    """The ramp's upper limit: the rows the target step can need (B_noise's upper edge over the
    scored tokens per row), and at least the rows the probe drew — the batch whose gradient it
    has seen, which the first step and the burn-in past the format train at (docs/noise.md)."""
    b = plan.get("noise_scale_tokens")
    per_row = plan.get("scored_tokens_per_row")
    if not isinstance(b, (int, float)) or not isinstance(per_row, (int, float)) or per_row <= 0 or not math.isfinite(b):
        return None
    ev = plan["noise_scale_tokens"].evidence if isinstance(plan["noise_scale_tokens"].evidence, dict) else {}
    se = ev.get("se_tokens", 0)
    upper = b + (se if isinstance(se, (int, float)) and math.isfinite(se) else 0)
    drawn = sum(t for t in ev.get("micro_tokens") or [] if isinstance(t, (int, float)))
    return max(1, math.ceil(upper / per_row), math.floor(drawn / per_row))


def batch_of(plan: Plan) -> tuple[int, int]:
    """The plan's (micro_batch, grad_accum): the rows that fit, one micro-batch a step, where
    the step phase did not run."""
    return int(plan.get("micro_batch", plan.get("rows_fit", 1)) or 1), int(plan.get("grad_accum", 1) or 1)


def burn_in_batch(plan: Plan, per_card: bool = False) -> tuple[int, int]:
    """(micro_batch, grad_accum) of the first step and the burn-in past the format: the rows the
    step-0 noise says a step can need (:func:`rows_needed`, the ramp's upper limit), the same on
    every card, split over the rows that fit (:func:`~leadline.lookahead.noise.step.even_split`): a card
    that holds fewer accumulates. ``per_card`` (a job, whose rows_fit is a rank's): the most rows
    the ramp kept, one micro-batch a step. Without a ramp, the plan's batch."""
    from leadline.lookahead.noise.step import even_split

    fit = plan.get("rows_fit")
    if not isinstance(fit, int):
        return batch_of(plan)
    need = rows_needed(plan)
    if per_card or need is None:
        return int(fit), 1
    return even_split(need, max(1, int(fit)))
