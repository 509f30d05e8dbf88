"""The guard of ``leadline run`` inside Hugging Face ``Trainer``, over schedule-free AdamW.

:class:`TrainerGuard` carries out :mod:`leadline.rate.guard`'s rules at the events
:class:`~leadline.hf.callback.LeadlineCallback` hands it, through the same :class:`~leadline.rate.watch.Watch`
that ``leadline run``'s loop uses (one implementation of check-and-rollback):

- **the start** (``begin``, at ``on_train_begin``): every held-out row read at Trainer's starting
  weights, the start's copy taken (its weights and the fresh optimizer), and the checks planned
  from the run's steps and rows a step (:func:`~leadline.rate.guard.check_plan`,
  :func:`~leadline.rate.guard.check_steps`): the same checks at the same spacing as ``leadline run``;
- **a check** (``after_step``, at ``on_step_end`` of a check step): the first ``rows`` held-out
  rows read at the averaged weights (``optimizer.eval()``), the training weights put back bit for
  bit (:func:`~leadline.rate.watch.read_averaged`), then what the guard says: a new best's copy
  kept; a rollback (the best check's weights and optimizer state, schedule-free's step count and
  weight sum among them, put back, and the rate lowered in the optimizer *and* in Trainer's
  ``lr_scheduler``, so the rate Trainer logs is the rate used); a stop
  (``control.should_training_stop``, the best check put back and the end decided at once);
- **the watch** (``watch``, at ``on_log``): Trainer hands callbacks no per-step loss, only the
  loss it logs every ``logging_steps`` (the mean over those steps). A logged loss far above the
  recent ones (:func:`~leadline.rate.guard.spiked`) calls a check at the next step's end; a
  non-finite one is a rollback there without a read. At ``logging_steps=1`` this is ``leadline
  run``'s per-step watch one step later; at larger spacings it watches the window means; Trainer's
  ``logging_nan_inf_filter`` (on by default) logs no non-finite loss, and a run that diverges is
  then caught by the next check's read alone;
- **the end** (``end``, at the last step's ``on_step_end``, before Trainer's save, or at
  ``on_train_end`` where the run ended early): the end kept unless significantly worse than the
  best check (then put back), the kept model read on every held-out row against the start's
  reading (:func:`~leadline.rate.guard.outcome`); a model no better than its start is replaced by
  the start's weights.

The copies (the kept checks, the start and a spare for the reads) go on the card where it has
room for them, else in host memory (:class:`~leadline.rate.state.Snapshot`'s ``"auto"``); a run
whose copies would take over half the available host memory runs without the guard
(:func:`guard_copies_refused`) and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from leadline.plan import Value
from leadline.rate.guard import MAX_ROLLBACKS, Guard, check_plan, check_steps, outcome
from leadline.rate.watch import StateCopy, Watch

if TYPE_CHECKING:
    import torch
    from transformers import TrainerControl, TrainingArguments

    from leadline.run.task import Task

STATE_FACTOR = 3
"""A copy with its optimizer state, in copies of the trained tensors: the tensors, and schedule-free
AdamW's ``z`` and second moment."""


