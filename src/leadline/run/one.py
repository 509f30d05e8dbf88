"""``leadline run``'s default job: one load, the rate raced on the opening steps, one guarded loop.

The recipe, top to bottom (:func:`run_in_one`): the rows tokenized and split once (held out:
what the decisions read, at most 10% and 256 rows; no test split unless asked), the micro-batch
(the most of the step's rows a forward and backward runs: an out-of-memory error halves it, a
measurement), the start read on every held-out row, the rate (raced on the run's opening steps,
:mod:`leadline.run.opening`, or given), the run's steps under the guard
(:mod:`leadline.rate.guard`, :mod:`leadline.run.loop`), the kept model read again on every
held-out row against the start, and the result written once. The optimizer is schedule-free
AdamW, whose averaged weights are the model at every step: nothing is rerun at the end.

    plan, result = run_in_one(model, tokenizer, "train.jsonl", out_dir="run")
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from leadline.errors import InputError
from leadline.plan import PhaseTime, Plan, Value
from leadline.rate.guard import Guard, check_plan, check_steps, outcome
from leadline.rate.opening import (
    DECIDE_SHARE,
    challenger_ran,
    climb,
    collapsed,
    default_rate_source,
    horizon,
    opening_rates,
    why_alone,
)
from leadline.rate.watch import StateCopy, Watch
from leadline.run.loop import guarded_steps
from leadline.run.opening import Opening, optimizer
from leadline.run.result import Reading, RunCost, RunResult

ROWS_PER_STEP = 16
"""The step's rows: the default recipe's (a constant: a run of a few hundred steps cannot pay for
the noise probe that would measure it)."""
WARMUP_SHARE = 0.02
"""Schedule-free's warmup: 2% of the run (the setting that won AlgoPerf's self-tuning track)."""


def run_steps_of(rows: int, rows_per_step: int, total_steps: int | None, epochs: float | None) -> int:
    """The run's length: ``total_steps``, else ``epochs`` passes (one by default) over ``rows``.

    Examples:
        >>> run_steps_of(1600, 16, None, None), run_steps_of(800, 16, None, 3), run_steps_of(800, 16, 7, None)
        (100, 150, 7)
        >>> run_steps_of(8, 16, None, None)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: 8 training rows are fewer than one step of 16 rows; pass --rows-per-step 8 or less
    """
    if total_steps:
        return int(total_steps)
    if rows < rows_per_step:
        raise InputError(f"{rows} training rows are fewer than one step of {rows_per_step} rows; pass "
                         f"--rows-per-step {rows} or less")
    return max(1, math.floor((epochs or 1.0) * rows / rows_per_step))


@dataclass
class _Job:
    """What the run is given and what it measured before its first step."""

    task: Any
    profile: Any
    params: list[Any]
    steps: int
    rows_per_step: int
    warmup: int
    trained_as: str
    step: Callable[[int], float] = field(default=lambda s: math.nan)
    micro_batch: int = 0
    tried: list[dict[str, Any]] = field(default_factory=list)
    fit_seconds: float = 0.0
    epochs: float | None = None
    check_rows: int | None = None  # the held-out rows the checks and the verdict read, where the rest trained
    joined: int = 0  # held-out rows that joined the training rows after the opening
    halved: list[dict[str, int]] = field(default_factory=list)  # the micro-batch halved mid-run: step, from, to


@dataclass
class _Opened:
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
    opening: Any = None


def run_in_one(model: Any, tokenizer: Any, data: Any, *, total_steps: int | None = None, epochs: float | None = None,
               rows_per_step: int | None = None, decide_share: float = DECIDE_SHARE, seed: int = 0,
               seq_len: int | None = None, out_dir: str | os.PathLike[str] | None = None,
               on_step: Callable[[dict[str, Any]], None] | None = None, fields: dict[str, str] | None = None,
               train: bool = True, rate: Value | None = None, test_share: float = 0.0,
               eval_data: Any = None, load_seconds: float | None = None,
               train_held_out: bool = False, prepared: Prepared | None = None) -> tuple[Plan, RunResult]:
    """Decide the rate on the run's opening steps and train to the end under the guard, in one process.

    Returns the plan (every number with its source; ``plan.phases`` the cost table) and the
    :class:`~leadline.run.result.RunResult`. With ``out_dir`` the adapter (or the weights; none
    where the run ended no better than its start), ``plan.json`` and ``run.json`` are written.

    ``rows_per_step``: the rows a step takes (None: :data:`ROWS_PER_STEP`, listed as a constant).
    ``rate``: a rate already decided or given (``--lr``): no race, the run trains at it from the
    start under the same guard. ``test_share``: a share of the rows kept out of training and
    deciding for a verdict; ``eval_data``: the user's own rows for it (else the verdict is on the
    held-out rows the decisions read, and the result says so). ``train=False``: the race alone
    (Trainer trains): the model, its mode and the RNG states put back bit for bit.
    ``load_seconds``: the caller's load of the model, written into ``run.json`` with the run's own.
    ``train_held_out``: the held-out rows no check reads train after the opening (:func:`_join_held_out`).
    ``prepared``: a ``train=False`` race's rows (its plan's), reused where they fit (:meth:`Prepared.fits`).
    """
    from leadline.rate.state import capture_rng, restore_rng

    t_all = time.perf_counter()
    rng_before, was_training = capture_rng(), model.training
    job = _prepare(model, tokenizer, data, total_steps, epochs, rows_per_step, seed, seq_len, fields, test_share,
                   eval_data, prepared)
    plan = _plan_of(model, data, fields, job)
    _fit(job)
    test_before, answers = (_read_test(job), _answers_before(job, tokenizer)) if train else (None, None)
    opened = _open(job, rate, decide_share, train, rng_before, was_training)
    if train and train_held_out:
        _join_held_out(job, fixed_steps=bool(total_steps))
        plan.notes.append(f"the held-out rows no check reads ({job.joined}) trained after the opening race: the checks "
                          f"and the verdict read the other {job.check_rows}")
    if not train:  # the race alone: the model's mode, grads and RNG as they were before it
        plan.prepared = Prepared(job.task, job.profile, tokenizer, data, seed, fields)  # for the run that follows
        model.zero_grad(set_to_none=True)
        model.train(was_training)
        restore_rng(rng_before)
        _values(plan, job, opened, decide_share, rows_per_step is not None)
        plan.phases = _opening_phases(job, opened)
        plan.derive_seconds = job.fit_seconds + opened.seconds
        _save(plan, None, model, out_dir)
        return plan, RunResult(job.steps, job.micro_batch, job.rows_per_step // job.micro_batch, opened.lr,
                               len(job.task.split.train), seed, trained=False)
    result = _guarded(job, opened, on_step)
    result.seed, result.test_before, result.cost.budget_share = seed, test_before, decide_share
    result.data_notes = _data_notes(job)
    result.test_after = _read_test(job)
    result.test_source = "eval rows" if eval_data is not None else ("test share" if job.task.split.test else None)
    result.answers = answers and answers.after(job.check_rows if job.joined else None, result.test_source)
    _values(plan, job, opened, decide_share, rows_per_step is not None)
    _phases(plan, job, opened, result)
    result.seconds.update(run_seconds=time.perf_counter() - t_all, derive_seconds=plan.derive_seconds or 0.0,
                          **({"load_seconds": load_seconds} if load_seconds is not None else {}))
    _save(plan, result, model, out_dir)
    return plan, result


@dataclass
class Prepared:
    """The rows a run prepared (tokenized, split, profiled) and what they were prepared from."""

    task: Any
    profile: Any
    tokenizer: Any
    data: Any
    seed: int
    fields: dict[str, str] | None

    def fits(self, model: Any, tokenizer: Any, data: Any, seed: int, seq_len: int | None,
             fields: dict[str, str] | None) -> bool:
        """Whether these are the rows a run of ``model`` on ``data`` would prepare: the same model,
        tokenizer and data (the same object, or the same path), seed, fields and sequence length.

        Examples:
            >>> from types import SimpleNamespace
            >>> m, tok = object(), object()
            >>> p = Prepared(SimpleNamespace(model=m, seq_len=512), None, tok, "train.jsonl", 0, None)
            >>> p.fits(m, tok, "train.jsonl", 0, None, None), p.fits(m, tok, "train.jsonl", 0, 512, None)
            (True, True)
            >>> p.fits(m, tok, "other.jsonl", 0, None, None), p.fits(m, tok, "train.jsonl", 1, None, None)
            (False, False)
        """
        paths = isinstance(data, (str, os.PathLike)) and isinstance(self.data, (str, os.PathLike))
        same_data = data is self.data or (paths and os.fspath(data) == os.fspath(self.data))
        return (self.task.model is model and tokenizer is self.tokenizer and same_data and seed == self.seed
                and (fields or None) == (self.fields or None) and seq_len in (None, self.task.seq_len))


def _prepare(model: Any, tokenizer: Any, data: Any, total_steps: int | None, epochs: float | None,
             rows_per_step: int | None, seed: int, seq_len: int | None, fields: dict[str, str] | None,
             test_share: float, eval_data: Any, prepared: Prepared | None = None) -> _Job:
    from leadline.run.task import prepare, trained_as_of, trained_named_weights

    if not 0 <= test_share < 0.5:
        raise InputError(f"test_share={test_share!r} must be a share in [0, 0.5); pass 0 (the default) or e.g. 0.1")
    rps = int(rows_per_step) if rows_per_step is not None else ROWS_PER_STEP
    if (prepared is not None and not test_share and eval_data is None
            and prepared.fits(model, tokenizer, data, seed, seq_len, fields)):
        task, profile = replace(prepared.task, order=list(prepared.task.order)), prepared.profile
    else:
        task, profile = prepare(model, tokenizer, data, seq_len=seq_len, seed=seed, fields=fields,
                                test=float(test_share), eval_dataset=eval_data)
    steps = run_steps_of(len(task.order), rps, total_steps, epochs)
    return _Job(task, profile, [p for _, p in trained_named_weights(model)], steps, rps,
                max(1, round(WARMUP_SHARE * steps)), trained_as_of(model), epochs=epochs)


def _join_held_out(job: _Job, fixed_steps: bool) -> None:
    """The held-out rows past the checks' subset join the training rows: appended to the run's order
    (so they train late in its first pass, after every row the opening trained on), the run
    lengthened by their steps unless its length was given. The checks and the verdict read the
    subset alone from here on."""
    task = job.task
    rows, _ = check_plan(len(task.split.held_out), job.rows_per_step, job.steps)
    extra = list(task.split.held_out[rows:])
    job.check_rows = rows
    if not extra:
        return
    task.order.extend(extra)  # the run's step function reads this list: the rows join its draws
    job.joined = len(extra)
    if not fixed_steps:
        job.steps = run_steps_of(len(task.order), job.rows_per_step, None, job.epochs)


def _plan_of(model: Any, data: Any, fields: dict[str, str] | None, job: _Job) -> Plan:
    from leadline.corpus import data_notes
    from leadline.provenance import describe_data
    from leadline.run.lora import Lora
    from leadline.run.precision import precision_of

    plan = Plan(data={**describe_data(data), **({"fields": fields} if fields else {})},
                held_out=job.task.split.as_dict())
    plan.model = {"trained_as": job.trained_as, "trained_parameters": int(sum(p.numel() for p in job.params))}
    plan.set("precision", precision_of(model).as_value())  # the dtype, quantization and checkpointing it trains in
    lora = Lora.of(model)  # the adapter it trains through: rank, alpha, targets, dropout
    for name, value in (lora.as_values() if lora is not None else {}).items():
        plan.set(name, value)
    plan.notes.extend(data_notes(job.profile))  # what leadline changed in the rows: cut, dropped, mixed formats
    return plan


def _data_notes(job: _Job) -> list[str]:
    from leadline.corpus import data_notes

    return data_notes(job.profile)


def _fit(job: _Job) -> None:
    t = time.perf_counter()
    job.micro_batch, job.tried = _micro_batch(job.task, job.rows_per_step)
    job.fit_seconds = time.perf_counter() - t
    job.step = _halving_step(job)


def _halving_step(job: _Job) -> Callable[[int], float]:
    """The run's step at the fitted micro-batch; where the card runs out of memory mid-run (another
    process took what was free at the fit), the micro-batch halves to the next divisor of the
    step's rows and the same step is taken again from the same state (its gradient is the same sum
    over the same rows), recorded in ``job.halved``. One row that does not fit is the fit's sentence."""
    import torch

    inner = job.task.train_step_of(job.micro_batch, job.rows_per_step // job.micro_batch)

    def step(s: int) -> float:
        nonlocal inner
        while True:
            try:
                return inner(s)
            except torch.OutOfMemoryError:
                job.task.model.zero_grad(set_to_none=True)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                if job.micro_batch == 1:
                    raise
                mb = max(d for d in range(1, job.micro_batch) if job.rows_per_step % d == 0
                         and d <= job.micro_batch // 2)
                job.halved.append({"step": s, "from": job.micro_batch, "to": mb})
                job.micro_batch = mb
                inner = job.task.train_step_of(mb, job.rows_per_step // mb)
    return step


def _read_test(job: _Job) -> Reading | None:
    task = job.task
    if not task.split.test:
        return None
    task.model.eval()
    try:
        return Reading.of(task.split.reader(task.model, task.rows, "test", device=task.device, pad_id=task.pad_id)())
    finally:
        task.model.train()


def _answers_before(job: _Job, tokenizer: Any) -> Any:
    """Where the rows are a classifier's, the start's answers on the held-out and test rows
    (:mod:`leadline.run.answers`); None for free text."""
    from leadline.run.answers import AnswerReader

    reader = AnswerReader.of(job.task, lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    if reader is not None:
        reader.before()
    return reader


def _open(job: _Job, rate: Value | None, decide_share: float, train: bool, rng_before: Any,
          was_training: bool) -> _Opened:
    """The start read on every held-out row, then the rate: given, too short to race, or raced."""
    from leadline.rate.state import restore_rng

    t0 = time.perf_counter()
    task, rates = job.task, opening_rates(job.trained_as)
    fresh = optimizer(job.params, rate.value if rate is not None else rates[0], job.warmup)
    start_copy = StateCopy.take(job.params, fresh)  # the start: its weights and a fresh optimizer
    task.model.eval()
    t = time.perf_counter()
    try:
        start_losses = task.held_out_losses()()
    finally:  # the mode the caller gave, on every exit path (the run sets its own below)
        task.model.train(was_training)
    read_seconds = time.perf_counter() - t
    h = 0 if rate is not None else min(horizon(job.steps, decide_share), job.steps)
    if not h:
        lr = float(rate.value) if rate is not None else rates[0]
        short = ("the decision's share is 0 (--decide-share 0): the race has no steps" if not decide_share else
                 f"a run of {job.steps} steps is too short to race rates within {decide_share:.0%} of its steps")
        value = rate or Value(lr, "constant", default_rate_source(job.trained_as, short), unit="per step")
        for g in fresh.param_groups:
            g["lr"] = lr
        fresh.train()
        return _Opened(fresh, lr, value, start_losses, start_copy, read_seconds=read_seconds,
                       seconds=time.perf_counter() - t0)
    opening = Opening(task, job.params, job.step, h, job.warmup)
    try:
        decision, readings = climb(opening, rates, start=start_losses)
    except BaseException:  # a race cut short leaves the model as it found it: the start, its RNG and mode
        opening.rewind()
        task.model.zero_grad(set_to_none=True)
        task.model.train(was_training)
        restore_rng(rng_before)
        raise
    opt = opening.resume(decision.lr) if train else None
    if not train:
        opening.rewind()
        task.model.zero_grad(set_to_none=True)
        task.model.train(was_training)
        restore_rng(rng_before)
    race = {"horizon_steps": h, "rates": list(rates), "tests": decision.tests, "decide_share": decide_share,
            "readings": {f"{lr:.3g}": {"mean": r.mean, "collapsed": r.collapsed} for lr, r in readings.items()},
            "start": {"mean": math.fsum(start_losses) / len(start_losses)},
            "collapse_checked": opening.answers is not None}
    fate = (f"its {h} steps are the run's first" if train else
            "its steps were not kept: the run trains from the weights the race started from")
    value = (Value(decision.lr, "measured", f"won the opening race on {len(task.split.held_out)} held-out rows after "
                   f"{h} steps: {decision.sentence()}; {fate}", evidence=race, unit="per step")
             if challenger_ran(decision) else
             Value(decision.lr, "constant", f"{default_rate_source(job.trained_as, why_alone(decision, h))}; {fate}",
                   evidence=race, unit="per step"))
    kept = h if train else 0
    return _Opened(opt, decision.lr, value, start_losses, start_copy, kept_steps=kept,
                   overhead_steps=opening.steps - kept, reads=opening.reads + 1,
                   read_seconds=opening.read_seconds + read_seconds, step_seconds=opening.step_seconds,
                   seconds=time.perf_counter() - t0, winner_losses=readings[decision.lr].losses,
                   incumbent=rates[0] if decision.lr > rates[0] else None, opening=opening)


def _guarded(job: _Job, opened: _Opened, on_step: Callable[[dict[str, Any]], None] | None) -> RunResult:
    """The run's steps under the guard, the end decided, the kept model read against the start."""
    from leadline.corpus.losses import row_losses

    task, params, opt = job.task, job.params, opened.opt
    start = opened.kept_steps
    rows, n_checks = check_plan(len(task.split.held_out), job.rows_per_step, job.steps)
    rows = job.check_rows or rows  # where held-out rows trained, the checks keep to the rows that did not
    subset = [task.rows[i] for i in task.split.held_out[:rows]]
    read = lambda: row_losses(task.model, subset, None, task.device, pad_id=task.pad_id)  # noqa: E731
    at = check_steps(job.steps, start, n_checks)
    guard = Guard(rate=opened.lr, looks=max(1, len(at) + (1 if start else 0)), incumbent=opened.incumbent)
    watch = Watch(guard, params, opt, read, model=task.model, checks=[s for s in at if s < job.steps])
    watch.start(0, opened.start_losses[:rows], copy=opened.start_copy)
    t = time.perf_counter()
    task.model.train()
    if start and opened.winner_losses is not None:  # the race's winner is the first check
        watch.check(start, opened.winner_losses[:rows], why="the opening race's winner")
    done = guarded_steps(opt, job.step, range(start, job.steps), watch=watch, on_step=on_step)
    check_seconds, check_reads = watch.read_seconds + watch.copy_seconds, watch.reads
    end = _end(job, opened, watch, read if job.joined else task.held_out_losses(), rows)
    run_seconds = time.perf_counter() - t
    cost = RunCost(kept_steps=opened.kept_steps, overhead_steps=opened.overhead_steps, run_steps=job.steps,
                   held_out_reads=opened.reads, check_reads=check_reads + 1, check_rows=rows,
                   check_seconds=check_seconds,
                   steps_not_run=(job.steps - done.stopped_at) if done.stopped_at else 0)
    result = RunResult(job.steps, job.micro_batch, job.rows_per_step // job.micro_batch, guard.rate,
                       len(task.split.train) + job.joined, 0, curve=done.curve, checks=guard.records, cost=cost,
                       held_out_before=Reading.of(end["before"]), held_out_after=end["after"],
                       outcome=end["outcome"], kept_step=guard.kept_step)
    result.seconds.update(steps_seconds=run_seconds - check_seconds - end["seconds"],
                          check_seconds=check_seconds, verdict_seconds=end["seconds"])
    return result


def _end(job: _Job, opened: _Opened, watch: Watch, read_all: Callable[[], list[float]], rows: int) -> dict[str, Any]:
    """The end decided (kept, or the best check put back), the kept model read on every held-out
    row no step trained on (``read_all``), its answers checked for a collapse, and the start put
    back where it is no better."""
    task, params, opt = job.task, job.params, opened.opt
    t = time.perf_counter()
    start = opened.start_losses[:rows] if job.joined else opened.start_losses
    losses = watch.end(job.steps, read_all)
    if hasattr(opt, "eval"):
        opt.eval()  # the averaged weights: the model
    task.model.eval()
    improved = outcome(start, losses) == "improved"
    result = outcome(start, losses, improved and _collapsed(opened, task, rows if job.joined else None))
    if result == "no_better_than_start":
        watch.kept[0].load(params, opt)  # the start's weights are the result
        losses = list(start)
    return {"before": start, "after": Reading.of(losses), "outcome": result, "seconds": time.perf_counter() - t}


def _collapsed(opened: _Opened, task: Any, rows: int | None = None) -> bool:
    """The kept model's answers on the held-out rows (the first ``rows`` where the rest trained), where
    the data has a small set of answers: one answer over 60% where the gold's majority is under 40%
    (the race's rule)."""
    from leadline.rate.opening import ANSWER_ROWS, answer_set, answers_chosen

    o = opened.opening
    answers = o.answers if o is not None else answer_set(task.rows, task.split.train)
    if not answers:
        return False
    asked = list(task.split.held_out)[:min(ANSWER_ROWS, rows or ANSWER_ROWS)]
    gold = [answers.index(a) if a in answers else -1 for a in
            (tuple(task.rows[i].input_ids[_first(task.rows[i]):]) for i in asked)]
    return collapsed(answers_chosen(task.model, task.rows, asked, answers, task.device, task.pad_id), gold)


def _first(row: Any) -> int:
    from leadline.run.opening import first_scored

    return first_scored(row)


def _opening_phases(job: _Job, opened: _Opened) -> list[PhaseTime]:
    """The fit's and the rate's rows of the phase table (the rate: the start's read and the race)."""
    rates = opening_rates(job.trained_as)
    return [PhaseTime("memory", job.fit_seconds, 0, ("micro_batch",)),
            PhaseTime("rate", opened.seconds, opened.kept_steps + opened.overhead_steps,
                      ("lr",) if opened.lr != rates[0] else (), step_seconds=opened.step_seconds,
                      reads=opened.reads, read_seconds=opened.read_seconds)]


def _phases(plan: Plan, job: _Job, opened: _Opened, result: RunResult) -> None:
    from leadline.rate.guard import READ_SHARE

    s = result.seconds
    a = result.answers  # a classifier's answers, read before and after: part of the verdict
    a_reads, a_seconds = (a.reads, a.seconds) if a is not None else (0, 0.0)
    plan.phases = [*_opening_phases(job, opened),
                   PhaseTime("run", s["steps_seconds"], result.steps_run - opened.kept_steps,
                             step_seconds=s["steps_seconds"]),
                   PhaseTime("guard", s["check_seconds"] + s["verdict_seconds"] + a_seconds, 0, ("guard",),
                             reads=result.cost.check_reads + a_reads,
                             read_seconds=s["check_seconds"] + s["verdict_seconds"] + a_seconds)]
    share = s["check_seconds"] / s["steps_seconds"] if s["steps_seconds"] > 0 else 0.0
    plan.set("guard", Value(result.rollbacks, "measured", _guard_sentence(result, share, READ_SHARE),
                            evidence={"plot": "checks", "checks": result.checks, "kept_step": result.kept_step,
                                      "held_out_before": _d(result.held_out_before),
                                      "held_out_after": _d(result.held_out_after), "outcome": result.outcome,
                                      "rows": result.cost.check_rows, "check_share_of_steps": share},
                            seconds=s["check_seconds"] + s["verdict_seconds"], unit="rollbacks"))
    plan.derive_seconds = job.fit_seconds + opened.seconds
    plan.notes.append(f"the decision's overhead: {opened.overhead_steps} optimizer steps not kept "
                      f"({result.cost.overhead_share:.0%} of the run's {job.steps}) and {opened.reads} held-out reads")


def _d(r: Reading | None) -> dict[str, Any] | None:
    return None if r is None else {"mean": r.mean, "se": r.se, "rows": r.rows}


def _guard_sentence(result: RunResult, share: float, budget: float) -> str:
    checks = sum(1 for c in result.checks if c["action"] not in ("start",))
    rb = result.rollbacks
    return (f"{checks} checks on {result.cost.check_rows} held-out rows ({share:.1%} of the steps' time, the budget "
            f"{budget:.0%}); {rb} rollback{'s' if rb != 1 else ''}; the model kept is step {result.kept_step}'s")


def _save(plan: Plan, result: RunResult | None, model: Any, out_dir: Any) -> None:
    """``plan.json``, and with a result the adapter (none where the run ended no better than its
    start) and ``run.json``, each written whole."""
    if out_dir is None:
        return
    import json

    from leadline._io import save_run, write_atomic
    from leadline.run.card import write_card

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if result is not None:
        if result.outcome == "no_better_than_start":
            write_atomic(out / "run.json", json.dumps(result.as_dict(), indent=1, default=str))
        else:
            save_run(model, out, result.as_dict())
            write_card(out, plan, result.as_dict(), model)  # README.md: the base, the data, the values, the readings
    plan.to_json(out / "plan.json")


def _micro_batch(task: Any, rows_per_step: int) -> tuple[int, list[dict[str, Any]]]:
    """The most rows of a step (a divisor of it) whose forward and backward at the corpus's longest
    rows runs: each out-of-memory error halves it. Off a CUDA card the whole step runs at once."""
    import torch

    tried: list[dict[str, Any]] = []
    mb = rows_per_step
    on_card = str(task.device).startswith("cuda")
    while on_card:
        try:
            task.loss_of(mb, task.seq_len).backward()
            tried.append({"rows": mb, "verdict": "runs"})
            break
        except torch.OutOfMemoryError:
            tried.append({"rows": mb, "verdict": "out of memory"})
            if mb == 1:
                raise InputError(f"one row of {task.seq_len} tokens does not fit this card; pass a smaller "
                                 "--seq-len, --gradient-checkpointing or --load-in-4bit") from None
            mb = max(d for d in range(1, mb) if rows_per_step % d == 0 and d <= mb // 2)
        finally:
            task.model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
    return mb, tried


def _values(plan: Plan, job: _Job, opened: _Opened, decide_share: float, rows_given: bool) -> None:
    mb, tried, rows_per_step, steps = job.micro_batch, job.tried, job.rows_per_step, job.steps
    warmup, lr, fit_seconds, profile = job.warmup, opened.value, job.fit_seconds, job.profile
    h = opened.opening.h if opened.opening is not None else 0
    said = (f"the most of the step's {rows_per_step} rows whose forward and backward at the longest rows ran"
            if tried else "the whole step: off a CUDA card nothing refuses a batch")
    if job.halved:  # the card ran short mid-run: the micro-batch the run ended at, and when it fell
        fell = ", ".join(f"{h['from']} to {h['to']} at step {h['step']}" for h in job.halved)
        said += f"; halved during the run, where the card ran out of memory ({fell})"
        plan.notes.append(f"the card ran out of memory during the run (memory taken after the fit): the micro-batch "
                          f"fell {fell}, the same rows a step accumulated; nothing was lost")
    plan.set("micro_batch", Value(mb, "measured" if tried or job.halved else "derived", said,
                                  evidence={"fit": tried, "halved": job.halved} if job.halved else (tried or None),
                                  seconds=fit_seconds, unit="rows"))
    plan.set("grad_accum", Value(rows_per_step // mb, "derived", "the step's rows over the micro-batch"))
    plan.set("rows_per_step", Value(rows_per_step, "given", "the caller's rows a step", unit="rows") if rows_given
             else Value(rows_per_step, "constant", "the default recipe's 16 rows a step: a run this long cannot pay "
                        "for the noise probe that would measure it", unit="rows"))
    plan.set("lr", lr)
    plan.set("optimizer", Value("schedule_free_adamw", "constant", "schedule-free AdamW: its averaged weights are "
                                "the model at every step, so the run needs no ending and no rerun"))
    plan.set("warmup_steps", Value(warmup, "constant", f"{WARMUP_SHARE:.0%} of the run (schedule-free's warmup at "
                                   "the settings that won AlgoPerf's self-tuning track)", unit="steps"))
    plan.set("weight_decay", Value(0.0, "constant", "0: a fine-tune starts from weights worth keeping"))
    plan.set("total_steps", Value(steps, "derived", f"the run's length: its passes over the training rows at "
                                  f"{rows_per_step} rows a step", unit="steps"))
    plan.set("opening_steps", Value(h, "derived", "each candidate's steps in the opening race: the loser's steps, "
                                    "where the lower rate runs, fit the decision's share of the run", unit="steps"))
    corpus = profile.as_values()  # as derive's corpus profile states them: what the loss scores, and the length
    plan.set("seq_len", replace(corpus["seq_len"], unit="tokens"))
    plan.set("scored_tokens", corpus["scored_tokens"])
