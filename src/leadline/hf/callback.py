"""The plan inside Hugging Face ``Trainer``: the LookaheadSchedule and the SpillWatch as a
``TrainerCallback``.

    plan = derive_for(trainer)                         # a Trainer or SFTTrainer, built
    cb = LeadlineCallback.for_plan(plan, trainer)      # the held-out rows the plan decided on
    trainer = SFTTrainer(..., args=training_arguments(plan, config), callbacks=[cb])
    with cb:
        trainer.train()

What it does, step by step:
- ``on_train_begin``: refuses args whose loss policy is not the plan's; caps the process at
  its dedicated memory on a CUDA card (``forbid_spill``); builds the schedule over Trainer's
  own optimizer at the plan's rate, and takes over Trainer's ``lr_scheduler``: its ``step()``
  keeps the schedule's rate and its ``get_last_lr()`` — what Trainer logs to TensorBoard/W&B as
  ``learning_rate`` — reads the rate the optimizer uses, rollbacks included.
- ``on_step_begin``: ``schedule.before(step)`` — checks every horizon on the plan's held-out
  rows, rolls back (weights and optimizer state) and halves the rate on a significant
  worsening, sets the rate.
- ``on_step_end`` of the last step: ``schedule.finish()`` races the decayed endings against
  the constant one and keeps the best by a test — before Trainer's final save, so the last
  checkpoint holds the model leadline kept.
- ``on_train_end``: gives Trainer's scheduler back and lifts the cap.

One difference from leadline's own loop: Trainer's sampler chooses the rows of each step, so
``finish()`` reruns the raced endings' steps on the plan's rows (the same distribution, not the same
rows Trainer used); the comparison is unbiased, with more noise.

A race plan (``optimizer`` ``schedule_free_adamw``, derive_for's default) has no schedule and no
ending: Trainer runs ``schedulefree.AdamWScheduleFree`` (``optim="schedule_free_adamw"``), whose
averaged weights are the model. Trainer calls ``optimizer.train()`` before every training step and
``optimizer.eval()`` before an evaluation, but not before a checkpoint's save nor at the end of
training, so its checkpoints and its final model would hold the training weights, not the
averaged ones. The callback adds what is missing (``LeadlineCallback(plan)``, no reader needed):
- ``on_train_begin``: refuses args that do not run the plan (another ``optim``, or a scheduler
  other than ``constant``, which would warm the rate up a second time); caps the card.
- ``on_step_end`` / ``on_epoch_end``: ``optimizer.eval()`` when Trainer is about to save or
  evaluate (``control.should_save`` / ``should_evaluate``) or the run's last step is done, so
  the checkpoint holds the averaged weights (its optimizer state says so: a resumed run's first
  ``train()`` puts the training weights back).
- ``on_step_begin``: ``optimizer.train()`` (Trainer's ``training_step`` does it too).
- ``on_train_end``: ``optimizer.eval()``: the model in memory, and what ``trainer.save_model()``
  writes, are the averaged weights.
- With a held-out reader (``for_plan(plan, trainer)`` builds one), the guard of ``leadline run``
  (:mod:`leadline.rate.guard`, carried out by :mod:`leadline.hf.guarded`): ``on_train_begin`` reads
  the start on every held-out row and plans the same checks at the same spacing as ``leadline run``
  from the run's steps and rows a step; ``on_step_end`` of a check step reads the averaged weights
  on the checks' held-out rows (the training weights put back after, bit for bit) and rolls back
  (the best check's weights and optimizer state, the rate lowered in the optimizer and in Trainer's
  ``lr_scheduler``: the rate Trainer logs is the rate used) or stops the run
  (``control.should_training_stop``) at the best check; ``on_log`` watches the loss Trainer logs
  (a spike calls a check at the next step's end; Trainer logs no per-step loss unless
  ``logging_steps=1``, and otherwise the checks alone watch the run); the last step's
  ``on_step_end`` keeps the end or puts the best check back, and reads the kept model on every
  held-out row against the start (the start's weights put back where it is no better), before
  Trainer's save. ``callback.checks`` holds the guard's records; ``evidence()["guard"]`` and the
  plan's ``guard`` value hold them with the verdict, as ``leadline run`` writes them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from transformers import TrainerCallback

from leadline.errors import InputError
from leadline.hf.args import SCHEDULE_FREE
from leadline.plan import Plan, refuse_quick_plan
from leadline.rate.guard import MAX_ROLLBACKS

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase, Trainer, TrainerControl, TrainerState, TrainingArguments

    from leadline.corpus.rows import RowSource


class LeadlineCallback(TrainerCallback):
    """Runs :class:`~leadline.lookahead.rate.LookaheadSchedule` and the spill cap inside ``Trainer``.

    Args:
        plan: the derived plan (``lr``, ``alpha1``, ``warmup_steps``, the horizon); a race plan
            (schedule-free AdamW) runs no schedule: the callback keeps the optimizer's averaged
            weights in the model at every save and at the end (the module docstring).
        held_out_losses: per-row losses on fixed held-out rows (``Split.reader``); a race plan
            needs none.
        train_step: ``train_step(step)``, forward+backward of one optimizer step on the plan's
            rows (``finish()`` reruns the ending with it); a race plan needs none.
        params: the trained tensors (default: the model's ``requires_grad`` parameters).
        total_steps: the run's length (default: Trainer's ``max_steps``).
        cap: cap the process on a CUDA card (default True).
        ending: ``raced`` (the last half and the last 2h steps rerun with the rate decaying, the best
            ending kept)
            or ``to_zero`` (the rate falls linearly to zero over the run, nothing raced).
        ending_share: the share of the run the raced ending reruns, one length alone (default: the
            last half and the last 2h, both raced).
        held_out_subset: a race plan's guard: ``held_out_subset(rows)`` returns a reader of the first
            ``rows`` held-out rows, what a check reads (``for_plan`` builds it; default: the first
            ``rows`` of ``held_out_losses``' reading).
        max_rollbacks: a race plan's guard: rollbacks before a further worsening stops the run
            (:data:`~leadline.rate.guard.MAX_ROLLBACKS`; None: never stop).

    Examples:
        Inside the run, Trainer's scheduler keeps the schedule's rate and logs it (a torch
        ``Linear`` and ``LambdaLR`` standing in for Trainer's model and scheduler):

        >>> import torch
        >>> from types import SimpleNamespace
        >>> from leadline.plan import Value
        >>> plan = Plan()
        >>> plan.set("lr", Value(1e-3, "measured", "the look-ahead"))
        >>> model = torch.nn.Linear(4, 2)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
        >>> cb = LeadlineCallback(plan, held_out_losses=lambda: [1.0, 1.0], train_step=lambda step: 0.0)
        >>> args, state = SimpleNamespace(max_steps=10), SimpleNamespace(max_steps=10, global_step=0)
        >>> with cb:
        ...     cb.on_train_begin(args, state, None, model=model, optimizer=optimizer, lr_scheduler=scheduler)
        ...     cb.on_step_begin(args, state, None)
        ...     optimizer.step()
        ...     scheduler.step()  # LambdaLR alone would set 0.1 x 0.5
        ...     print(optimizer.param_groups[0]["lr"], scheduler.get_last_lr())
        0.001 [0.001]
        >>> type(scheduler).__name__  # given back on leaving the block
        'LambdaLR'
        >>> cb.evidence()["checks"]
        [{'step': 0, 'loss': 1.0, 'se': 0.0, 'lr': 0.001, 'action': 'best'}]
        >>> try:
        ...     LeadlineCallback(Plan(), lambda: [], lambda step: 0.0)
        ... except InputError as e:
        ...     print(e)
        LeadlineCallback needs a plan with a rate (lr); derive one with leadline.hf.derive_for
    """

    def __init__(self, plan: Plan, held_out_losses: Callable[[], Sequence[float]] | None = None,
                 train_step: Callable[[int], Any] | None = None, *,
                 params: Sequence[Any] | None = None, total_steps: int | None = None, cap: bool = True,
                 ending: Literal["raced", "to_zero"] = "raced",
                 ending_share: float | None = None,
                 held_out_subset: Callable[[int], Callable[[], Sequence[float]]] | None = None,
                 max_rollbacks: int | None = MAX_ROLLBACKS) -> None:
        if "lr" not in plan:
            raise InputError("LeadlineCallback needs a plan with a rate (lr); derive one with leadline.hf.derive_for")
        refuse_quick_plan(plan)
        self.schedule_free = plan.get("optimizer") == SCHEDULE_FREE
        if self.schedule_free and (ending != "raced" or ending_share is not None):
            raise InputError("ending and ending_share shape the LookaheadSchedule, and this plan trains with "
                             "schedule-free AdamW, which has no schedule and no ending; leave them out")
        if not self.schedule_free and (held_out_losses is None or train_step is None):
            raise InputError("LeadlineCallback needs held_out_losses and train_step for this plan's schedule; build it "
                             "with LeadlineCallback.for_plan(plan, trainer)")
        if ending_share is not None:
            from leadline.train import ending_steps_for

            ending_steps_for(ending_share, 1)  # the share checked now, before Trainer starts
            if ending != "raced":
                raise InputError(f"ending_share sets the raced ending's length, and ending={ending!r} races none; "
                                 "leave ending_share out")
        self.plan = plan
        self.held_out_losses = held_out_losses
        self.train_step = train_step
        self.params = list(params) if params is not None else None
        self.total_steps = total_steps
        self.cap = cap
        self.ending_kind = ending
        self.ending_share = ending_share
        self.schedule: Any = None
        self.ending: dict[str, Any] | None = None
        self._cap_handle: Any = None
        self._driven: Any = None
        self._averaging: Any = None  # a race plan's schedule-free optimizer, from on_train_begin
        self.held_out_subset = held_out_subset
        self.max_rollbacks = max_rollbacks
        self._guard: Any = None  # a race plan's TrainerGuard, where there is a held-out reader
        self.guard_refused: str | None = None  # why the guard did not run, where memory refused its copies

    @classmethod
    def for_plan(cls, plan: Plan, model: Trainer | torch.nn.Module, tokenizer: PreTrainedTokenizerBase | None = None,
                 train_dataset: RowSource | None = None, **kw: Any) -> LeadlineCallback:
        """Build the held-out reader and the train step from the data the plan was derived on
        (same seed, same length, so the held-out rows are the plan's): the trainer the plan
        was derived on (``for_plan(plan, trainer)``), or the model, tokenizer and data. Data
        whose split is not the plan's is refused.

        A race plan needs no train step; its reader, where the data are given, serves the pass
        rule of a run of several epochs (``LeadlineCallback(plan)`` alone runs without it).

        Examples:
            >>> import torch
            >>> from leadline.plan import Value
        >>> plan = Plan()
            >>> plan.set("lr", Value(1e-3, "measured", "the look-ahead"))
            >>> try:
            ...     LeadlineCallback.for_plan(plan, torch.nn.Linear(4, 2))
            ... except InputError as e:
            ...     print(e)
            LeadlineCallback.for_plan needs the trainer the plan was derived on, or the model, tokenizer and ...
        """
        from leadline.hf.guarded import subset_reader
        from leadline.hf.trainer import is_trainer, tokenizer_of, trainer_rows
        from leadline.run.task import prepare, split_sizes

        schedule_free = plan.get("optimizer") == SCHEDULE_FREE
        if schedule_free and not is_trainer(model) and train_dataset is None:
            return cls(plan, **kw)
        if is_trainer(model):
            trainer = model
            model, tokenizer, train_dataset = trainer.model, tokenizer or tokenizer_of(trainer), trainer_rows(trainer)
        elif train_dataset is None:
            raise InputError("LeadlineCallback.for_plan needs the trainer the plan was derived on, or the model, "
                             "tokenizer and train_dataset")
        seed = int(plan.held_out.get("seed", 0)) if isinstance(plan.held_out, dict) else 0
        task, _ = prepare(model, tokenizer, train_dataset, seq_len=plan.get("seq_len"), seed=seed,
                          **split_sizes(plan.held_out))
        if plan.held_out.get("held_out") and plan.held_out["held_out"] != task.split.held_out:
            raise InputError("the data's split differs from the plan's held-out rows; pass the train_dataset the plan "
                             "was derived on")
        if schedule_free:
            return cls(plan, task.held_out_losses(), held_out_subset=subset_reader(task), **kw)
        step = task.train_step_of(int(plan.get("micro_batch", 1)), int(plan.get("grad_accum", 1)))
        return cls(plan, task.held_out_losses(), step, **kw)

    @property
    def checks(self) -> list[dict[str, Any]]:
        """The checks of the run: a race plan's guard's records (the start, each check, rollback or
        stop, and the end), or the LookaheadSchedule's; empty before the run or without either."""
        if self._guard is not None:
            return self._guard.checks
        return list(self.schedule.checks) if self.schedule is not None else []

    # ---- Trainer's events ---------------------------------------------------------------
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                       lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None, **kw: object) -> None:
        """Check the args' loss policy, cap the card, build the schedule over Trainer's optimizer
        and take over its ``lr_scheduler`` (the module docstring)."""
        from leadline.hf.trainer import check_policy

        if optimizer is None or lr_scheduler is None:
            raise InputError("LeadlineCallback needs Trainer's optimizer and lr_scheduler at on_train_begin; use "
                             "transformers >= 4.45")
        check_policy(self.plan, args)
        if self.schedule_free:
            self._begin_schedule_free(args, state, model, optimizer, lr_scheduler)
            return
        optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper holds the torch optimizer
        params = self.params or [p for p in model.parameters() if p.requires_grad]
        total = int(self.total_steps or state.max_steps or args.max_steps)
        if total < 1:
            raise InputError("LeadlineCallback needs the run's length: set TrainingArguments.max_steps or pass "
                             "total_steps")
        device = params[0].device
        if self.cap and device.type == "cuda":
            from leadline.memory import forbid_spill

            self._cap_handle = forbid_spill(device)
        from leadline.train import ending_steps_for, lookahead_schedule

        self.schedule = lookahead_schedule(self.plan, params, optimizer, self.train_step, self.held_out_losses,
                                           total_steps=total, ending=self.ending_kind,
                                           ending_steps=ending_steps_for(self.ending_share, total))
        self._driven = _DrivenScheduler(lr_scheduler, optimizer)

    def _begin_schedule_free(self, args: Any, state: Any, model: Any, optimizer: Any, lr_scheduler: Any) -> None:
        """A race plan's run: the args checked against the plan, the card capped, the optimizer kept, the
        guard started where there is a held-out reader."""
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper holds the torch optimizer
        if not (callable(getattr(inner, "train", None)) and callable(getattr(inner, "eval", None))):
            raise InputError(f"this plan trains with schedule-free AdamW and Trainer built {type(inner).__name__}; "
                             "build the args with training_arguments(plan, args) (optim='schedule_free_adamw')")
        scheduler = getattr(args, "lr_scheduler_type", "constant")
        scheduler = str(getattr(scheduler, "value", scheduler))
        if scheduler != "constant":
            raise InputError(f"lr_scheduler_type={scheduler!r} would schedule the rate on top of schedule-free AdamW's "
                             "own warmup; build the args with training_arguments(plan, args) "
                             "(lr_scheduler_type='constant')")
        params = self.params or [p for p in model.parameters() if p.requires_grad]
        if self.cap and params and params[0].device.type == "cuda":
            from leadline.memory import forbid_spill

            self._cap_handle = forbid_spill(params[0].device)
        self._averaging = inner
        if self.held_out_losses is None:
            return
        from leadline.hf.guarded import TrainerGuard, guard_copies_refused, rows_per_step_of

        self.guard_refused = guard_copies_refused(params)
        if self.guard_refused is not None:
            return
        total = int(self.total_steps or getattr(state, "max_steps", 0) or args.max_steps)
        if total < 1:
            raise InputError("LeadlineCallback needs the run's length for the guard's checks: set "
                             "TrainingArguments.max_steps or pass total_steps")
        self._guard = TrainerGuard(self.held_out_losses, self.held_out_subset, max_rollbacks=self.max_rollbacks)
        self._guard.begin(model, params, inner, lr_scheduler, total=total,
                          rows_per_step=rows_per_step_of(args, self.plan.get("rows_per_step")))

    def _guard_end(self, step: int) -> None:
        """The guard's end decided (the best put back where the end reads significantly worse), and its
        checks written into the plan as ``leadline run`` writes them."""
        if self._guard is None or self._guard.guard is None:
            return
        if not self._guard.finished:
            self._guard.end(step)
        self.plan.set("guard", self._guard.value())

    def _average_if_read(self, state: Any, control: Any) -> None:
        """The averaged weights into the model when Trainer is about to save or evaluate, or the run is done."""
        done = bool(state.max_steps) and int(state.global_step) >= int(state.max_steps)
        if self._averaging is not None and (getattr(control, "should_save", False)
                                            or getattr(control, "should_evaluate", False) or done):
            self._averaging.eval()

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kw: object) -> None:
        """``schedule.before(step)``: the check, a rollback where one is due, the step's rate. A race
        plan: ``optimizer.train()``, the training weights back after a save or an evaluation."""
        if self._averaging is not None:
            self._averaging.train()
        if self.schedule is not None and not self.schedule.finished:
            self.schedule.before(int(state.global_step))

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: object) -> None:
        """At the last step, ``schedule.finish()``: the raced ending kept. A race plan: the guard's check,
        rollback or stop, and at the last step (or the stop) its end; then the averaged weights into the
        model before a save or an evaluation (Trainer's, which follow this event)."""
        if self._guard is not None:
            step = int(state.global_step)
            self._guard.after_step(step, control)  # a check, a rollback or a stop; a stop decides the end
            if self._guard.finished or step >= self._guard.total:
                self._guard_end(step)  # before Trainer's save of this step
        self._average_if_read(state, control)
        # the ending is decided here, before Trainer's save of the last step reads the weights
        if (self.schedule is not None and not self.schedule.finished
                and int(state.global_step) >= self.schedule.total_steps):
            self.ending = self.schedule.finish()

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: object) -> None:
        """A race plan: the averaged weights into the model before an epoch's save or evaluation."""
        self._average_if_read(state, control)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kw: object) -> None:
        """A race plan with the guard: the loss Trainer logged, watched for a spike (the module docstring)."""
        if self._guard is not None and logs and isinstance(logs.get("loss"), (int, float)):
            self._guard.watch(float(logs["loss"]))

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: object) -> None:
        """Finish a run that stopped early, then :meth:`close`; a race plan's model left holding
        the averaged weights."""
        if self._guard is not None:  # a run Trainer ended before its last step: its end decided now
            self._guard_end(int(state.global_step))
        if self._averaging is not None:
            self._averaging.eval()
        try:
            if self.schedule is not None and not self.schedule.finished:  # the run stopped early
                self.ending = self.schedule.finish()
        finally:
            self.close()

    def close(self) -> None:
        """Give Trainer's scheduler back and lift the cap this callback set. ``on_train_end``
        does it, but Trainer does not call that when training raises: run
        ``with cb: trainer.train()`` to do it on every exit."""
        if self._driven is not None:
            self._driven.release()
            self._driven = None
        if self._cap_handle is not None:
            self._cap_handle.lift()
            self._cap_handle = None

    def __enter__(self) -> LeadlineCallback:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def evidence(self) -> dict[str, Any] | None:
        """The schedule's checks and rollbacks and the ending it kept;
        None before ``on_train_begin`` (see the class's examples).

        Examples:
            >>> from leadline.plan import Value
        >>> plan = Plan()
            >>> plan.set("lr", Value(1e-3, "measured", "the look-ahead"))
            >>> LeadlineCallback(plan, lambda: [1.0], lambda step: 0.0).evidence() is None
            True
        """
        if self._guard is not None:
            return {"guard": self._guard.evidence()}
        if self.schedule is None:
            return None
        return {**self.schedule.evidence(), "ending": self.ending}


