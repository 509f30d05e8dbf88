"""derive(): the recipe. The phases in order, each a call that returns its values.

1. corpus        profile_corpus: rows, scored tokens, the length
2. noise         measure_noise_scale: B_noise in scored tokens
3. memory        the ramp: the rows a training run fits, bounded by the rows the step needs,
                 and t_micro / t_step at that shape
4. step          tokens_per_step: B*, the micro-batch cut to it, grad_accum
5. anchor        the rewrite scale and its divisor (constants: used only where nothing runs)
6. first step    measure_first_step: alpha1
7. rate          lookahead_lr: the look-ahead
8. warmup        warmup from alpha1, weight decay 0, betas
9. length        total_steps from epochs when given so

The noise is measured before the ramp (SPEC lists the ramp first) because the ramp's upper
limit is the rows the target step needs, which only the noise scale says. The time budget,
progress and resume wrap the calls (:mod:`leadline.lookahead.runner`); derive() leaves no trace
(:mod:`leadline.lookahead.derive.no_trace`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leadline.errors import InputError
from leadline.lookahead.derive import phases
from leadline.lookahead.derive.no_trace import leave_no_trace
from leadline.lookahead.derive.strategy import strategy_for
from leadline.lookahead.derive.timed import (
    CountedReads,
    CountedSteps,
    held_estimate,
    step_estimate,
    timed_reads,
    timed_steps,
)
from leadline.lookahead.noise.step import DEFAULT_STEP_FOR, STEP_FOR
from leadline.lookahead.pieces import Corpus, CountedSource, Pieces, optimizer_of
from leadline.lookahead.rate.policy import fallback_rate
from leadline.lookahead.runner import PhaseRunner, ProgressFn, StepPhase
from leadline.lookahead.strategy import Strategy
from leadline.lookahead.world import current_world
from leadline.measure.machine import describe_machine
from leadline.memory import forbid_spill
from leadline.memory.step import device_of
from leadline.plan import Plan, Value
from leadline.provenance import describe_data

EFFORTS = ("full",)
REMOVED_EFFORTS = ("quick",)
"""Efforts leadline had and no longer has: refused with a sentence naming what to use instead."""
TRAINED_AS = ("factors", "weights")
_STEP_NEEDS = ("noise_scale_tokens", "rows_fit", "t_micro_seconds", "t_step_seconds")
_PAST_FORMAT_NEEDS = ("alpha1", "noise_scale_tokens", "rows_fit", "micro_batch")


def _check(effort: str, trained_as: str, total_steps: int | None, epochs: float | None,
           rows_per_step: int | None = None, step_for: str | None = None) -> None:
    if effort in REMOVED_EFFORTS:
        raise InputError(f"effort={effort!r} was removed: derive() runs the full effort (the look-ahead); pass "
                         "effort='full' or leave it out, or use derive_for(..., effort='race') for the race")
    if effort not in EFFORTS:
        raise InputError(f"effort={effort!r} is not one of {', '.join(EFFORTS)}; full runs the look-ahead")
    if trained_as not in TRAINED_AS:
        raise InputError(f"trained_as={trained_as!r} is not one of {', '.join(TRAINED_AS)}; 'factors' for LoRA/PiSSA, "
                         "'weights' for anything trained as a weight")
    if total_steps is not None and epochs is not None:
        raise InputError("pass total_steps or epochs, not both")
    whole = isinstance(total_steps, int) and not isinstance(total_steps, bool)
    if total_steps is not None and (not whole or total_steps < 1):
        raise InputError(f"total_steps must be a whole number of optimizer steps >= 1, got {total_steps!r}")
    if epochs is not None and (not isinstance(epochs, (int, float)) or not epochs > 0 or not math.isfinite(epochs)):
        raise InputError(f"epochs must be a positive number, got {epochs!r}")
    if rows_per_step is not None and (isinstance(rows_per_step, bool) or not isinstance(rows_per_step, int)
                                      or rows_per_step < 1):
        raise InputError(f"rows_per_step must be a whole number of rows >= 1, got {rows_per_step!r}; pass e.g. 16 "
                         "or leave it out for the measured step")
    if step_for is not None and rows_per_step is not None:
        raise InputError(f"pass rows_per_step or step_for={step_for!r}, not both: each decides the step")
    if step_for is not None and step_for not in STEP_FOR:
        raise InputError(f"step_for={step_for!r} is not one of {', '.join(STEP_FOR)}; time: the least time to a loss, "
                         "rows: the most from each row in that time")


def derive(
    corpus: Corpus | None = None,
    pieces: Pieces | None = None,
    *,
    effort: str = "full",
    total_steps: int | None = None,
    epochs: float | None = None,
    rows_per_step: int | None = None,
    step_for: str | None = None,
    max_seconds: float | None = None,
    started: float | None = None,
    on_progress: ProgressFn | None = None,
    resume: str | os.PathLike[str] | None = None,
    prior: Plan | str | os.PathLike[str] | None = None,
) -> Plan:
    """Derive a fine-tuning plan from measurements. Everything is optional: each phase runs when
    what it needs is given, and a plan with three derived values and an honest gap beats one with
    ten nobody can tell apart.

    Args:
        corpus: the training rows and how the run reads them (:class:`~leadline.lookahead.pieces.Corpus`).
        pieces: the model's pieces the phases measure with (:class:`~leadline.lookahead.pieces.Pieces`).
        effort: ``"full"`` (the look-ahead), the only one derive() runs.
        total_steps / epochs: the run's length (epochs need the corpus and the step).
        rows_per_step: the rows an optimizer step takes, fixed by the caller (a batch size the
            run must keep): the card decides only its micro-batch and accumulation, the rate
            phases run at it, and the least-time step is kept in ``tokens_per_step``'s evidence.
        step_for: what the measured step optimizes: ``"rows"`` (the default: the smallest step
            whose time a row is what the least-time step pays a row to the loss its rows reach at
            a small step, :func:`~leadline.lookahead.noise.step.rows_step_rule`) or ``"time"`` (the least
            time to a loss).
        max_seconds: a bound on the whole derive; phases it does not reach are listed in
            ``plan.skipped`` and ``plan.notes``.
        started: the ``time.monotonic()`` at which max_seconds began (default: now); a
            wrapper that prepares the pieces first (``leadline.hf.derive_for``) passes its own
            start, so its set-up counts against the bound too.
        on_progress: called with ``{"phase", "status", "elapsed_s", ...}`` per phase
            (:class:`~leadline.lookahead.progress.PhaseBar` draws them).
        resume: a file a killed derive continues from (written atomically after each phase,
            removed when derive finishes).
        prior: an earlier plan to check with short measurements instead of starting over.

    Returns:
        The :class:`~leadline.plan.Plan`; ``plan.phases`` says where its seconds went (a
        :class:`~leadline.plan.PhaseTime` per phase) and ``plan.derive_seconds`` its wall time.

    Examples:
        >>> plan = derive(Corpus(seq_len=512), total_steps=300)
        >>> plan.seq_len, plan.total_steps, plan["total_steps"].kind
        (512, 300, 'given')
        >>> derive(effort="quick")
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: effort='quick' was removed: derive() runs the full effort (the look-ahead); ...
    """
    corpus = corpus if corpus is not None else Corpus()
    pieces = pieces if pieces is not None else Pieces()
    return _derive(corpus, pieces, effort=effort, total_steps=total_steps, epochs=epochs, rows_per_step=rows_per_step,
                   step_for=step_for, max_seconds=max_seconds, started=started, on_progress=on_progress,
                   resume=resume, prior=prior)


def _derive(c: Corpus, p: Pieces, *, effort: str, total_steps: int | None, epochs: float | None,
            rows_per_step: int | None, step_for: str | None, max_seconds: float | None, started: float | None,
            on_progress: ProgressFn | None, resume: str | os.PathLike[str] | None,
            prior: Plan | str | os.PathLike[str] | None) -> Plan:
    """derive() on its arguments unpacked: the phases in order, one call each."""
    corpus, lengths = c.data, c.lengths
    step_fn, grad_fn, optimizer, trained_as = p.step, p.gradients, p.optimizer, p.trained_as
    entered = time.monotonic()
    _check(effort, trained_as, total_steps, epochs, rows_per_step, step_for)
    prior = Plan.from_json(prior) if isinstance(prior, (str, os.PathLike)) else prior
    named = list(p.weights or [])
    params = [w for _, w in named]
    device = p.device if p.device is not None else device_of(step_fn)
    plan = _blank_plan(device, step_fn, p.model_info, c.held_out, params, trained_as, corpus)
    world = strategy_for(current_world())  # one process, or a torch.distributed job of several
    world.check(rows_per_step)
    if step_for is None:  # a step the caller fixed is not measured: the rule is moot there
        step_for = DEFAULT_STEP_FOR if rows_per_step is None else "time"
    train_step_of = CountedSteps(p.train_step_of) if p.train_step_of is not None else None  # counted: plan.phases
    held_out_losses = CountedReads(p.held_out_losses) if p.held_out_losses is not None else None
    rate_ready = optimizer is not None and train_step_of is not None and held_out_losses is not None and bool(params)
    past_format_ready = rate_ready and grad_fn is not None and step_fn is not None and world.burns_in_past_format
    expected = _expected(corpus=c.given, noise=grad_fn is not None,
                         memory=step_fn is not None, rate=rate_ready, past_format=past_format_ready, anchor=bool(named),
                         length=total_steps is None and epochs is not None)
    fingerprint = {**_fingerprint(plan, trained_as, effort, total_steps, epochs, c.seq_len, c.quantile),
                   **({"rows_per_step": rows_per_step} if rows_per_step is not None else {}),
                   **({"step_for": step_for} if step_for != "time" else {})}
    runner = _runner(plan, world, train_step_of, held_out_losses, expected, fingerprint, max_seconds=max_seconds,
                     on_progress=on_progress, resume=resume, started=started)
    with leave_no_trace(params, _optimizers(optimizer, step_fn)), forbid_spill(device if device is not None else "cpu"):
        _corpus(runner, plan, c)
        noise = None if grad_fn is None else runner.run("noise", phases.noise, grad_fn, runner.seconds_left(), world)
        if step_fn is not None:
            runner.run("memory", phases.memory, step_fn, plan, lengths, prior, noise, world, params, runner)
        stepped = None if grad_fn is None or step_fn is None else \
            _step(runner, plan, world, noise, step_fn, rows_per_step, step_for, max_seconds)
        timed = _timed(runner, plan, held_out_losses, train_step_of, _draw_row_seconds(noise, grad_fn)) \
            if rate_ready else None
        first = None
        if timed is not None:
            first = runner.run("first_step", phases.first_step, params, optimizer, timed.steps_of, timed.held, plan,
                               p.loss_resolution, world.per_card_burn_in())
        if past_format_ready:
            burned = runner.run("past_format", phases.past_format, params, optimizer, train_step_of, grad_fn, step_fn,
                                plan, noise, lengths, runner, named, trained_as, rows_per_step, step_for, stepped,
                                needs=_PAST_FORMAT_NEEDS)
            plan.notes.extend(burned.notes if burned is not None else ())
        if named:  # arithmetic on the weights' norms: run whatever the budget says, it is the rate's fallback
            runner.run("anchor", phases.anchor, named, trained_as, plan, grad_fn, always=True)
        _length(runner, plan, total_steps, epochs)
        if timed is not None:
            runner.run("rate", phases.rate, params, optimizer, timed.steps_of, timed.held, plan, prior,
                       first.first if first is not None else None, runner.check_time, needs=("alpha1",))
        runner.run("warmup", phases.warmup, plan, optimizer, always=True)
    return _finish(runner, plan, entered, world)


def _blank_plan(device: Any, step_fn: Any, model_info: Mapping[str, Any] | None, held_out: Mapping[str, Any] | None,
                params: Sequence[Any], trained_as: str, corpus: Any) -> Plan:
    """The plan before any phase: the machine (where anything runs), the model's record, the split, the data's."""
    plan = Plan(machine=describe_machine(device if params or step_fn is not None else None),
                model=dict(model_info or {}), held_out=dict(held_out or {}))
    if params:
        plan.model.setdefault("trained_parameters", int(sum(w.numel() for w in params)))
    plan.model.setdefault("trained_as", trained_as)
    if corpus is not None:
        plan.data = describe_data(corpus)
    return plan


def _fingerprint(plan: Plan, trained_as: str, effort: str, total_steps: int | None, epochs: float | None,
                 seq_len: int | None, quantile: float | None) -> dict[str, Any]:
    """What a resume file must match to be continued: the data, the model and the arguments."""
    return {"data": plan.data.get("sha256"), "trained_parameters": plan.model.get("trained_parameters"),
            "trained_as": trained_as, "effort": effort, "total_steps": total_steps, "epochs": epochs,
            "seq_len": seq_len, "quantile": quantile, "seed": plan.held_out.get("seed")}


def _expected(*, corpus: bool, noise: bool, memory: bool, rate: bool, past_format: bool, anchor: bool,
              length: bool) -> list[str]:
    """The phases derive() calls, in order: the progress bar's total."""
    return [name for name, called in (
        ("corpus", corpus), ("noise", noise), ("memory", memory), ("step", memory and noise),
        ("first_step", rate), ("past_format", past_format), ("anchor", anchor), ("length", length),
        ("rate", rate), ("warmup", True)) if called]


