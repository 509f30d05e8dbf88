"""derive()'s burn-in past the answer's format: the noise read again after it, and, when it grew,
the ramp gone on toward the rows it needs and the step taken from it. The phase changes nothing:
it returns a :class:`PastFormatPhase`, whose values the runner puts into the plan and whose notes
the recipe adds to ``plan.notes``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from leadline.lookahead.budget import OutOfTime
from leadline.lookahead.derive.batches import burn_in_batch, step
from leadline.lookahead.noise.step import DEFAULT_STEP_FOR
from leadline.lookahead.pieces import CountedSource, ResizableSource
from leadline.lookahead.runner import PhaseRunner, StepPhase
from leadline.plan import Plan, Value

__all__ = ["PastFormatPhase", "past_format", "rows_wanted"]


@dataclass(frozen=True)
class PastFormatPhase:
    """The burn-in's :class:`~leadline.lookahead.noise.past_format.PastFormat`, the ramp it went on with
    (None when it did not), the values: the late reading, and the step when it grew; and the
    notes: what it decided about the ramp, for ``plan.notes``."""

    past: Any
    ramp: Any
    values: Mapping[str, Value]
    notes: tuple[str, ...] = ()

    def as_values(self) -> Mapping[str, Value]:
        return self.values


@dataclass(frozen=True)
class _BurnIn:
    """The burn-in's shape: its batch, the late reading's draws, a round's steps and the rows."""

    micro_batch: int
    accum: int
    rows_per_draw: int
    round_steps: int
    train_rows: int | None

    @property
    def rows_per_step(self) -> int:
        return self.micro_batch * self.accum

    def probe_start(self, steps: int) -> int:
        """The first draw past every row the burn-in trained."""
        return math.ceil(steps * self.rows_per_step / self.rows_per_draw)


def past_format(params: list[Any], opt: Any, train_step_of: Callable[[int, int], Any], grad_fn: Any, step_fn: Any,
                plan: Plan, noise: Any, lengths: Sequence[int] | None, runner: PhaseRunner,
                named: Sequence[tuple[str, Any]] = (), trained_as: str = "factors",
                rows_per_step: int | None = None, step_for: str = DEFAULT_STEP_FOR,
                timed: StepPhase | None = None) -> PastFormatPhase:
    """Burn in past the answer's format, read the noise again, and when it grew, ramp on to the
    rows it needs and take the step from it (noise/past_format.py). ``noise`` is the step-0
    reading (None where it was resumed: the plan's ``noise_scale_tokens`` stands in).
    ``rows_per_step``: the step the caller fixed; the ramp goes on only as far as its rows, and
    otherwise only as far as the step timed at the rows already measured wants (never past the
    noise's upper edge). ``timed``: the step phase, whose timings of the card are reused until
    the ramp moves."""
    step0 = _step0(plan, noise)
    if step0 is None:
        return PastFormatPhase(None, None, {})
    mb, accum = burn_in_batch(plan)
    grad_fn = _late_source(grad_fn, mb, accum)
    burn = _burn_in(plan, opt, grad_fn, step0, mb, accum)
    too_few = _too_few_rows(burn) if isinstance(grad_fn, CountedSource) else None
    if too_few is not None:
        return PastFormatPhase(None, None, {"noise_scale_past_format_tokens": too_few})
    pf = _read_late(params, opt, train_step_of, grad_fn, plan, step0, burn, runner, named, trained_as)
    out = dict(pf.as_values())
    v = out["noise_scale_past_format_tokens"]
    out["noise_scale_past_format_tokens"] = Value(v.value, v.kind,
                                                  f"{v.source}; the reading in draws of {burn.rows_per_draw} rows",
                                                  {**v.evidence, "rows_per_draw": burn.rows_per_draw}, v.seconds,
                                                  v.unit)
    if not pf.grew or pf.noise is None:
        return PastFormatPhase(pf, None, out)
    ramped, planned, notes = _step_past_format(plan, pf, step_fn, lengths, runner, rows_per_step, step_for, timed)
    if ramped is not None:
        out.update(_ramp_values(ramped))
    out.update(planned.as_values())
    return PastFormatPhase(pf, ramped, out, notes)


def rows_wanted(planned: StepPhase) -> int | None:
    """The rows a step wants before the card splits them (one process; None in a job)."""
    wanted = planned.step.inputs.get("rows_wanted") if planned.step is not None else None
    return int(wanted) if isinstance(wanted, int) and wanted >= 1 else None


