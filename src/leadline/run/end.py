"""The run's steps under the guard and its end: the end kept or the best check put back, the kept
model read on every held-out row against the start, its answers checked for a collapse, and the
start's weights put back where the run ended no better (the verdict, :func:`leadline.rate.guard.outcome`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leadline.corpus.losses import row_losses
from leadline.rate.guard import Guard, Outcome, check_plan, check_steps, outcome
from leadline.rate.opening import ANSWER_ROWS, answer_set, collapsed, gold_of
from leadline.rate.watch import Watch
from leadline.run.answers import answers_chosen
from leadline.run.job import Job
from leadline.run.length import half_a_pass_before, still_improving
from leadline.run.loop import Looped, guarded_steps
from leadline.run.opening import Opened
from leadline.run.restore import as_found
from leadline.run.result import Reading

if TYPE_CHECKING:
    from leadline.run.task import Task


@dataclass
class End:
    """The verdict: the start's and the kept model's held-out losses and what they say."""

    before: list[float]
    after: Reading
    outcome: Outcome
    seconds: float


@dataclass
class Guarded:
    """What the run's steps under the guard did, and their end."""

    done: Looped
    guard: Guard
    end: End
    check_rows: int
    check_reads: int
    check_seconds: float
    seconds: float
    more_passes_seconds: float = 0.0  # the steps of the passes after the first (their reads left out)


def guarded(job: Job, opened: Opened, on_step: Callable[[dict[str, Any]], None] | None) -> Guarded:
    """The run's steps from where the race left it, under the guard, pass by pass where its length
    was not given (:func:`more_passes`), and the end decided."""
    task, start = job.task, opened.kept_steps
    rows, n_checks = check_plan(len(task.split.held_out), job.rows_per_step, job.steps)
    rows = job.check_rows or rows  # where held-out rows trained, the checks keep to the rows that did not
    subset = [task.rows[i] for i in task.split.held_out[:rows]]
    latest: list[list[float]] = []
    by_step: dict[int, list[float]] = {0: list(opened.start_losses[:rows])}  # each check's per-row losses

    def read() -> list[float]:
        latest.append(row_losses(task.model, subset, None, task.device, pad_id=task.pad_id))
        return latest[-1]

    def said(step: int, _: Any) -> None:  # a check that read: its losses kept by its step, for the pass rule
        if latest:
            by_step[step] = latest.pop()

    at = check_steps(job.steps, start, n_checks)
    guard = Guard(rate=opened.lr, looks=max(1, len(at) + (1 if start else 0)), incumbent=opened.incumbent)
    watch = Watch(guard, job.params, opened.opt, read, model=task.model, checks=[s for s in at if s < job.steps],
                  on_said=said)
    watch.start(0, opened.start_losses[:rows], copy=opened.start_copy)
    t = time.perf_counter()
    task.model.train()
    if start and opened.winner_losses is not None:  # the race's winner is the first check
        by_step[start] = list(opened.winner_losses[:rows])
        watch.check(start, by_step[start], why="the opening race's winner")
    done = guarded_steps(opened.opt, job.step, range(start, job.steps), watch=watch, on_step=on_step)
    job.pass_steps = job.steps
    more = more_passes(job, opened, watch, by_step, done, n_checks, on_step, rows)
    check_seconds, check_reads = watch.read_seconds + watch.copy_seconds, watch.reads
    end = _end(job, opened, watch, read if job.joined else task.held_out_losses(), rows)
    return Guarded(done, guard, end, rows, check_reads + 1, check_seconds, time.perf_counter() - t, more)


def more_passes(job: Job, opened: Opened, watch: Watch, by_step: dict[int, list[float]], done: Looped,
                n_checks: int, on_step: Callable[[dict[str, Any]], None] | None, rows: int) -> float:
    """The passes after the first (:mod:`leadline.run.length`): at each pass's end a check, and another
    pass with the first pass's checks while that check is significantly below the check half a pass
    before it (:func:`~leadline.run.length.half_a_pass_before`), or reads flat while the held-out
    answers have collapsed (:func:`_collapsed`, read at the averaged weights as a check reads), and
    the guard kept it. ``done`` grows by their steps; returns their steps' seconds (reads left out)."""
    t, reads_before = time.perf_counter(), watch.read_seconds + watch.copy_seconds
    while job.passes_left > 0 and not done.stopped_at:
        if watch.check(job.steps, why="the pass's end").action not in ("best", "keep"):
            job.passes_why = "guard"
            break
        before = half_a_pass_before(sorted(by_step), job.steps, job.pass_steps)
        if still_improving(by_step[job.steps], by_step[before]):
            job.passes_why = "cap"
        elif watch.read_now(lambda: [float(_collapsed(opened, job.task, rows if job.joined else None))])[0]:
            job.passes_why = "collapsed"
        else:
            job.passes_why = "flat"
            break
        job.passes_left -= 1
        at = [job.steps + s for s in check_steps(job.pass_steps, 0, n_checks)]
        watch.guard.looks += len(at)
        job.steps += job.pass_steps
        watch.checks.update(s for s in at if s < job.steps)
        then = guarded_steps(opened.opt, job.step, range(job.steps - job.pass_steps, job.steps), watch=watch,
                             on_step=on_step)
        done.steps, done.curve, done.stopped_at = done.steps + then.steps, done.curve + then.curve, then.stopped_at
    return time.perf_counter() - t - (watch.read_seconds + watch.copy_seconds - reads_before)


def _end(job: Job, opened: Opened, watch: Watch, read_all: Callable[[], list[float]], rows: int) -> End:
    """The end decided (kept, or the best check put back), the kept model read on every held-out
    row no step trained on (``read_all``), its answers checked for a collapse, and the start put
    back where it is no better."""
    task, opt = job.task, opened.opt
    t = time.perf_counter()
    start = opened.start_losses[:rows] if job.joined else opened.start_losses
    losses = watch.end(job.steps, read_all)
    if hasattr(opt, "eval"):
        opt.eval()  # the averaged weights: the model
    task.model.eval()
    improved = outcome(start, losses) == "improved"
    result = outcome(start, losses, improved and _collapsed(opened, task, rows if job.joined else None))
    if result == "no_better_than_start":
        watch.kept[0].load(job.params, opt)  # the start's weights are the result
        losses = list(start)
    return End(start, Reading.of(losses), result, time.perf_counter() - t)


def _collapsed(opened: Opened, task: Task, rows: int | None = None) -> bool:
    """The kept model's answers on the held-out rows (the first ``rows`` where the rest trained), where
    the data has a small set of answers: one answer over 60% where the gold's majority is under 40%
    (the race's rule)."""
    o = opened.opening
    answers = o.answers if o is not None else answer_set(task.rows, task.split.train)
    if not answers:
        return False
    asked = list(task.split.held_out)[:min(ANSWER_ROWS, rows or ANSWER_ROWS)]
    gold = gold_of(task.rows, asked, answers)
    return collapsed(answers_chosen(task.model, task.rows, asked, answers, task.device, task.pad_id), gold)


def read_test(task: Task) -> Reading | None:
    """The test rows' losses (a test share, or the user's eval rows) in eval mode, the model's mode
    put back after; None where the split has none."""
    if not task.split.test:
        return None
    with as_found(task.model, "mode"):
        task.model.eval()
        return Reading.of(task.split.reader(task.model, task.rows, "test", device=task.device, pad_id=task.pad_id)())