def _runner(plan: Plan, world: Strategy, train_step_of: CountedSteps | None, reads: CountedReads | None,
            expected: list[str], fingerprint: dict[str, Any], *, max_seconds: float | None,
            on_progress: ProgressFn | None, resume: str | os.PathLike[str] | None,
            started: float | None) -> PhaseRunner:
    """The runner for this process: one that agrees with the other ranks in a distributed job."""
    return world.runner(plan, max_seconds=max_seconds, on_progress=on_progress, expected=expected,
                       resume_path=Path(resume) if resume is not None else None, fingerprint=fingerprint,
                       steps_taken=(lambda: train_step_of.steps) if train_step_of is not None else None,
                       work_taken=lambda: (train_step_of.seconds if train_step_of is not None else 0.0,
                                           reads.reads if reads is not None else 0,
                                           reads.seconds if reads is not None else 0.0),
                       numbers_of=phases.training_numbers,
                       **({"started": started} if started is not None else {}))


def _optimizers(optimizer: Any, step_fn: Any) -> list[Any]:
    """The run's optimizer and the step's, each once."""
    return [o for o in {id(o): o for o in (optimizer, optimizer_of(step_fn)) if o is not None}.values()]


def _corpus(runner: PhaseRunner, plan: Plan, c: Corpus) -> None:
    """The corpus phase: a profile given, or one made from the rows; else the length given."""
    if c.profile is not None:
        runner.run("corpus", phases.given_profile, c.profile)
    elif c.data is not None:
        from leadline.corpus import profile_corpus

        runner.run("corpus", profile_corpus, c.data, c.tokenizer, seq_len=c.seq_len, quantile=c.quantile)
    if "seq_len" not in plan and c.seq_len is not None:  # no corpus to measure: the length the caller gave
        plan.set("seq_len", Value(int(c.seq_len), "given",
                                  "the run's length, given by the caller (no corpus was profiled)", unit="tokens"))