def _step0(plan: Plan, noise: Any) -> Any:
    """The step-0 reading: ``noise``, or the plan's ``noise_scale_tokens`` where it was resumed;
    None when neither is a number of tokens."""
    from types import SimpleNamespace

    nv = plan["noise_scale_tokens"]
    se0 = nv.evidence.get("se_tokens") if isinstance(nv.evidence, dict) else None
    step0 = noise or SimpleNamespace(b_noise_tokens=nv.value, se_tokens=se0 or 0.0)
    return step0 if isinstance(getattr(step0, "b_noise_tokens", None), (int, float)) else None


def _late_source(grad_fn: Any, mb: int, accum: int) -> Any:
    """The gradient source of the late reading: a training step's rows (``mb`` x ``accum``) a draw,
    where the source draws fewer."""
    if isinstance(grad_fn, ResizableSource) and mb * accum > int(grad_fn.rows_per_draw or 1):
        # the late reading draws a training step's rows at a time: past the format B_noise is tens
        # to hundreds of tokens, beyond the reach of the step-0 probe's small draws (docs/noise.md);
        # a card that holds fewer rows than the step accumulates them: the same rows on every card
        from leadline.lookahead.noise.gradfn import AccumulatedDraws

        return grad_fn.with_rows(mb * accum) if accum == 1 else AccumulatedDraws(grad_fn.with_rows(mb), accum)
    return grad_fn


def _burn_in(plan: Plan, opt: Any, grad_fn: Any, step0: Any, mb: int, accum: int) -> _BurnIn:
    """The burn-in's shape for this plan, optimizer and gradient source."""
    from leadline.lookahead.rate.warmup import warmup_steps_for

    per_row = float(plan.get("scored_tokens_per_row") or 1.0)
    rows_per_draw = grad_fn.rows_per_draw if isinstance(grad_fn, CountedSource) else None
    if not rows_per_draw:
        micro = getattr(step0, "micro_tokens", None) or []
        rows_per_draw = max(1, round((sum(micro) / len(micro)) / per_row)) if micro else 1
    betas = opt.param_groups[0].get("betas") if opt.param_groups else None
    rows = plan.get("rows")
    held = plan.held_out.get("train") if isinstance(plan.held_out.get("train"), list) else None
    train_rows = len(held) if held is not None else (rows if isinstance(rows, int) else None)
    return _BurnIn(mb, accum, rows_per_draw, warmup_steps_for(float(betas[0]) if betas else 0.9), train_rows)


def _too_few_rows(burn: _BurnIn) -> Value | None:
    """The late reading, not read, where a source that draws the run's rows would find none left
    past the burn-in's; None where the rows hold a round of it and the probe's draws past it."""
    from leadline.lookahead.noise.probe import MIN_DRAWS

    w, rows_per_draw, train_rows = burn.round_steps, burn.rows_per_draw, burn.train_rows
    least = w * burn.rows_per_step + MIN_DRAWS * rows_per_draw  # a round of burn-in, then the probe's fewest draws
    if train_rows is None or train_rows >= least:
        return None
    why = (f"not read: the {train_rows} training rows cannot hold a round of the burn-in ({w} steps of "
           f"{burn.rows_per_step} rows) and the probe's {MIN_DRAWS} draws of {rows_per_draw} rows on rows past it "
           f"({least} rows); the step-0 noise scale stands")
    return Value(None, "derived", why, evidence={"train_rows": train_rows, "rows_needed": least, "round_steps": w,
                                                 "rows_per_step": burn.rows_per_step, "rows_per_draw": rows_per_draw,
                                                 "min_draws": MIN_DRAWS}, unit="scored tokens")


