"""One run that pays for its own measurement: ``leadline run``'s default.

One process and one load: the rows are tokenized and split as every leadline command splits them,
the micro-batch is the most of the step's rows that runs (an out-of-memory error halves it: a
measurement), the rate is decided on the run's own opening steps (:mod:`leadline.rate.opening`),
and the run continues from the winner's weights and optimizer state, counting its steps. The
optimizer is schedule-free AdamW, whose averaged weights are the model: nothing is rerun at the
end. The plan's ``phases`` say where the seconds went: the steps kept, the steps not kept (the
decision's overhead) and the held-out reads.

    plan, result = run_in_one(model, tokenizer, "train.jsonl", out_dir="run")
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leadline.errors import InputError
from leadline.plan import PhaseTime, Plan, Value
from leadline.rate.compare import compare
from leadline.rate.opening import (
    ALPHA,
    ANSWER_ROWS,
    DECIDE_SHARE,
    Reading,
    answer_set,
    answers_chosen,
    climb,
    collapsed,
    horizon,
    opening_rates,
)
from leadline.rate.passes import PassRule, pass_ends

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


def _optimizer(params: list[Any], lr: float, warmup: int) -> Any:
    try:
        import schedulefree
    except ImportError:
        raise InputError("leadline run trains with schedule-free AdamW; pip install 'leadline[hf]' (it brings "
                         "schedulefree), or pass --effort quick or full") from None
    return schedulefree.AdamWScheduleFree(params, lr=lr, warmup_steps=warmup, weight_decay=0.0)


class _Opening:
    """The candidates' runs from one start: each restores the start, runs ``h`` steps with its
    own optimizer, reads the held-out rows at its averaged weights, and keeps what the winner
    needs to go on (its weights in train mode, its optimizer, the RNG state)."""

    def __init__(self, task: Any, params: list[Any], step: Callable[[int], float], h: int, warmup: int) -> None:
        import torch

        from leadline.rate.state import capture_rng

        self.task, self.params, self.step, self.h, self.warmup = task, params, step, h, warmup
        self.start = [p.detach().clone() for p in params]
        self.rng = capture_rng()
        self.kept: dict[float, tuple[list[Any], Any, dict[str, Any]]] = {}
        self.read = task.held_out_losses()
        self.answers = answer_set(task.rows, task.split.train)
        self.asked = list(task.split.held_out)[:ANSWER_ROWS]  # the rows a challenger's answers are chosen on
        self.gold = ([self.answers.index(a) if a in self.answers else -1 for a in
                      (tuple(task.rows[i].input_ids[_first(task.rows[i]):]) for i in self.asked)]
                     if self.answers else None)
        self.incumbent: float | None = None  # the first rate run: the default, whose answers are not checked
        self.incumbent_losses: list[float] = []
        self.reads = self.steps = 0
        self.read_seconds = self.step_seconds = 0.0
        self.torch = torch

    def __call__(self, lr: float) -> Reading:
        from leadline.rate.state import capture_rng, restore_rng

        with self.torch.no_grad():
            for p, s in zip(self.params, self.start):
                p.copy_(s)
        restore_rng(self.rng)
        opt = _optimizer(self.params, lr, self.warmup)
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
        from leadline.rate.state import restore_rng

        with self.torch.no_grad():
            for p, s in zip(self.params, self.start):
                p.copy_(s)
        restore_rng(self.rng)
        self.kept.clear()
        self.start = []

    def resume(self, lr: float) -> Any:
        """The winner's weights, RNG and optimizer put back; the others' copies freed."""
        from leadline.rate.state import restore_rng

        weights, opt, rng = self.kept[lr]
        with self.torch.no_grad():
            for p, w in zip(self.params, weights):
                p.copy_(w)
        restore_rng(rng)
        self.kept.clear()
        self.start = []
        return opt


def _first(row: Any) -> int:
    return next((p for p, lab in enumerate(row.labels) if lab != -100), len(row.labels))


def _take_steps(opt: Any, step: Callable[[int], float], steps: range,
                on_step: Callable[[dict[str, Any]], None] | None = None, t0: float | None = None) -> bool:
    """The optimizer steps ``steps``; False at the first non-finite loss (the step not taken)."""
    for s in steps:
        opt.zero_grad(set_to_none=True)
        loss = step(s)
        if not math.isfinite(loss):
            opt.zero_grad(set_to_none=True)
            return False
        opt.step()
        if on_step is not None:
            on_step({"step": s, "loss": loss, "lr": float(opt.param_groups[0]["lr"]),
                     "seconds": time.monotonic() - (t0 or 0.0)})
    return True


def pass_copies_refused(params: list[Any]) -> str | None:
    """Why the pass rule cannot run, or None: it keeps two copies of the trained tensors in host
    memory (the best pass's, and the training weights across a read), and a run whose copies
    would take over half the available host memory keeps its last pass instead of risking the
    host's out-of-memory killer.

    Examples:
        >>> import torch
        >>> pass_copies_refused([torch.zeros(4)]) is None
        True
    """
    from leadline.memory.readings import host_memory_bytes

    need = 2 * sum(p.numel() * p.element_size() for p in params)
    try:
        available, _ = host_memory_bytes()
    except OSError:
        return None
    if need <= available / 2:
        return None
    return (f"the pass rule did not run: its two copies of the trained tensors ({need / 2**30:.1f} GiB) would take "
            f"over half the host memory available ({available / 2**30:.1f} GiB); the run keeps its last pass")


@dataclass
class _Passes:
    """What the run's loop did: the steps it took, the pass rule's reads (None: one pass, no rule)."""

    rule: PassRule | None = None
    refused: str | None = None  # why the rule did not run on a run of several passes
    steps: int = 0
    reads: int = 0
    read_seconds: float = 0.0
    copy_seconds: float = 0.0


def _run_passes(task: Any, params: list[Any], opt: Any, step: Callable[[int], float], todo: range,
                rows_per_step: int, record: Callable[[dict[str, Any]], Any], t0: float, lr: float) -> _Passes:
    """The run's steps ``todo``, read at each pass's end by :class:`leadline.rate.passes.PassRule`
    where the run passes over its rows more than once: the run may stop early, and ends at the
    averaged weights of the pass the held-out rows favour (the optimizer left in eval mode)."""
    import torch

    ends = [*pass_ends(len(task.order), rows_per_step, todo.stop, todo.start), todo.stop]
    refused = pass_copies_refused(params) if len(ends) > 1 else None
    if refused is not None:
        ends = [todo.stop]
    done = _Passes(rule=PassRule() if len(ends) > 1 else None, refused=refused)
    read, best, pos = task.held_out_losses(), None, todo.start
    for end in ends:
        if not _take_steps(opt, step, range(pos, end), record, t0):
            raise InputError(f"the training loss stopped being finite near step {pos} at the rate {lr:.3g}; pass a "
                             "shorter --seq-len or check the data for empty or broken rows")
        done.steps += end - pos
        pos = end
        if done.rule is None:
            break
        t = time.perf_counter()
        going = [p.detach().to("cpu", copy=True) for p in params] if end < todo.stop else []
        done.copy_seconds += time.perf_counter() - t
        opt.eval()  # the averaged weights: the pass's model
        task.model.eval()
        t = time.perf_counter()
        try:
            losses = read()
        except BaseException:  # a read that fails leaves the model training, at its training weights
            _put_back(opt, params, going, task.model)
            raise
        done.read_seconds += time.perf_counter() - t
        done.reads += 1
        verdict = done.rule.after_pass(end, losses) if end < todo.stop else done.rule.at_end(end, losses)
        if verdict == "best" and end < todo.stop:
            t = time.perf_counter()
            best = [p.detach().to("cpu", copy=True) for p in params]  # off the card: a full fine-tune's copy
            done.copy_seconds += time.perf_counter() - t
        if verdict == "stop" or (end == todo.stop and verdict == "best"):
            with torch.no_grad():
                for p, w in zip(params, best or []):
                    p.copy_(w)
            break
        if end == todo.stop:
            break  # the run's end kept, at its averaged weights
        _put_back(opt, params, going, task.model)
    return done


def _put_back(opt: Any, params: list[Any], going: list[Any], model: Any) -> None:
    """Back to training after a read: train mode, and the training weights copied back bit for bit
    (schedule-free's ``eval()`` and ``train()`` are not exact inverses in floating point)."""
    import torch

    opt.train()
    with torch.no_grad():
        for p, w in zip(params, going):
            p.copy_(w)
    model.train()


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


def run_in_one(model: Any, tokenizer: Any, data: Any, *, total_steps: int | None = None, epochs: float | None = None,
               rows_per_step: int | None = None, decide_share: float = DECIDE_SHARE, seed: int = 0,
               seq_len: int | None = None, out_dir: str | os.PathLike[str] | None = None,
               on_step: Callable[[dict[str, Any]], None] | None = None,
               fields: dict[str, str] | None = None, train: bool = True,
               rate: Value | None = None) -> tuple[Plan, dict[str, Any]]:
    """Decide the rate on the run's opening steps and train to the end, in one process.

    Returns the plan (every number with its source; ``plan.phases`` the cost table) and the run's
    record (the curve, the test verdict). With ``out_dir`` the adapter (or the weights),
    ``plan.json`` and ``run.json`` are written there.

    ``rows_per_step``: the rows an optimizer step takes, given (None: :data:`ROWS_PER_STEP`, the
    recipe's, listed as a constant).

    ``rate``: a rate already decided (a plan's, :func:`leadline.train.train_with_plan`): no race,
    the run trains at it from the start.

    ``train=False``: the race alone, for a run another loop trains (Trainer, through
    :func:`leadline.hf.training_arguments`). The trained tensors and the RNG states are put back
    bit for bit as they were before the race, the tensors' ``.grad`` cleared and the model's
    train/eval mode restored; none of the run's steps is taken, so every race step is overhead
    (``kept_steps`` 0). The plan holds the race's evidence; with ``out_dir`` only ``plan.json``
    is written.
    """
    from leadline.hf.task import prepare, trained_as_of, trained_named_weights
    from leadline.provenance import describe_data
    from leadline.rate.state import capture_rng, restore_rng
    from leadline.stats import mean_se

    t_all = time.perf_counter()
    rows_given = rows_per_step is not None
    rows_per_step = int(rows_per_step) if rows_per_step is not None else ROWS_PER_STEP
    rng_before, was_training = capture_rng(), model.training
    task, profile = prepare(model, tokenizer, data, seq_len=seq_len, seed=seed, fields=fields)
    params = [p for _, p in trained_named_weights(model)]
    steps = run_steps_of(len(task.order), rows_per_step, total_steps, epochs)
    trained_as = trained_as_of(model)
    h = 0 if rate is not None else min(horizon(steps, decide_share), steps)
    warmup = max(1, round(WARMUP_SHARE * steps))
    plan = Plan(data={**describe_data(data), **({"fields": fields} if fields else {})}, held_out=task.split.as_dict())
    plan.model = {"trained_as": trained_as, "trained_parameters": int(sum(p.numel() for p in params))}
    from leadline.hf.precision import precision_of

    plan.set("precision", precision_of(model).as_value())  # the dtype, quantization and checkpointing it trains in
    t = time.perf_counter()
    mb, tried = _micro_batch(task, rows_per_step)
    fit_seconds = time.perf_counter() - t
    step = task.train_step_of(mb, rows_per_step // mb)
    rates = opening_rates(trained_as)
    t0 = time.monotonic()
    t = time.perf_counter()
    if h:
        opening = _Opening(task, params, step, h, warmup)
        try:
            t_read = time.perf_counter()
            start_losses = opening.read()  # the start's held-out reading: did the default learn?
            opening.read_seconds += time.perf_counter() - t_read
            opening.reads += 1
            decision, readings = climb(opening, rates, start=start_losses)
        except BaseException:  # a race cut short leaves the model as it found it: the start, its RNG and mode
            opening.rewind()
            model.zero_grad(set_to_none=True)
            model.train(was_training)
            restore_rng(rng_before)
            raise
        if train:
            opt = opening.resume(decision.lr)
        else:
            opening.rewind()
        race = {"horizon_steps": h, "rates": list(rates), "tests": decision.tests, "decide_share": decide_share,
                "readings": {f"{lr:.3g}": {"mean": r.mean, "collapsed": r.collapsed} for lr, r in readings.items()},
                "collapse_checked": opening.answers is not None}
        kept = h if train else 0
        overhead = opening.steps - kept
        reads, read_seconds, step_seconds = opening.reads, opening.read_seconds, opening.step_seconds
        lr, start = decision.lr, h
        fate = (f"its {h} steps are the run's first" if train else
                "its steps were not kept: the run trains from the weights the race started from")
        lr_value = Value(lr, "measured", f"won the opening race on {len(task.split.held_out)} held-out rows after "
                         f"{h} steps: {decision.sentence()}; {fate}", evidence=race, unit="per step")
    else:
        lr = float(rate.value) if rate is not None else rates[0]
        start, kept, overhead, reads, read_seconds, step_seconds = 0, 0, 0, 0, 0.0, 0.0
        if train:
            opt = _optimizer(params, lr, warmup)
            opt.train()
        lr_value = rate or Value(lr, "constant", f"schedule-free AdamW's default for {trained_as}: a run of {steps} "
                                 f"steps is too short to race rates within {decide_share:.0%} of its steps",
                                 unit="per step")
    race_seconds = time.perf_counter() - t
    curve: list[dict[str, Any]] = []
    run_seconds, after, passes = 0.0, None, _Passes()
    if train:
        model.train()
        t = time.perf_counter()
        passes = _run_passes(task, params, opt, step, range(start, steps), rows_per_step,
                             lambda r: (curve.append(r), on_step and on_step(r)), t0, lr)
        run_seconds = time.perf_counter() - t
        opt.eval()  # the averaged weights: the model (a no-op where the pass rule already read them)
        model.eval()
        after = (task.split.reader(model, task.rows, "test", device=task.device, pad_id=task.pad_id)()
                 if task.split.test else None)
    else:  # the race alone: the model and the RNG as they were before it
        model.zero_grad(set_to_none=True)
        model.train(was_training)
        restore_rng(rng_before)
    _values(plan, mb, tried, rows_per_step, rows_given, steps, warmup, lr_value, h, fit_seconds, profile)
    plan.phases = [PhaseTime("memory", fit_seconds, 0, ("micro_batch",)),
                   PhaseTime("rate", race_seconds, kept + overhead, ("lr",) if lr != rates[0] else (),
                             step_seconds=step_seconds, reads=reads, read_seconds=read_seconds)]
    if train:
        plan.phases.append(PhaseTime("run", run_seconds, passes.steps, reads=passes.reads,
                                     step_seconds=run_seconds - passes.read_seconds - passes.copy_seconds,
                                     read_seconds=passes.read_seconds))
        if passes.refused is not None:
            plan.notes.append(passes.refused)
        if passes.rule is not None:
            plan.set("kept_step", Value(passes.rule.kept_step, "measured", passes.rule.sentence(steps),
                                        evidence={**passes.rule.as_dict(), "plot": "passes"}, unit="steps",
                                        seconds=passes.read_seconds + passes.copy_seconds))
    plan.derive_seconds = fit_seconds + race_seconds
    cost = {"kept_steps": kept, "overhead_steps": overhead, "run_steps": steps, "held_out_reads": reads,
            "pass_reads": passes.reads, "steps_not_run": (steps - start - passes.steps) if train else 0,
            "overhead_share": overhead / steps, "budget_share": decide_share,
            "budget_held": overhead <= decide_share * steps + 1e-9}
    plan.notes.append(f"the decision's overhead: {overhead} optimizer steps not kept ({overhead / steps:.0%} of the "
                      f"run's {steps}; the budget {decide_share:.0%}) and {reads} held-out reads")
    result: dict[str, Any] = {"steps": steps, "micro_batch": mb, "grad_accum": rows_per_step // mb, "lr": lr,
                              "optimizer": "schedule_free_adamw", "curve": curve, "cost": cost,
                              "seconds": time.perf_counter() - t_all, "test_rows": len(task.split.test),
                              **({"passes": passes.rule.as_dict()} if passes.rule is not None else {}),
                              **({} if train else {"trained": False})}
    if after is not None:
        m, se = mean_se(after)
        result["test_loss_after"] = {"mean": m, "se": se}
    if out_dir is not None:
        from leadline._io import save_run

        out = Path(out_dir)
        if train:
            save_run(model, out, result)
        else:
            out.mkdir(parents=True, exist_ok=True)
        plan.to_json(out / "plan.json")
    return plan, result


def _values(plan: Plan, mb: int, tried: list[dict[str, Any]], rows_per_step: int, rows_given: bool, steps: int,
            warmup: int, lr: Value, h: int, fit_seconds: float, profile: Any) -> None:
    plan.set("micro_batch", Value(mb, "measured" if tried else "derived",
                                  (f"the most of the step's {rows_per_step} rows whose forward and backward at the "
                                   f"longest rows ran" if tried else "the whole step: off a CUDA card nothing "
                                   "refuses a batch"), evidence=tried or None, seconds=fit_seconds, unit="rows"))
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
    plan.set("opening_steps", Value(h, "derived", "each candidate's steps in the opening race: the two losers' "
                                    "steps fit the decision's share of the run", unit="steps"))
    plan.set("seq_len", Value(int(profile.seq_len), "measured", "the corpus's longest row", unit="tokens"))