def _step(runner: PhaseRunner, plan: Plan, world: Strategy, noise: Any, step_fn: Any, rows_per_step: int | None,
          step_for: str, max_seconds: float | None) -> StepPhase | None:
    """The step phase from the noise (the plan's reading where it was resumed); out of time, the
    step is arithmetic on the ramp's timings: a plan that can train, not none."""
    step0 = noise if noise is not None else plan.get("noise_scale_tokens")
    spent = (left := runner.seconds_left()) is not None and left <= 0
    stepped = runner.run("step", world.step, plan, step0, step_fn=None if spent else step_fn,
                         rows_per_step=rows_per_step, step_for=step_for, needs=_STEP_NEEDS, always=spent)
    if spent and stepped is not None:
        plan.notes.append(f"step: max_seconds={max_seconds:g} was spent before it; its micro-batch and step "
                          "are arithmetic on the memory ramp's timings (one row and the rows that fit were "
                          "not timed in turn)")
    return stepped


@dataclass(frozen=True)
class _Timed:
    """The rate phases' pieces under the time budget: held-out reads and training steps."""

    held: Callable[[], Sequence[float]]
    steps_of: Callable[[int, int], Callable[[int], Any]]


def _timed(runner: PhaseRunner, plan: Plan, held_out_losses: Callable[[], Sequence[float]],
           train_step_of: Callable[[int, int], Callable[[int], Any]], row_seconds: float | None = None) -> _Timed:
    held = timed_reads(held_out_losses, runner.ensure, held_estimate(plan, held_out_losses, row_seconds))
    return _Timed(held, timed_steps(train_step_of, runner.ensure, step_estimate(plan, row_seconds)))