def _read_late(params: list[Any], opt: Any, train_step_of: Callable[[int, int], Any], grad_fn: Any, plan: Plan,
               step0: Any, burn: _BurnIn, runner: PhaseRunner, named: Sequence[tuple[str, Any]],
               trained_as: str) -> Any:
    """The burn-in and the late reading (:func:`~leadline.lookahead.noise.past_format.noise_past_format`): at
    half alpha1, never above the anchor (docs/noise.md), on at most a quarter of the run's rows and
    a quarter of the time left."""
    from leadline.lookahead.noise.past_format import noise_past_format

    w, train_rows = burn.round_steps, burn.train_rows
    max_steps = None if not train_rows else max(w, train_rows // (4 * burn.rows_per_step))
    left = runner.seconds_left()
    alpha1 = float(plan.get("alpha1"))
    rate = alpha1 / 2
    if named:  # never above the anchor (docs/noise.md)
        from leadline.lookahead.rate import anchor_rate

        rate = min(rate, float(anchor_rate(named, trained_as=trained_as).lr))
    return noise_past_format(params, opt, train_step_of(burn.micro_batch, burn.accum), grad_fn, alpha1, step0,
                             rate=rate, rows_per_step=burn.rows_per_step, probe_start=burn.probe_start,
                             round_steps=w, max_steps=max_steps, budget_s=None if left is None else 0.25 * left,
                             check_time=runner.check_time)


def _step_past_format(plan: Plan, pf: Any, step_fn: Any, lengths: Sequence[int] | None, runner: PhaseRunner,
                      rows_per_step: int | None, step_for: str,
                      timed: StepPhase | None) -> tuple[Any, StepPhase, tuple[str, ...]]:
    """The step from a reading that grew: ``(the ramp gone on, or None; the step; the notes)``. The
    first ramp stopped at step 0's rows goes on toward the rows the reading needs, only as far as
    the step takes; the step is taken at the rows the ramp kept."""
    per_row = float(plan.get("scored_tokens_per_row") or 1.0)
    need = max(1, math.ceil((pf.b_noise_tokens + (pf.se_tokens or 0.0)) / per_row))
    if rows_per_step is not None:  # the step is given: more rows a micro-batch than it has buy nothing
        need = rows_per_step
    rows_fit = int(plan.get("rows_fit"))
    ev = plan["rows_fit"].evidence if isinstance(plan["rows_fit"].evidence, dict) else {}
    stopped_at_limit = ev.get("stop") == "upper_limit"
    notes: list[str] = []
    planned = None
    if need > rows_fit and stopped_at_limit:  # the first ramp stopped at step 0's rows: go on
        # only as far as the step takes: a step timed at the rows measured so far (its costs are linear in the
        # rows, a micro-batch's fixed cost apart) says how many rows it wants; a card that holds more buys nothing
        planned = step(plan, pf.noise, step_fn=step_fn, rows_per_step=rows_per_step, step_for=step_for, timed=timed)
        wanted = rows_wanted(planned)
        if wanted is not None and wanted < need:
            notes.append(f"past_format: the step takes {wanted} rows, so the ramp goes on toward {wanted} rows, "
                         f"not the {need} of the noise's upper edge")
            need = wanted
    ramped = None
    if need > rows_fit and stopped_at_limit:
        ramped, cut = _ramp_on(step_fn, plan, lengths, runner, rows_fit, need)
        notes += cut
    if ramped is not None:  # timed again at the rows the ramp kept
        plan = dataclasses.replace(plan, values={**plan.values, **_ramp_values(ramped)})
        planned = None
    if planned is None:
        planned = step(plan, pf.noise, step_fn=step_fn, rows_per_step=rows_per_step, step_for=step_for,
                       timed=timed if ramped is None else None)
    return ramped, planned, tuple(notes)


def _ramp_on(step_fn: Any, plan: Plan, lengths: Sequence[int] | None, runner: PhaseRunner, rows_fit: int,
             need: int) -> tuple[Any, list[str]]:
    """The ramp from ``rows_fit`` toward ``need`` rows: ``(its result, or None where max_seconds cut
    it; the note of the cut)``. Each rung must fit in max_seconds; cut, the step is taken at the
    rows kept (grad_accum makes up the rest)."""
    from leadline.lookahead.memory import ramp

    try:
        return ramp(step_fn, int(plan.get("seq_len")), lengths=lengths, max_rows=need, start_rows=rows_fit,
                    on_rung=lambda r: runner.ensure(r.seconds)), []
    except OutOfTime:
        return None, [f"past_format: the ramp from {rows_fit} toward {need} rows was cut by max_seconds; "
                      f"the step uses the {rows_fit} rows kept"]


def _ramp_values(ramped: Any) -> dict[str, Value]:
    """The plan's values from the ramp gone on: its micro-batch is the plan's ``rows_fit``."""
    return {("rows_fit" if n == "micro_batch" else n): v for n, v in ramped.as_values().items()}