class TrainerGuard:
    """The guard's state inside one Trainer run (the module docstring).

    Args:
        read_all: per-row losses on every held-out row (the start's and the end's readings).
        subset_of: ``subset_of(rows)`` returns a reader of the first ``rows`` held-out rows (default:
            ``read_all``'s first ``rows`` losses).
        max_rollbacks: rollbacks before a further worsening stops the run (the guard's default).

    Examples:
        A run of 40 steps of 2 rows on 4 held-out rows: three checks, the last at the end;
        ``held_out_rows`` stands in for the model's readings:

        >>> import torch
        >>> from types import SimpleNamespace
        >>> w = torch.nn.Parameter(torch.ones(2))
        >>> opt = torch.optim.SGD([w], lr=0.1)
        >>> readings = iter([[2.0] * 4, [1.0, 1.1, 0.9, 1.0]])
        >>> g = TrainerGuard(lambda: next(readings))
        >>> g.begin(torch.nn.Linear(1, 1), [w], opt, None, total=40, rows_per_step=2)
        >>> g.checks_at, g.rows
        ([14, 27], 4)
        >>> g.after_step(14, SimpleNamespace(should_training_stop=False))
        >>> [(c["step"], c["action"]) for c in g.checks]
        [(0, 'start'), (14, 'best')]
    """

    def __init__(self, read_all: Callable[[], Sequence[float]],
                 subset_of: Callable[[int], Callable[[], Sequence[float]]] | None = None, *,
                 max_rollbacks: int | None = MAX_ROLLBACKS) -> None:
        self.read_all, self.subset_of, self.max_rollbacks = read_all, subset_of, max_rollbacks
        self.guard: Guard | None = None
        self.watcher: Watch | None = None
        self.checks_at: list[int] = []
        self.rows = 0
        self.total = 0
        self.before: list[float] = []
        self.after: list[float] | None = None
        self.outcome: str | None = None
        self.finished = False

    @property
    def checks(self) -> list[dict[str, Any]]:
        """The guard's records: the start, each check, rollback or stop, and the end."""
        return [] if self.guard is None else self.guard.records

    @property
    def kept(self) -> dict[int, StateCopy]:
        """The kept checks' copies (the start's and the latest bests')."""
        return {} if self.watcher is None else self.watcher.kept

    @property
    def stopped_at(self) -> int | None:
        return None if self.watcher is None else self.watcher.stopped_at

    def begin(self, model: torch.nn.Module, params: Sequence[torch.nn.Parameter], opt: torch.optim.Optimizer,
              scheduler: torch.optim.lr_scheduler.LRScheduler, *, total: int,
              rows_per_step: int) -> None:
        """The start read on every held-out row, its copy taken, the checks planned (the module docstring)."""
        self.model, self.params, self.opt, self.scheduler, self.total = model, list(params), opt, scheduler, total
        start_copy = StateCopy.take(self.params, opt)
        was = model.training
        model.eval()
        try:
            self.before = [float(x) for x in self.read_all()]
        finally:
            model.train(was)
        self.rows, n = check_plan(len(self.before), rows_per_step, total)
        planned = check_steps(total, 0, n)
        self.checks_at = [s for s in planned if s < total]  # the end is read on every row instead
        rate = float(opt.param_groups[0]["lr"])
        self.guard = Guard(rate=rate, looks=max(1, len(planned)), max_rollbacks=self.max_rollbacks)
        rows = self.rows
        read = (self.subset_of(rows) if self.subset_of is not None
                else lambda: [float(x) for x in self.read_all()][:rows])
        self.watcher = Watch(self.guard, self.params, opt, read, model=model, checks=self.checks_at,
                             set_rate=self.set_rate)
        self.watcher.start(0, self.before[:rows], copy=start_copy)

    def watch(self, loss: float) -> None:
        """A loss Trainer logged: a spike or a non-finite loss is acted on at the next step's end."""
        if self.watcher is not None and not self.finished:
            self.watcher.see(loss)

    def after_step(self, step: int, control: TrainerControl) -> None:
        """A step's end: a check where one is scheduled or the watch called one, what the guard says carried out;
        a stop ends the run there."""
        if self.watcher is None or self.finished:
            return
        said = self.watcher.after_step(step)
        if said is not None and said.action == "stop":
            control.should_training_stop = True
            self.end(step)

    def set_rate(self, lr: float) -> None:
        """The optimizer's rate set to ``lr`` (each group keeping its ratio to the first), and Trainer's
        scheduler made to keep it: its base rates scaled alike, its last rate (what Trainer logs) the
        rate set."""
        from leadline.rate.state import group_ratios, set_lr

        old = float(self.opt.param_groups[0]["lr"])
        set_lr(self.opt, lr, group_ratios(self.opt))
        inner = getattr(self.scheduler, "scheduler", self.scheduler)  # accelerate's wrapper holds the torch one
        if inner is None:
            return
        if hasattr(inner, "base_lrs") and old > 0:
            inner.base_lrs = [b * lr / old for b in inner.base_lrs]
        if hasattr(inner, "_last_lr"):
            inner._last_lr = [float(g["lr"]) for g in self.opt.param_groups]

    def end(self, step: int) -> None:
        """The run's end decided, the kept model read on every held-out row, the start put back where it
        is no better (the module docstring)."""
        if self.watcher is None or self.finished:
            return
        self.finished = True
        self.after = self.watcher.end(step, self.read_all)
        self.outcome = outcome(self.before, self.after)
        if self.outcome == "no_better_than_start":
            self.kept[0].load(self.params, self.opt)  # the start's weights are the result

    def evidence(self) -> dict[str, Any]:
        """The checks and the verdict, as ``leadline run`` writes them in the plan's ``guard`` value."""
        g = self.guard
        return {"plot": "checks", "checks": self.checks, "kept_step": None if g is None else g.kept_step,
                "held_out_before": _reading(self.before), "held_out_after": _reading(self.after),
                "outcome": self.outcome, "rows": self.rows}

    def value(self) -> Value:
        """The plan's ``guard`` value: the rollbacks, with the checks as evidence."""
        rollbacks = 0 if self.guard is None else self.guard.rollbacks
        checks = sum(1 for c in self.checks if c["action"] != "start")
        kept = None if self.guard is None else self.guard.kept_step
        said = (f"{checks} checks inside Trainer on {self.rows} held-out rows; {rollbacks} rollback"
                f"{'s' if rollbacks != 1 else ''}; the model kept is step {kept}'s")
        if self.outcome == "no_better_than_start":
            said += "; it read no better than the start, whose weights are the result"
        return Value(rollbacks, "measured", said, evidence=self.evidence(), unit="rollbacks")