def _draw_row_seconds(noise: Any, grad_fn: Any) -> float | None:
    """One row's forward+backward by the noise probe's draws (their mean seconds over their rows):
    what stands in for the memory phase's timings when max_seconds cut that phase."""
    per_draw = grad_fn.rows_per_draw if isinstance(grad_fn, CountedSource) else None
    seconds = phases.draw_seconds(noise)
    return seconds / int(per_draw) if seconds > 0 and isinstance(per_draw, int) and per_draw > 0 else None


def _length(runner: PhaseRunner, plan: Plan, total_steps: int | None, epochs: float | None) -> None:
    """The length phase: total_steps from epochs, or the total_steps given."""
    if total_steps is None and epochs is not None:
        runner.run("length", phases.length, plan, epochs, needs=("tokens_per_step", "scored_tokens"), always=True)
    elif total_steps is not None:
        plan.set("total_steps", Value(total_steps, "given", "the run's length, given by the caller", unit="steps"))


def _finish(runner: PhaseRunner, plan: Plan, entered: float, world: Strategy) -> Plan:
    """The plan handed back: the fallback rate, derive's wall time, and in a job rank 0's plan on every rank."""
    runner.done()
    lr = fallback_rate(plan)
    if lr is not None:
        plan.set("lr", lr)
    plan.derive_seconds = time.monotonic() - entered
    return world.finish(plan)
