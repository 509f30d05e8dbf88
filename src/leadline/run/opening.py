"""The run's rate (:func:`open_rate`): given, the default where the run is too short to race, or
the winner of the opening race, each candidate rate running the run's first ``h`` steps from one start.

The rule is :mod:`leadline.rate.opening` (pure); the driver (:class:`Opening`) runs it on the
model: it restores the start for each candidate, steps it with its own schedule-free AdamW, reads
the held-out rows at its averaged weights, and keeps what the winner needs to go on (its weights,
optimizer and RNG state).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.plan import Value
from leadline.rate.compare import compare
from leadline.rate.opening import (
    ALPHA,
    ANSWER_ROWS,
    Decision,
    Reading,
    answer_set,
    challenger_ran,
    climb,
    collapsed,
    default_rate_source,
    gold_of,
    horizon,
    opening_rates,
    why_alone,
)
from leadline.rate.watch import StateCopy
from leadline.rng import capture_rng, restore_rng
from leadline.run.answers import answers_chosen
from leadline.run.job import Job
from leadline.run.restore import Found, as_found

if TYPE_CHECKING:
    import torch

    from leadline.run.task import Task


@dataclass
class Opened:
    """The rate and where the run goes on from: the race's winner (its steps kept) or a fresh start."""

    opt: Any
    lr: float
    value: Value
    start_losses: list[float]
    start_copy: StateCopy
    kept_steps: int = 0
    overhead_steps: int = 0
    reads: int = 1
    read_seconds: float = 0.0
    step_seconds: float = 0.0
    seconds: float = 0.0
    winner_losses: list[float] | None = None
    incumbent: float | None = None
    opening: Opening | None = None

    @property
    def horizon(self) -> int:
        """Each candidate's steps in the race (0: no race)."""
        return self.opening.h if self.opening is not None else 0


def open_rate(job: Job, rate: Value | None, decide_share: float, found: Found, keep: bool) -> Opened:
    """The start read on every held-out row, then the rate: ``rate`` where given, the default where
    the run is too short to race within ``decide_share`` of its steps, else the race's winner. The
    race's start is put back through ``found`` (:func:`~leadline.run.restore.as_found`) on an error,
    and always where the winner's steps are not kept (``keep`` False: the race alone)."""
    t0 = time.perf_counter()
    task, rates = job.task, opening_rates(job.trained_as)
    fresh = optimizer(job.params, rate.value if rate is not None else rates[0], job.warmup)
    start_copy = StateCopy.take(job.params, fresh)  # the start: its weights and a fresh optimizer
    t = time.perf_counter()
    with as_found(task.model, "mode"):  # the mode it was given, on every exit path (the run sets its own)
        task.model.eval()
        start_losses = task.held_out_losses()()
    read_seconds = time.perf_counter() - t
    h = 0 if rate is not None else min(horizon(job.steps, decide_share), job.steps)
    if not h:
        lr = float(rate.value) if rate is not None else rates[0]
        for g in fresh.param_groups:
            g["lr"] = lr
        fresh.train()
        return Opened(fresh, lr, rate or _default_value(job, lr, decide_share), start_losses, start_copy,
                      read_seconds=read_seconds, seconds=time.perf_counter() - t0)
    opening = Opening(task, job.params, job.step, h, job.warmup)
    found.callback(opening.rewind)  # the start put back: a race cut short, or a race alone
    decision, readings = climb(opening, rates, start=start_losses)
    kept = h if keep else 0
    value = _raced_value(job, opening, decision, readings, start_losses, decide_share, keep)
    return Opened(opening.resume(decision.lr) if keep else None, decision.lr, value, start_losses, start_copy,
                  kept_steps=kept, overhead_steps=opening.steps - kept, reads=opening.reads + 1,
                  read_seconds=opening.read_seconds + read_seconds, step_seconds=opening.step_seconds,
                  seconds=time.perf_counter() - t0, winner_losses=readings[decision.lr].losses,
                  incumbent=rates[0] if decision.lr > rates[0] else None, opening=opening)


def _default_value(job: Job, lr: float, decide_share: float) -> Value:
    short = ("the decision's share is 0 (--decide-share 0): the race has no steps" if not decide_share else
             f"a run of {job.steps} steps is too short to race rates within {decide_share:.0%} of its steps")
    return Value(lr, "constant", default_rate_source(job.trained_as, short), unit="per step")


