"""The reference run: a plan trained as derive prescribes — the plan's batch and rate, the
LookaheadSchedule checking every horizon on held-out rows, the spill cap on a CUDA card — and
the verdict on the test rows no decision used.

    result = train_with_plan(model, tokenizer, "train.jsonl", plan, out_dir="run")

A race plan trains through the core's run (:func:`leadline.run.run_in_one`); a recipe plan
(:func:`recipe_plan`) through the one loop at the recipe's rates. A look-ahead plan
(``effort="full"``) trains under its LookaheadSchedule, which is the look-ahead effort's
(:mod:`leadline.lookahead`): this module is the core's door onto it for training, in
:func:`train_with_plan` and, through :func:`lookahead_schedule`, in ``LeadlineCallback``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from leadline.errors import InputError
from leadline.plan import Plan, refuse_quick_plan
from leadline.stats import mean_se

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from leadline.corpus import CorpusProfile
    from leadline.corpus.rows import RowSource
    from leadline.lookahead.derive.state import RunState
    from leadline.lookahead.rate.schedule import LookaheadSchedule
    from leadline.run.task import Task


def _need(plan: Plan, *names: str) -> None:
    missing = [n for n in names if plan.get(n) is None]
    if missing:
        cut = [s for s in plan.skipped if s.out_of_time]
        fix = (f": its derive ran out of time ({cut[0].sentence()}); derive again with a larger --max-seconds" if cut
               else "; derive it with `leadline derive` (and the same --data) first")
        raise InputError(f"the plan has no {', '.join(missing)}{fix}")


def recipe_plan(lr: float = 2e-4, rows_per_step: int = 16, warmup_ratio: float = 0.03, micro_batch: int | None = None,
                total_steps: int | None = None, seq_len: int | None = None, seed: int = 0) -> Plan:
    """A plan of given numbers (the default recipe people use: AdamW 2e-4, 16 rows a step, 3%
    warmup, linear decay to zero), trained by the same path as a derived plan, for comparisons."""
    from leadline.plan import Value

    mb = int(micro_batch or rows_per_step)
    if rows_per_step % mb:
        raise InputError(f"rows per step {rows_per_step} is not a multiple of the micro-batch {mb}")
    p = Plan()
    p.set("micro_batch", Value(mb, "given", "the recipe's", unit="rows"))
    p.set("grad_accum", Value(rows_per_step // mb, "given", "the recipe's"))
    p.set("lr", Value(float(lr), "given", "the recipe's", unit="per step"))
    p.set("warmup_ratio", Value(float(warmup_ratio), "given",
                                "the recipe's: warmup from 0 over this share of the steps"))
    p.set("weight_decay", Value(0.0, "given", "the recipe's"))
    p.set("ending", Value("linear", "given", "the recipe's: linear decay to zero"))
    if total_steps:
        p.set("total_steps", Value(int(total_steps), "given", "the caller's", unit="steps"))
    if seq_len:
        p.set("seq_len", Value(int(seq_len), "given", "the caller's", unit="tokens"))
    p.held_out = {"seed": seed}
    return p


def _continuation(state: str | os.PathLike[str] | None, plan: Plan, data: RowSource, run: _Run, *, schedule: bool,
                  linear: bool, ending: Literal["raced", "to_zero"]) -> tuple[RunState | None, dict[str, Any] | None]:
    """The saved branch when this run can continue from it, and the record of the decision."""
    if state is None:
        return None, None
    from leadline.lookahead.derive.state import load_run_state
    from leadline.lookahead.rate import lookahead_from
    from leadline.lookahead.rate.schedule import ending_copy_step
    from leadline.provenance import describe_data

    rs = load_run_state(state)
    where = {"state": str(state), "steps": rs.steps, "lr": rs.lr}
    if linear:
        return None, {**where, "from_step": 0, "why": "the recipe's run does not use it"}
    facts = {"data_sha256": describe_data(data).get("sha256"), "seed": plan.held_out.get("seed", 0),
             "seq_len": run.task.seq_len, "rows_per_step": int(plan.micro_batch) * run.accum,
             "trained_parameters": int(sum(p.numel() for p in run.params))}
    config = lookahead_from(plan, taken=(rs.steps, rs.lr), ending=ending, ending_steps=run.ending_steps)
    why = rs.why_not(facts, params=run.params, plan_lr=float(plan.lr),
                     plan_warmup_steps=int(plan.get("warmup_steps", 0)), total_steps=run.steps,
                     ending_from=ending_copy_step(config, run.steps) if schedule else None)
    if why is not None:
        return None, {**where, "from_step": 0, "why": why}
    return rs, {**where, "from_step": rs.steps}


def ending_steps_for(share: float | None, total_steps: int) -> int | None:
    """The raced ending's steps for ``share`` of a run of ``total_steps`` (None: the default,
    the last half and 2h).

    Examples:
        >>> ending_steps_for(0.5, 85), ending_steps_for(None, 85)
        (42, None)
    """
    if share is None:
        return None
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 1:
        raise InputError(f"ending_share={share!r} must be a share of the run between 0 and 1; pass e.g. 0.5 for the "
                         "last half, or leave it out")
    return max(1, round(share * total_steps))


def lookahead_schedule(plan: Plan, params: list[torch.nn.Parameter], opt: torch.optim.Optimizer,
                       train_step: Callable[[int], float], held_out_losses: Callable[[], list[float]] | None, *,
                       total_steps: int, ending: Literal["raced", "to_zero"] = "raced",
                       ending_steps: int | None = None) -> LookaheadSchedule:
    """The :class:`~leadline.lookahead.rate.LookaheadSchedule` a look-ahead plan trains with over
    ``opt``, for ``total_steps`` steps: the plan's rate at each step, its checks every horizon on
    the held-out rows, the ending (``raced`` over ``ending_steps``, or ``to_zero``).
    ``LeadlineCallback`` runs it; :func:`train_with_plan` builds its own, which may continue from
    derive's kept branch."""
    from leadline.lookahead.rate.schedule import LookaheadSchedule, lookahead_from

    config = lookahead_from(plan, ending=ending, ending_steps=ending_steps)
    return LookaheadSchedule(params, opt, train_step, held_out_losses, config, total_steps=total_steps)