def subset_reader(task: Task) -> Callable[[int], Callable[[], list[float]]]:
    """``of(rows)``: a reader of the task's first ``rows`` held-out rows, the rows a check reads."""
    from leadline.corpus.losses import row_losses

    def of(rows: int) -> Callable[[], list[float]]:
        subset = [task.rows[i] for i in task.split.held_out[:rows]]
        return lambda: row_losses(task.model, subset, None, task.device, pad_id=task.pad_id)

    return of


def rows_per_step_of(args: TrainingArguments, planned: int | None = None) -> int:
    """The rows one optimizer step of Trainer takes: its micro-batch x accumulation x processes
    (``planned``, the plan's ``rows_per_step``, where the args hold no batch).

    Examples:
        >>> from types import SimpleNamespace
        >>> rows_per_step_of(SimpleNamespace(per_device_train_batch_size=2, gradient_accumulation_steps=4,
        ...                                  world_size=2))
        16
        >>> rows_per_step_of(SimpleNamespace(), 8)
        8
    """
    batch = getattr(args, "per_device_train_batch_size", None)
    if not batch:
        return int(planned or 1)
    accumulation = int(getattr(args, "gradient_accumulation_steps", 1) or 1)
    return int(batch) * accumulation * max(1, int(getattr(args, "world_size", 1) or 1))


def _reading(losses: Sequence[float] | None) -> dict[str, Any] | None:
    from leadline.run.result import Reading

    if not losses:
        return None
    r = Reading.of(losses)
    return {"mean": r.mean, "se": r.se, "rows": r.rows}


def guard_copies_refused(params: Sequence[torch.nn.Parameter]) -> str | None:
    """Why the guard cannot run, or None: at most the start's copy (the tensors alone: its optimizer
    is fresh) and, with their optimizer state (:data:`STATE_FACTOR`), the kept checks after the start
    and the reads' spare; they go on the card where it has room for them twice, else in host memory,
    and a run whose copies would take over half the available host memory trains without the guard
    rather than risk the host's out-of-memory killer.

    Examples:
        >>> import torch
        >>> guard_copies_refused([torch.zeros(4)]) is None
        True
    """
    from leadline.memory_readings import host_memory_bytes

    tensors = sum(p.numel() * p.element_size() for p in params)
    need = tensors * (1 + STATE_FACTOR * Guard(rate=0.0, looks=1).keep)  # the start, keep - 1 bests, the spare
    if params and params[0].device.type == "cuda":
        from leadline.rate.state import card_room_bytes

        if card_room_bytes(params[0].device) >= 2 * need:
            return None
    try:
        available, _ = host_memory_bytes()
    except OSError:
        return None
    if need <= available / 2:
        return None
    return (f"the guard did not run: its copies of the trained tensors and their optimizer state "
            f"({need / 2**30:.1f} GiB) would take over half the host memory available ({available / 2**30:.1f} GiB); "
            "the run keeps its end")