def _raced_value(job: Job, opening: Opening, decision: Decision, readings: dict[float, Reading],
                 start_losses: list[float], decide_share: float, keep: bool) -> Value:
    """The race's winner as the plan's rate, the race's tests and readings its evidence."""
    h = opening.h
    race = {"horizon_steps": h, "rates": list(opening_rates(job.trained_as)), "tests": decision.tests,
            "decide_share": decide_share,
            "readings": {f"{lr:.3g}": {"mean": r.mean, "collapsed": r.collapsed} for lr, r in readings.items()},
            "start": {"mean": math.fsum(start_losses) / len(start_losses)},
            "collapse_checked": opening.answers is not None}
    fate = (f"its {h} steps are the run's first" if keep else
            "its steps were not kept: the run trains from the weights the race started from")
    if not challenger_ran(decision):  # the default alone: checked by the guard, not measured against another
        return Value(decision.lr, "constant", f"{default_rate_source(job.trained_as, why_alone(decision, h))}; {fate}",
                     evidence=race, unit="per step")
    return Value(decision.lr, "measured", f"won the opening race on {len(job.task.split.held_out)} held-out rows "
                 f"after {h} steps: {decision.sentence()}; {fate}", evidence=race, unit="per step")


def optimizer(params: list[torch.nn.Parameter], lr: float, warmup: int) -> torch.optim.Optimizer:
    """Schedule-free AdamW over ``params`` at ``lr``, its warmup over ``warmup`` steps, no weight decay."""
    try:
        import schedulefree
    except ImportError:
        raise InputError("leadline run trains with schedule-free AdamW; pip install 'leadline[hf]' (it brings "
                         "schedulefree), or pass --effort full") from None
    return schedulefree.AdamWScheduleFree(params, lr=lr, warmup_steps=warmup, weight_decay=0.0)


class Opening:
    """The candidates' runs from one start: each restores the start, runs ``h`` steps with its
    own optimizer, reads the held-out rows at its averaged weights, and keeps what the winner
    needs to go on (its weights in train mode, its optimizer, the RNG state)."""

    def __init__(self, task: Task, params: list[torch.nn.Parameter], step: Callable[[int], float], h: int,
                 warmup: int) -> None:
        import torch

        self.task, self.params, self.step, self.h, self.warmup = task, params, step, h, warmup
        self.start = [p.detach().clone() for p in params]
        self.rng = capture_rng()
        self.kept: dict[float, tuple[list[Any], Any, dict[str, Any]]] = {}
        self.read = task.held_out_losses()
        self.answers = answer_set(task.rows, task.split.train)
        self.asked = list(task.split.held_out)[:ANSWER_ROWS]  # the rows a challenger's answers are chosen on
        self.gold = gold_of(task.rows, self.asked, self.answers) if self.answers else None
        self.incumbent: float | None = None  # the first rate run: the default, whose answers are not checked
        self.incumbent_losses: list[float] = []
        self.reads = self.steps = 0
        self.read_seconds = self.step_seconds = 0.0
        self.torch = torch

    def __call__(self, lr: float) -> Reading:
        with self.torch.no_grad():
            for p, s in zip(self.params, self.start):
                p.copy_(s)
        restore_rng(self.rng)
        opt = optimizer(self.params, lr, self.warmup)
        self.task.model.train()
        opt.train()
        t = time.perf_counter()
        finite = _take_steps(opt, self.step, range(self.h))
        self.step_seconds += time.perf_counter() - t
        self.steps += self.h
        self.kept[lr] = ([p.detach().clone() for p in self.params], opt, capture_rng())
        if not finite:
            return Reading(lr, [math.inf] * max(1, len(self.task.split.held_out)))
        opt.eval()
        t = time.perf_counter()
        losses = self.read()
        if self.incumbent is None:
            self.incumbent, self.incumbent_losses = lr, losses
        # the answers are read only for a challenger that reads lower than the default: the one that could replace it
        could_win = (self.answers is not None and lr != self.incumbent
                     and compare(losses, self.incumbent_losses, alpha=ALPHA).better)
        choices = (answers_chosen(self.task.model, self.task.rows, self.asked, self.answers, self.task.device,
                                  self.task.pad_id) if could_win else None)
        self.read_seconds += time.perf_counter() - t
        self.reads += 1
        opt.train()
        gone = choices is not None and collapsed(choices, self.gold or [])
        return Reading(lr, losses, choices, gone)

    def rewind(self) -> None:
        """The start put back, bit for bit, with the RNG as it stood there; every copy freed."""
        with self.torch.no_grad():
            for p, s in zip(self.params, self.start):
                p.copy_(s)
        restore_rng(self.rng)
        self.kept.clear()
        self.start = []

    def resume(self, lr: float) -> torch.optim.Optimizer:
        """The winner's weights, RNG and optimizer put back; the others' copies freed."""
        weights, opt, rng = self.kept[lr]
        with self.torch.no_grad():
            for p, w in zip(self.params, weights):
                p.copy_(w)
        restore_rng(rng)
        self.kept.clear()
        self.start = []
        return opt


def _take_steps(opt: torch.optim.Optimizer, step: Callable[[int], float], steps: range,
                on_step: Callable[[dict[str, Any]], None] | None = None, t0: float | None = None) -> bool:
    """The optimizer steps ``steps`` through the run's one loop (no guard: the race reads its own);
    False at the first non-finite loss (the step not taken)."""
    from leadline.run.loop import guarded_steps

    return guarded_steps(opt, step, steps, on_step=on_step, t0=t0 or 0.0).diverged_at is None