class _DrivenScheduler:
    """Trainer's ``lr_scheduler`` driven by the schedule until :meth:`release`: its ``step()``
    leaves the optimizer's rate as the schedule set it, and ``get_last_lr()`` (what Trainer
    logs) returns that rate. The scheduler object stays Trainer's (its ``state_dict`` and
    checkpoints unchanged); its class is a subclass with those two methods until release."""

    def __init__(self, lr_scheduler: Any, optimizer: Any) -> None:
        self.inner = getattr(lr_scheduler, "scheduler", lr_scheduler)  # accelerate's wrapper holds the torch scheduler
        self.cls = type(self.inner)
        if not hasattr(self.inner, "get_last_lr") or not hasattr(self.inner, "optimizer"):
            raise InputError(f"Trainer's lr_scheduler ({self.cls.__name__}) is not a torch LRScheduler; "
                             "use one of Trainer's lr_scheduler_type values")
        self.inner.__class__ = _driven_class(self.cls)

    def release(self) -> None:
        self.inner.__class__ = self.cls


def _rates(self: Any) -> list[float]:
    return [float(g["lr"]) for g in self.optimizer.param_groups]


def _driven_class(cls: type) -> type:
    return type(f"LeadlineDriven{cls.__name__}", (cls,),
                {"get_lr": _rates, "get_last_lr": _rates, "__module__": __name__})