def linear_lr(step: int, lr: float, warmup: int, total: int) -> float:
    """The recipe's rate at ``step``: linear warmup from 0 over ``warmup`` steps, then linear
    decay to zero at ``total`` (Hugging Face's ``linear`` scheduler)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * max(0.0, (total - step) / max(1, total - warmup))


def train_with_plan(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, data: RowSource, plan: Plan, *,
                    out_dir: str | os.PathLike[str] | None = None,
                    total_steps: int | None = None, schedule: bool = True,
                    on_step: Callable[[dict[str, Any]], None] | None = None,
                    state: str | os.PathLike[str] | None = None,
                    ending: Literal["raced", "to_zero"] = "raced",
                    ending_share: float | None = None, record: dict[str, float] | None = None) -> dict[str, Any]:
    """Train ``model`` on ``data`` with ``plan`` and return the curve and the test verdict.

    The rows are split as derive() split them (the plan's seed); the schedule checks on the
    held-out rows; the test rows are read before and after, never during. With ``out_dir``,
    the adapter (PEFT) or the weights are saved there and ``run.json`` beside them.
    A plan whose ``ending`` is ``linear`` (:func:`recipe_plan`) runs without the schedule:
    warmup from 0 over ``warmup_ratio`` of the steps, then linear decay to zero.

    ``state``: the folder ``leadline derive`` kept beside the plan (:mod:`leadline.lookahead.derive.state`):
    the look-ahead's winning branch. Where it is valid for this run (the same data, seed, length,
    rows a step and trained tensors at step 0, the plan's rate the branch's own, steps left
    before the raced ending) the run continues from its step n — its n steps
    counted against the run's length — and is the run that took those n steps itself, bit for bit;
    otherwise it starts over and ``result["continued"]["why"]`` says why.

    ``ending``: ``raced`` (the schedule reruns its last half and its last 2h steps with the rate
    decaying and keeps the best ending) or ``to_zero`` (the rate falls linearly to zero over the run's own steps
    under the same checks; nothing raced): :mod:`leadline.lookahead.rate.schedule`. ``ending_share``: the
    share of the run's steps the raced ending reruns, one length alone (default: the last half and 2h).
    ``record``: the caller's seconds (the load's, the derive's) put into ``run.json`` beside this
    call's own ``train_seconds``, so the file is written once with the whole cost in it (a race
    plan's run writes its own seconds: :func:`leadline.run.run_in_one`).
    """
    refuse_quick_plan(plan)
    t_call = time.perf_counter()
    if plan.get("optimizer") == "schedule_free_adamw":  # a race plan: schedule-free at its raced rate, no ending
        _refuse_an_ending(ending, ending_share)
        return _train_race_plan(model, tokenizer, data, plan, out_dir=out_dir, total_steps=total_steps, on_step=on_step)
    run = _set_up(model, tokenizer, data, plan, total_steps, ending, ending_share)
    linear = plan.get("ending") == "linear"
    schedule = schedule and not linear
    run_state, continued = _continuation(state, plan, data, run, schedule=schedule, linear=linear, ending=ending)
    before = _test_losses(run.task)
    model.train()
    sched, rate_of_step = _rates(plan, run, run_state, schedule=schedule, linear=linear, ending=ending)
    t0 = time.monotonic()
    curve, ended = _train_steps(run, run_state, sched, rate_of_step, on_step)
    after = _test_losses(run.task)
    result: dict[str, Any] = {
        "steps": run.steps, "micro_batch": int(plan.micro_batch), "grad_accum": run.accum,
        "seconds": time.monotonic() - t0, "curve": curve,
        "schedule": sched.evidence() if sched is not None else None, "ending": ended,
        "continued": continued, "test_rows": len(run.task.split.test), "data_notes": _data_notes(run.profile),
    }
    _add_test_verdict(result, before, after)
    if record is not None:
        result.update({k: round(v, 3) for k, v in record.items()})
        result["train_seconds"] = round(time.perf_counter() - t_call, 3)
    if out_dir is not None:
        _save(model, Path(out_dir), result)
    return result


@dataclass
class _Run:
    """A plan's run set up: the task (rows split as derive split them), the trained tensors, the
    optimizer, the step of ``grad_accum`` micro-batches, the length and the raced ending's steps."""

    task: Task
    profile: CorpusProfile
    params: list[torch.nn.Parameter]
    opt: torch.optim.Optimizer
    accum: int
    train_step: Callable[[int], float]
    steps: int
    ending_steps: int | None


