"""derive()'s rate phases: alpha1 (the first step), the anchor, the rate (the look-ahead) and the
warmup; the noise past the answer's format, between the first step and the anchor, is
:mod:`leadline.lookahead.derive.past_format`. Each takes what it needs as arguments and
returns its result, whose ``as_values()`` the runner puts into the plan;
:mod:`leadline.lookahead.derive.phases` names them for the recipe beside the other phases."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from leadline.lookahead.derive.batches import batch_of, burn_in_batch
from leadline.lookahead.pieces import (
    ShardedSource,
)
from leadline.lookahead.runner import Values
from leadline.plan import Plan, Value


@dataclass(frozen=True)
class FirstStepPhase:
    """The measured :class:`~leadline.lookahead.rate.FirstStep` and its values (alpha1 says its batch)."""

    first: Any
    values: Mapping[str, Value]

    def as_values(self) -> Mapping[str, Value]:
        return self.values


@dataclass(frozen=True)
class RatePhase:
    """The :class:`~leadline.lookahead.rate.Lookahead` (None when a prior plan's rate was kept) and the
    rate the plan takes from it (:mod:`leadline.lookahead.rate.policy`)."""

    lookahead: Any
    values: Mapping[str, Value]

    def as_values(self) -> Mapping[str, Value]:
        return self.values


def first_step(params: list[Any], opt: Any, train_step_of: Callable[[int, int], Any],
               held_out: Callable[[], Sequence[float]], plan: Plan, resolution: float | None = None,
               per_card: bool = False) -> FirstStepPhase:
    """alpha1, from a step of the burn-in's batch (``per_card``: see :func:`burn_in_batch`)."""
    from leadline.lookahead.rate import measure_first_step

    mb, accum = burn_in_batch(plan, per_card)
    kw = {} if resolution is None else {"resolution": resolution}
    fs = measure_first_step(params, opt, train_step_of(mb, accum), held_out, **kw)
    out = dict(fs.as_values())
    a = out["alpha1"]
    out["alpha1"] = Value(a.value, a.kind, f"{a.source}; the first update from a step of {mb * accum} rows",
                          a.evidence, a.seconds, a.unit)
    return FirstStepPhase(fs, out)


def anchor(named: list[tuple[str, Any]], trained_as: str, plan: Plan, grad_fn: Any = None) -> Any:
    """The anchor rate; on a sharded model the norms of the whole tensors (``grad_fn.weight_norms``)."""
    from leadline.lookahead.rate import anchor_rate

    norms = grad_fn.weight_norms(named) if isinstance(grad_fn, ShardedSource) else None
    return anchor_rate(named, trained_as=trained_as, batch_tokens=plan.get("tokens_per_step"),
                       b_noise_tokens=plan.get("noise_scale_tokens"), norms=norms)


def rate(params: list[Any], opt: Any, train_step_of: Callable[[int, int], Any], held_out: Callable[[], Sequence[float]],
         plan: Plan, prior: Plan | None, first: Any = None,
         check_time: Callable[..., None] | None = None) -> RatePhase:
    """The rate: a prior plan's, kept when alpha1 is within 2x of its; else the look-ahead (from
    ``first``, the measured first step, or the plan's alpha1 where it was resumed), held to the
    anchor where it was cut short (:mod:`leadline.lookahead.rate.policy`)."""
    from leadline.lookahead.rate import lookahead_lr
    from leadline.lookahead.rate.policy import cut_rate, short_run_grid

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
    from leadline.lookahead.derive.state import keeping
    from leadline.lookahead.rate.lookahead import beta1_of
    from leadline.lookahead.rate.warmup import warmup_steps_for

    mb, accum = batch_of(plan)
    total = int(plan.get("total_steps") or 100)
    short = short_run_grid(plan.get("lr_anchor"), alpha1, total)
    w = warmup_steps_for(beta1_of(opt))
    keeper = keeping()
    # the candidates start at their rates, as the plan's run does (no warmup): the winner's steps
    # are the run's first steps; the warmup is raced where the look-ahead reads the run's length
    la = lookahead_lr(params, opt, train_step_of(mb, accum), held_out, first if first is not None else alpha1,
                      total_steps=total, on_progress=check_time, warmup_steps=0,
                      **{"first_horizon": w, **short}, race_warmup=w, keep_branch=keeper is not None)
    out = dict(la.as_values())
    if short:
        lr = out["lr"]
        rates = ", ".join(f"{alpha1 * 2.0 ** j:.3g}" for j in short["grid"])
        how = (f"{lr.source}; a short run: {total} steps, whose budget of {2 * total} look-ahead steps does not "
               f"reach the {short['first_horizon']}-step minimum horizon at the default grid, so the "
               f"{len(short['grid'])} rates around the anchor ({rates}) ran from that horizon")
        out["lr"] = Value(lr.value, lr.kind, how, lr.evidence, lr.seconds, lr.unit)
    out.update(cut_rate(plan, la, total))
    if keeper is not None:
        out["lookahead_state_steps"] = keep_branch(keeper, la, params, plan, out["lr"].value, mb * accum)
    la.branch = None  # its snapshot's memory goes with it
    return RatePhase(la, out)


def keep_branch(keeper: Any, la: Any, params: list[Any], plan: Plan, lr: float, rows_per_step: int) -> Value:
    """Save the look-ahead's winning branch for the run to continue from (:mod:`leadline.lookahead.derive.state`),
    where it is one: a branch that ran at the plan's own ``lr``."""
    from leadline.lookahead.derive.state import other_rate, save_branch

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
    from leadline.lookahead.rate import warmup_values

    betas = opt.param_groups[0].get("betas") if opt is not None else None
    prev = plan.values.get("warmup_steps")
    race = prev.evidence.get("race") if prev is not None and isinstance(prev.evidence, dict) else None
    return Values(warmup_values(alpha1=plan.get("alpha1"), lr=plan.get("lr", plan.get("lr_anchor")), betas=betas,
                                race=race))
