"""``leadline run``'s default job: one load, the rate raced on the opening steps, one guarded loop.

The recipe, top to bottom (:func:`run_in_one`), each step in its own module:

1. the rows tokenized and split once (held out: what the decisions read, at most 10% and 256
   rows; no test split unless asked) and the run's length (:mod:`leadline.run.job`);
2. the micro-batch: the most of the step's rows a forward and backward runs, an out-of-memory
   error halving it (:mod:`leadline.run.fit`);
3. the start read on every held-out row, then the rate: raced on the run's opening steps, or
   given (:mod:`leadline.run.opening`);
4. the run's steps under the guard, and the kept model read again on every held-out row against
   the start (:mod:`leadline.run.end`, :mod:`leadline.rate.guard`, :mod:`leadline.run.loop`);
5. the plan's values and phase table (:mod:`leadline.run.values`) and the result, written once
   (:mod:`leadline.run.result`).

The optimizer is schedule-free AdamW, whose averaged weights are the model at every step: nothing
is rerun at the end. :func:`race_only` is steps 1 to 3 alone (``derive_for``, ``leadline
derive``): the rate decided, the model put back as it was found (:mod:`leadline.run.restore`).

    plan, result = run_in_one(model, tokenizer, "train.jsonl", out_dir="run")
    plan, result = run_in_one(model, tokenizer, "train.jsonl", RunOptions(total_steps=200, seed=1))
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from leadline.corpus import data_notes
from leadline.plan import Plan
from leadline.run.answers import answers_before
from leadline.run.end import Guarded, guarded, read_test
from leadline.run.fit import fit
from leadline.run.job import Job, Prepared, join_held_out, prepare_job
from leadline.run.opening import Opened, open_rate
from leadline.run.options import RunOptions, options_of
from leadline.run.restore import as_found
from leadline.run.result import Reading, RunCost, RunResult, write
from leadline.run.values import opening_phases, plan_of, set_run_phases, set_values

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from leadline.corpus.rows import RowSource


def run_in_one(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, data: RowSource,
               options: RunOptions | None = None, *,
               out_dir: str | os.PathLike[str] | None = None, on_step: Callable[[dict[str, Any]], None] | None = None,
               load_seconds: float | None = None, prepared: Prepared | None = None) -> tuple[Plan, RunResult]:
    """Decide the rate on the run's opening steps and train to the end under the guard, in one process.

    Returns the plan (every number with its source; ``plan.phases`` the cost table) and the
    :class:`~leadline.run.result.RunResult`. With ``out_dir`` the adapter (or the weights; none
    where the run ended no better than its start), ``plan.json`` and ``run.json`` are written.

    ``options``: the run's length, its rows a step, the race's share, the seed, the rows' fields,
    a test share or the user's eval rows, ``train_held_out``, a rate given in place of the race
    (:class:`RunOptions`; None: its defaults). ``on_step``: called with each step's record (step,
    loss, rate, seconds). ``load_seconds``: the caller's load of the model, written into
    ``run.json`` with the run's own. ``prepared``: a race's rows (its plan's ``prepared``), reused
    where they fit (:meth:`~leadline.run.job.Prepared.fits`). Where the run stops with an error
    before its first step (in its race among others), the model's weights, mode, gradients and
    RNG states are as it was given.
    """
    opts = options_of(options)
    t_all = time.perf_counter()
    with as_found(model, keep=True) as found:  # kept where the race ends: the run goes on from its winner
        job = prepare_job(model, tokenizer, data, opts, prepared)
        prepare_seconds = time.perf_counter() - t_all  # the rows read, tokenized and split
        plan = plan_of(model, data, opts.fields, job)
        fit(job)
        test_before, answers = read_test(job.task), answers_before(job.task, tokenizer)
        opened = open_rate(job, opts.rate, opts.decide_share, found, keep=True)
    if opts.train_held_out:
        _train_held_out(plan, job, fixed_steps=bool(opts.total_steps))
    ran = guarded(job, opened, on_step)
    test_after = read_test(job.task)
    set_values(plan, job, opened, rows_given=opts.rows_per_step is not None)
    plan.derive_seconds = job.fit_seconds + opened.seconds
    seconds = {**_seconds_of(ran), "run_seconds": time.perf_counter() - t_all, "derive_seconds": plan.derive_seconds,
               "prepare_seconds": prepare_seconds,
               **({"load_seconds": load_seconds} if load_seconds is not None else {})}
    result = _result_of(job, opened, ran, opts, (test_before, test_after), seconds)
    result.answers = answers and answers.after(job.check_rows if job.joined else None, result.test_source)
    set_run_phases(plan, job, opened, result)
    write(plan, result, model, out_dir)
    return plan, result


def race_only(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, data: RowSource,
              options: RunOptions | None = None, *,
              out_dir: str | os.PathLike[str] | None = None) -> Plan:
    """The rate decided by the run's opening race (or given, ``options.rate``), and nothing trained:
    the model, its mode, its gradients and the RNG states put back bit for bit (``derive_for``,
    ``leadline derive``).

    Returns the plan of the run that would follow, with the rows the race prepared
    (``plan.prepared``, never written to its JSON) for :func:`run_in_one` to reuse. ``options``:
    as :func:`run_in_one` reads them (``train_held_out`` is the run's alone). With ``out_dir``,
    ``plan.json`` is written there.
    """
    opts = options_of(options)
    with as_found(model) as found:
        job = prepare_job(model, tokenizer, data, opts)
        plan = plan_of(model, data, opts.fields, job)
        fit(job)
        opened = open_rate(job, opts.rate, opts.decide_share, found, keep=False)
    plan.prepared = Prepared(job.task, job.profile, tokenizer, data, opts.seed, opts.fields)  # for the run after
    set_values(plan, job, opened, rows_given=opts.rows_per_step is not None)
    plan.phases = opening_phases(job, opened)
    plan.derive_seconds = job.fit_seconds + opened.seconds
    write(plan, None, model, out_dir)
    return plan


def _train_held_out(plan: Plan, job: Job, fixed_steps: bool) -> None:
    """``train_held_out``: the held-out rows no check reads train after the opening (:func:`join_held_out`)."""
    join_held_out(job, fixed_steps)
    plan.notes.append(f"the held-out rows no check reads ({job.joined}) trained after the opening race: the checks "
                      f"and the verdict read the other {job.check_rows}")


def _seconds_of(ran: Guarded) -> dict[str, float]:
    """The guarded run's seconds: its steps', its checks' and its verdict's."""
    return {"steps_seconds": ran.seconds - ran.check_seconds - ran.end.seconds, "check_seconds": ran.check_seconds,
            "verdict_seconds": ran.end.seconds, "more_passes_seconds": ran.more_passes_seconds}


def _result_of(job: Job, opened: Opened, ran: Guarded, opts: RunOptions,
               tests: tuple[Reading | None, Reading | None], seconds: dict[str, float]) -> RunResult:
    """The run's result, built once: its length and shape, the rate the guard ended at, the curve and
    the checks, the verdicts before and after (held out, and test rows where there are any), the cost."""
    task, end, done = job.task, ran.end, ran.done
    cost = RunCost(kept_steps=opened.kept_steps, overhead_steps=opened.overhead_steps, run_steps=job.steps,
                   held_out_reads=opened.reads, check_reads=ran.check_reads, check_rows=ran.check_rows,
                   check_seconds=ran.check_seconds,
                   steps_not_run=(job.steps - done.stopped_at) if done.stopped_at else 0,
                   budget_share=opts.decide_share)
    test_source = "eval rows" if opts.eval_data is not None else ("test share" if task.split.test else None)
    return RunResult(job.steps, job.micro_batch, job.rows_per_step // job.micro_batch, ran.guard.rate,
                     len(task.split.train) + job.joined, opts.seed, curve=done.curve, checks=ran.guard.records,
                     cost=cost, held_out_before=Reading.of(end.before), held_out_after=end.after,
                     test_before=tests[0], test_after=tests[1], test_source=test_source, outcome=end.outcome,
                     kept_step=ran.guard.kept_step, data_notes=data_notes(job.profile), seconds=seconds,
                     passes=job.steps // job.pass_steps if job.passes_why != "given" else None,
                     extra_pass_steps=job.steps - job.pass_steps)
