"""derive()'s rate phases: alpha1 (the first step), the noise past the answer's format, the
anchor, the rate (the look-ahead, or the quick effort's grid) and the warmup. Each takes what it
needs as arguments and returns its result, whose ``as_values()`` the runner puts into the plan;
:mod:`leadline.derive.phases` names them for the recipe beside the other phases."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from leadline.budget import OutOfTime
from leadline.derive.batches import StepPhase, batch_of, burn_in_batch, step
from leadline.noise.step import DEFAULT_STEP_FOR
from leadline.pieces import (
    CountedSource,
    ResizableSource,
    ShardedSource,
)
from leadline.plan import Plan, Value
from leadline.runner import PhaseRunner, Values


@dataclass(frozen=True)
class FirstStepPhase:
    """The measured :class:`~leadline.rate.FirstStep` and its values (alpha1 says its batch)."""

    first: Any
    values: Mapping[str, Value]

    def as_values(self) -> Mapping[str, Value]:
        return self.values


@dataclass(frozen=True)
class PastFormatPhase:
    """The burn-in's :class:`~leadline.noise.past_format.PastFormat`, the ramp it went on with
    (None when it did not), and the values: the late reading, and the step when it grew."""

    past: Any
    ramp: Any
    values: Mapping[str, Value]

    def as_values(self) -> Mapping[str, Value]:
        return self.values


@dataclass(frozen=True)
class RatePhase:
    """The :class:`~leadline.rate.Lookahead` (None when a prior plan's rate was kept) and the
    rate the plan takes from it (:mod:`leadline.rate.policy`)."""

    lookahead: Any
    values: Mapping[str, Value]

    def as_values(self) -> Mapping[str, Value]:
        return self.values


def first_step(params: list[Any], opt: Any, train_step_of: Callable[[int, int], Any],
               held_out: Callable[[], Sequence[float]], plan: Plan, resolution: float | None = None,
               per_card: bool = False) -> FirstStepPhase:
    """alpha1, from a step of the burn-in's batch (``per_card``: see :func:`burn_in_batch`)."""
    from leadline.rate import measure_first_step

    mb, accum = burn_in_batch(plan, per_card)
    kw = {} if resolution is None else {"resolution": resolution}
    fs = measure_first_step(params, opt, train_step_of(mb, accum), held_out, **kw)
    out = dict(fs.as_values())
    a = out["alpha1"]
    out["alpha1"] = Value(a.value, a.kind, f"{a.source}; the first update from a step of {mb * accum} rows",
                          a.evidence, a.seconds, a.unit)
    return FirstStepPhase(fs, out)


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
    from types import SimpleNamespace

    from leadline.memory import ramp
    from leadline.noise.past_format import noise_past_format
    from leadline.noise.probe import MIN_DRAWS
    from leadline.rate.warmup import warmup_steps_for

    nv = plan["noise_scale_tokens"]
    se0 = nv.evidence.get("se_tokens") if isinstance(nv.evidence, dict) else None
    step0 = noise or SimpleNamespace(b_noise_tokens=nv.value, se_tokens=se0 or 0.0)
    if not isinstance(getattr(step0, "b_noise_tokens", None), (int, float)):
        return PastFormatPhase(None, None, {})
    mb, accum = burn_in_batch(plan)
    per_row = float(plan.get("scored_tokens_per_row") or 1.0)
    if isinstance(grad_fn, ResizableSource) and mb * accum > int(grad_fn.rows_per_draw or 1):
        # the late reading draws a training step's rows at a time: past the format B_noise is tens
        # to hundreds of tokens, beyond the reach of the step-0 probe's small draws (docs/noise.md);
        # a card that holds fewer rows than the step accumulates them: the same rows on every card
        from leadline.noise.gradfn import AccumulatedDraws

        grad_fn = grad_fn.with_rows(mb * accum) if accum == 1 else AccumulatedDraws(grad_fn.with_rows(mb), accum)
    rows_per_draw = grad_fn.rows_per_draw if isinstance(grad_fn, CountedSource) else None
    if not rows_per_draw:
        micro = getattr(step0, "micro_tokens", None) or []
        rows_per_draw = max(1, round((sum(micro) / len(micro)) / per_row)) if micro else 1
    betas = opt.param_groups[0].get("betas") if opt.param_groups else None
    w = warmup_steps_for(float(betas[0]) if betas else 0.9)

    def probe_start(steps: int) -> int:  # the first draw past every row the burn-in trained
        return math.ceil(steps * mb * accum / rows_per_draw)

    rows = plan.get("rows")
    held = plan.held_out.get("train") if isinstance(plan.held_out.get("train"), list) else None
    train_rows = len(held) if held is not None else (rows if isinstance(rows, int) else None)
    least = w * mb * accum + MIN_DRAWS * rows_per_draw  # a round of burn-in, then the probe's fewest draws past it
    if isinstance(grad_fn, CountedSource) and train_rows is not None and train_rows < least:
        # a source that draws the run's rows would find none left past the burn-in's: do not burn in for it
        why = (f"not read: the {train_rows} training rows cannot hold a round of the burn-in ({w} steps of "
               f"{mb * accum} rows) and the probe's {MIN_DRAWS} draws of {rows_per_draw} rows on rows past it "
               f"({least} rows); the step-0 noise scale stands")
        return PastFormatPhase(None, None, {"noise_scale_past_format_tokens": Value(
            None, "derived", why, evidence={"train_rows": train_rows, "rows_needed": least, "round_steps": w,
                                             "rows_per_step": mb * accum, "rows_per_draw": rows_per_draw,
                                             "min_draws": MIN_DRAWS}, unit="scored tokens")})
    max_steps = None if not train_rows else max(w, train_rows // (4 * mb * accum))  # a quarter of the run's rows
    left = runner.seconds_left()
    alpha1 = float(plan.get("alpha1"))
    rate = alpha1 / 2
    if named:  # never above the anchor (docs/noise.md)
        from leadline.rate import anchor_rate

        rate = min(rate, float(anchor_rate(named, trained_as=trained_as).lr))
    pf = noise_past_format(params, opt, train_step_of(mb, accum), grad_fn, alpha1, step0, rate=rate,
                           rows_per_step=mb * accum, probe_start=probe_start, round_steps=w, max_steps=max_steps,
                           budget_s=None if left is None else 0.25 * left, check_time=runner.check_time)
    out = dict(pf.as_values())
    v = out["noise_scale_past_format_tokens"]
    out["noise_scale_past_format_tokens"] = Value(v.value, v.kind,
                                                  f"{v.source}; the reading in draws of {rows_per_draw} rows",
                                                  {**v.evidence, "rows_per_draw": rows_per_draw}, v.seconds, v.unit)
    if not pf.grew or pf.noise is None:
        return PastFormatPhase(pf, None, out)
    need = max(1, math.ceil((pf.b_noise_tokens + (pf.se_tokens or 0.0)) / per_row))
    if rows_per_step is not None:  # the step is given: more rows a micro-batch than it has buy nothing
        need = rows_per_step
    rows_fit = int(plan.get("rows_fit"))
    ev = plan["rows_fit"].evidence if isinstance(plan["rows_fit"].evidence, dict) else {}
    result = None
    planned = None
    if need > rows_fit and ev.get("stop") == "upper_limit":  # the first ramp stopped at step 0's rows: go on
        # only as far as the step takes: a step timed at the rows measured so far (its costs are linear in the
        # rows, a micro-batch's fixed cost apart) says how many rows it wants; a card that holds more buys nothing
        planned = step(plan, pf.noise, step_fn=step_fn, rows_per_step=rows_per_step, step_for=step_for, timed=timed)
        wanted = rows_wanted(planned)
        if wanted is not None and wanted < need:
            plan.notes.append(f"past_format: the step takes {wanted} rows, so the ramp goes on toward {wanted} rows, "
                              f"not the {need} of the noise's upper edge")
            need = wanted
    if need > rows_fit and ev.get("stop") == "upper_limit":
        # each rung must fit in max_seconds; cut, the step is taken at the rows kept (grad_accum makes up the rest)
        try:
            result = ramp(step_fn, int(plan.get("seq_len")), lengths=lengths, max_rows=need, start_rows=rows_fit,
                          on_rung=lambda r: runner.ensure(r.seconds))
        except OutOfTime:
            plan.notes.append(f"past_format: the ramp from {rows_fit} toward {need} rows was cut by max_seconds; "
                              f"the step uses the {rows_fit} rows kept")
        if result is not None:
            for n, v in result.as_values().items():
                out["rows_fit" if n == "micro_batch" else n] = v
                plan.set("rows_fit" if n == "micro_batch" else n, v)
            planned = None  # timed again at the rows the ramp kept
    if planned is None:
        planned = step(plan, pf.noise, step_fn=step_fn, rows_per_step=rows_per_step, step_for=step_for,
                       timed=timed if result is None else None)
    out.update(planned.as_values())
    return PastFormatPhase(pf, result, out)


def rows_wanted(planned: StepPhase) -> int | None:
    """The rows a step wants before the card splits them (one process; None in a job)."""
    wanted = planned.step.inputs.get("rows_wanted") if planned.step is not None else None
    return int(wanted) if isinstance(wanted, int) and wanted >= 1 else None


def anchor(named: list[tuple[str, Any]], trained_as: str, plan: Plan, grad_fn: Any = None) -> Any:
    """The anchor rate; on a sharded model the norms of the whole tensors (``grad_fn.weight_norms``)."""
    from leadline.rate import anchor_rate

    norms = grad_fn.weight_norms(named) if isinstance(grad_fn, ShardedSource) else None
    return anchor_rate(named, trained_as=trained_as, batch_tokens=plan.get("tokens_per_step"),
                       b_noise_tokens=plan.get("noise_scale_tokens"), norms=norms)


def rate(params: list[Any], opt: Any, train_step_of: Callable[[int, int], Any], held_out: Callable[[], Sequence[float]],
         plan: Plan, effort: str, prior: Plan | None, first: Any = None,
         check_time: Callable[..., None] | None = None) -> RatePhase:
    """The rate: a prior plan's, kept when alpha1 is within 2x of its; else the look-ahead (full
    effort, from ``first``, the measured first step, or the plan's alpha1 where it was resumed)
    or the quick effort's anchor and race() rates (:mod:`leadline.rate.policy`)."""
    from leadline.rate import lookahead_lr
    from leadline.rate.policy import cut_rate, quick_rate, short_run_grid

    if not isinstance(plan.get("alpha1"), (int, float)):
        return RatePhase(None, {})
    alpha1 = float(plan.get("alpha1"))
    prior_rated = prior is not None and isinstance(prior.get("lr"), (int, float))
    if prior_rated and isinstance(prior.get("alpha1"), (int, float)):
        ratio = alpha1 / float(prior.get("alpha1"))
        if 0.5 <= ratio <= 2.0:
            lr = float(prior.get("lr"))
            kept = Value(lr, "measured", f"the prior plan's rate, kept: alpha1 re-measured at {alpha1:.3g}, "
                                         f"{ratio:.2f}x the prior's (within 2x)",
                         evidence={"prior_alpha1": prior.get("alpha1"), "alpha1": alpha1, "prior_lr": lr},
                         unit="per step")
            return RatePhase(None, {"lr": kept})
    from leadline.derive.state import keeping
    from leadline.rate.lookahead import beta1_of
    from leadline.rate.warmup import warmup_steps_for

    mb, accum = batch_of(plan)
    total = int(plan.get("total_steps") or 100)
    short = short_run_grid(plan.get("lr_anchor"), alpha1, total) if effort == "full" else {}
    w = warmup_steps_for(beta1_of(opt))
    keeper = keeping() if effort == "full" else None
    # the candidates start at their rates, as the plan's run does (no warmup): the winner's steps
    # are the run's first steps; the warmup is raced where the look-ahead reads the run's length
    la = lookahead_lr(params, opt, train_step_of(mb, accum), held_out, first if first is not None else alpha1,
                      total_steps=total, effort=effort, on_progress=check_time, warmup_steps=0,
                      **{"first_horizon": w, **short}, race_warmup=w, keep_branch=keeper is not None)
    out = dict(la.as_values())
    if short:
        lr = out["lr"]
        rates = ", ".join(f"{alpha1 * 2.0 ** j:.3g}" for j in short["grid"])
        how = (f"{lr.source}; a short run: {total} steps, whose budget of {2 * total} look-ahead steps does not "
               f"reach the {short['first_horizon']}-step minimum horizon at the default grid, so the "
               f"{len(short['grid'])} rates around the anchor ({rates}) ran from that horizon")
        out["lr"] = Value(lr.value, lr.kind, how, lr.evidence, lr.seconds, lr.unit)
    out.update(quick_rate(plan, alpha1) if effort == "quick" else cut_rate(plan, la, total))
    if keeper is not None:
        out["lookahead_state_steps"] = keep_branch(keeper, la, params, plan, out["lr"].value, mb * accum)
    la.branch = None  # its snapshot's memory goes with it
    return RatePhase(la, out)


def keep_branch(keeper: Any, la: Any, params: list[Any], plan: Plan, lr: float, rows_per_step: int) -> Value:
    """Save the look-ahead's winning branch for the run to continue from (:mod:`leadline.derive.state`),
    where it is one: a branch that ran at the plan's own ``lr``."""
    from leadline.derive.state import other_rate, save_branch

    b = la.branch
    why = None
    if b is None:
        why = "no candidate's run was whole at the look-ahead's last horizon"
    elif other_rate(b.lr, lr):
        why = other_rate(b.lr, lr)
    elif b.steps >= int(plan.get("total_steps") or 0):
        why = f"the look-ahead ran the whole run ({b.steps} steps): its ending was not raced"
    if why is not None:
        return Value(0, "derived", f"nothing kept for the run to continue from: {why}; the run starts over",
                     evidence={"why": why}, unit="steps")
    facts = {"data_sha256": plan.data.get("sha256"), "seed": plan.held_out.get("seed"),
             "seq_len": plan.get("seq_len"), "rows_per_step": rows_per_step,
             "trained_parameters": plan.model.get("trained_parameters"), "total_steps": plan.get("total_steps")}
    meta = save_branch(keeper, b, params, facts)
    return Value(b.steps, "measured",
                 f"the look-ahead's best grid rate {b.lr:.3g}, its {b.steps} steps on the run's rows at "
                 f"{rows_per_step} rows a step, kept beside the plan ({keeper.path.name}, {meta['bytes']:,} bytes): "
                 "`leadline train` continues from them and counts them against the run's length",
                 evidence={k: meta[k] for k in ("steps", "lr", "warmup_steps", "bytes")}, unit="steps")


def warmup(plan: Plan, opt: Any) -> Values:
    """The warmup (the look-ahead's race of it, where it ran one), weight decay 0, for the plan's
    final rate."""
    from leadline.rate import warmup_values

    betas = opt.param_groups[0].get("betas") if opt is not None else None
    prev = plan.values.get("warmup_steps")
    race = prev.evidence.get("race") if prev is not None and isinstance(prev.evidence, dict) else None
    return Values(warmup_values(alpha1=plan.get("alpha1"), lr=plan.get("lr", plan.get("lr_anchor")), betas=betas,
                                race=race))