def _set_up(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, data: RowSource, plan: Plan,
            total_steps: int | None, ending: Literal["raced", "to_zero"], ending_share: float | None) -> _Run:
    """The run's length and ending checked before any work, then the rows split and the AdamW the
    plan names over the trained tensors."""
    import torch

    from leadline.run.task import trained_named_weights

    steps = _checked_steps(plan, total_steps)
    if ending_share is not None:
        ending_steps_for(ending_share, 1)  # the share checked before any work
        if ending != "raced":
            raise InputError(f"ending_share sets the length of the LookaheadSchedule's raced ending, and "
                             f"ending={ending!r} races none; leave ending_share out")
    task, profile = _task(model, tokenizer, data, plan)
    params = [p for _, p in trained_named_weights(model)]
    betas = tuple(plan.get("betas") or (0.9, 0.999))
    opt = torch.optim.AdamW(params, lr=float(plan.lr), betas=betas, weight_decay=float(plan.get("weight_decay", 0.0)))
    accum = int(plan.get("grad_accum", 1))
    train_step = task.train_step_of(int(plan.micro_batch), accum)
    if steps == -1:
        steps = max(1, len(task.order) // (int(plan.micro_batch) * accum))
    return _Run(task, profile, params, opt, accum, train_step, steps, ending_steps_for(ending_share, steps))


def _rates(plan: Plan, run: _Run, run_state: RunState | None, *, schedule: bool, linear: bool,
           ending: Literal["raced", "to_zero"]) -> tuple[LookaheadSchedule | None, Callable[[int], None] | None]:
    """What sets each step's rate: the plan's LookaheadSchedule (continuing from the kept branch's
    steps and rate), or for a recipe plan its warmup and linear decay; the schedule too, or None."""
    recipe_rate = _recipe_rate(plan, run.steps, run.opt) if linear else None
    held = run.task.held_out_losses() if run.task.split.held_out else None  # a recipe on every row reads none
    if not schedule:
        return None, recipe_rate
    from leadline.lookahead.rate.schedule import LookaheadSchedule, lookahead_from

    taken = (run_state.steps, run_state.lr) if run_state is not None else None  # the kept branch's steps and rate
    config = lookahead_from(plan, taken=taken, ending=ending, ending_steps=run.ending_steps)
    sched = LookaheadSchedule(run.params, run.opt, run.train_step, held, config, total_steps=run.steps)
    return sched, sched.before


def _train_steps(run: _Run, run_state: RunState | None, sched: LookaheadSchedule | None,
                 rate_of_step: Callable[[int], None] | None,
                 on_step: Callable[[dict[str, Any]], None] | None) -> tuple[list[dict[str, Any]], Any]:
    """The run's steps through the one loop under the spill cap, from the kept branch's step (or 0):
    the curve, and the schedule's ending (None without one)."""
    from leadline.memory import forbid_spill
    from leadline.run.loop import guarded_steps

    with forbid_spill(run.task.device):
        start = _continue(run_state, sched, run.params, run.opt)
        done = guarded_steps(run.opt, run.train_step, range(start, run.steps),
                             watch=sched.watch if sched is not None else None, before=rate_of_step, on_step=on_step)
        if done.diverged_at is not None:
            raise InputError(f"the training loss became non-finite at step {done.diverged_at}; the rate "
                             f"{run.opt.param_groups[0]['lr']:.3g} is too high for these rows")
        ended = sched.finish() if sched is not None else None
    run.opt.zero_grad(set_to_none=True)
    return done.curve, ended


def _refuse_an_ending(ending: str, ending_share: float | None) -> None:
    """A race plan has no ending to set."""
    if ending != "raced" or ending_share is not None:
        raise InputError("this plan trains with schedule-free AdamW, whose averaged weights are the model: it has no "
                         "ending to set; leave ending and ending_share out")


def _train_race_plan(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, data: RowSource, plan: Plan, *,
                     out_dir: str | os.PathLike[str] | None, total_steps: int | None,
                     on_step: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
    """A race plan (``leadline derive``'s default, ``derive_for(effort="race")``): schedule-free
    AdamW at the plan's rate, warmup and step from the start, the run's rows split as the plan's."""
    from leadline.run import RunOptions, run_in_one

    _need(plan, "micro_batch", "lr")
    rows = int(plan.get("rows_per_step") or int(plan.micro_batch) * int(plan.get("grad_accum", 1)))
    seed = int(plan.held_out.get("seed", 0)) if isinstance(plan.held_out, dict) else 0
    fields = plan.data.get("fields") if isinstance(plan.data, dict) else None
    options = RunOptions(total_steps=total_steps or plan.get("total_steps"), rows_per_step=rows, seed=seed,
                         seq_len=plan.get("seq_len"), fields=fields or None, rate=plan["lr"])
    _, result = run_in_one(model, tokenizer, data, options, out_dir=out_dir, on_step=on_step, prepared=plan.prepared)
    return {**result.as_dict(), "seconds": result.seconds.get("run_seconds", 0.0)}


def _test_losses(task: Any) -> list[float] | None:
    """The test rows' losses on the model as it is now (None where the split has no test rows)."""
    if not task.split.test:
        return None
    return task.split.reader(task.model, task.rows, "test", device=task.device, pad_id=task.pad_id)()


def _data_notes(profile: Any) -> list[str]:
    """What the run changed in the user's rows (:func:`leadline.corpus.data_notes`)."""
    from leadline.corpus import data_notes

    return data_notes(profile)


def _recipe_rate(plan: Plan, steps: int, opt: Any) -> Callable[[int], None]:
    """Sets the recipe plan's rate for each step: warmup from 0 over ``warmup_ratio`` of the steps,
    then linear decay to zero (:func:`linear_lr`)."""
    warmup = max(1, math.ceil(float(plan.get("warmup_ratio", 0.0)) * steps)) if plan.get("warmup_ratio") else 0

    def set_rate(step: int) -> None:
        for g in opt.param_groups:
            g["lr"] = linear_lr(step, float(plan.lr), warmup, steps)
    return set_rate


def _checked_steps(plan: Plan, total_steps: int | None) -> int:
    """The run's length from the caller or the plan (-1: one pass over the training rows, for a
    recipe plan), after checking the plan can be trained on one GPU."""
    _need(plan, "micro_batch", "lr")
    world = plan.machine.get("world") if isinstance(plan.machine.get("world"), dict) else {}
    if int(world.get("world_size") or 1) > 1:
        raise InputError(f"the plan was derived for {world['world_size']} GPUs (its tokens per step count every rank); "
                         "train it under torchrun with as many processes, or derive a plan on one GPU")
    steps = int(total_steps or plan.get("total_steps") or 0)
    if steps < 1 and plan.get("ending") == "linear":
        steps = -1  # one pass over the training rows, counted once the rows are split
    elif steps < 1:
        raise InputError("the run's length is unknown: pass total_steps or derive the plan with --steps/--epochs")
    return steps


def _task(model: Any, tokenizer: Any, data: Any, plan: Plan) -> tuple[Any, Any]:
    """The rows split as derive() split them (the plan's seed), checked against the plan's held-out
    rows, and read by the fields the plan names (``plan.data["fields"]``, as ``--field`` set them);
    with the corpus profile."""
    from leadline.run.task import prepare, split_sizes

    seed = int(plan.held_out.get("seed", 0)) if isinstance(plan.held_out, dict) else 0
    fields = plan.data.get("fields") if isinstance(plan.data, dict) else None
    task, profile = prepare(model, tokenizer, data, seq_len=plan.get("seq_len"), seed=seed, fields=fields or None,
                            **split_sizes(plan.held_out))
    if plan.held_out.get("held_out") and plan.held_out.get("held_out") != task.split.held_out:
        raise InputError("the data's split differs from the plan's held-out rows; pass the same --data the plan was "
                         "derived on")
    return task, profile


def _continue(run_state: Any, sched: Any, params: list[Any], opt: Any) -> int:
    """The step the run starts at: the look-ahead's branch loaded where there is one (the run's
    first steps, taken in derive), else 0."""
    if run_state is None:
        return 0
    if sched is not None:
        sched.before(0)  # the check at step 0, on the weights the branch started from
    run_state.load_into(params, opt)
    if sched is not None:
        sched.continue_at(run_state.steps)
    return int(run_state.steps)


def _add_test_verdict(result: dict[str, Any], before: Any, after: Any) -> None:
    """The test rows' loss before and after the run (mean and SE)."""
    if before is not None and after is not None:
        mb, seb = mean_se(before)
        ma, sea = mean_se(after)
        result["test_loss_before"] = {"mean": mb, "se": seb}
        result["test_loss_after"] = {"mean": ma, "se": sea}


def _save(model: Any, out: Path, result: dict[str, Any]) -> None:
    """The adapter (PEFT) or the weights, and ``run.json`` beside them (:func:`leadline._io.save_run`)."""
    from leadline._io import save_run

    save_run(model, out, result)
