"""The plan inside Hugging Face ``Trainer``: the LookaheadSchedule and the SpillWatch as a
``TrainerCallback``.

    plan = derive_for(model, tok, "train.jsonl", total_steps=300)
    args = plan.training_arguments(TrainingArguments(output_dir="out"))
    cb = LeadlineCallback.for_plan(plan, model, tok, "train.jsonl")
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb]).train()

What it does, step by step:
- ``on_train_begin``: caps the process at its dedicated memory on a CUDA card
  (``forbid_spill``: the watch moves the cap before every outermost forward and after every
  optimizer step) and builds the schedule over Trainer's own optimizer.
- ``on_step_begin``: ``schedule.before(step)`` — checks every horizon on the plan's held-out
  rows, rolls back and halves the rate on a significant worsening, sets the rate (it wins
  over Trainer's scheduler: set ``lr_scheduler_type="constant_with_warmup"``, which
  ``plan.training_arguments`` does).
- ``on_train_end``: ``schedule.finish()`` races the decayed ending against the constant one
  and keeps the better by a test, then lifts the cap.

One difference from leadline's own loop: Trainer's sampler chooses the rows of each step, so
``finish()`` reruns the last 2h steps on the plan's rows (the same distribution, not the same
rows Trainer used); the comparison is unbiased, with more noise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from transformers import TrainerCallback

from leadline.errors import InputError
from leadline.plan import Plan


class LeadlineCallback(TrainerCallback):
    """Runs :class:`~leadline.rate.LookaheadSchedule` and the spill cap inside ``Trainer``.

    Args:
        plan: the derived plan (``lr``, ``alpha1``, ``warmup_steps``, the horizon).
        held_out_losses: per-row losses on fixed held-out rows (``Split.reader``).
        train_step: ``train_step(step)``, forward+backward of one optimizer step on the plan's
            rows (``finish()`` reruns the ending with it).
        params: the trained tensors (default: the model's ``requires_grad`` parameters).
        total_steps: the run's length (default: Trainer's ``max_steps``).
        cap: cap the process on a CUDA card (default True).
    """

    def __init__(self, plan: Plan, held_out_losses: Callable[[], Sequence[float]], train_step: Callable[[int], Any], *,
                 params: Sequence[Any] | None = None, total_steps: int | None = None, cap: bool = True) -> None:
        if "lr" not in plan:
            raise InputError("LeadlineCallback needs a plan with a rate (lr); derive one with leadline.hf.derive_for")
        self.plan = plan
        self.held_out_losses = held_out_losses
        self.train_step = train_step
        self.params = list(params) if params is not None else None
        self.total_steps = total_steps
        self.cap = cap
        self.schedule: Any = None
        self.ending: dict[str, Any] | None = None
        self._cap_handle: Any = None

    @classmethod
    def for_plan(cls, plan: Plan, model: Any, tokenizer: Any, train_dataset: Any, **kw: Any) -> LeadlineCallback:
        """Build the held-out reader and the train step from the data the plan was derived on
        (same seed, same length, so the held-out rows are the plan's)."""
        from leadline.hf import prepare

        seed = int(plan.held_out.get("seed", 0)) if isinstance(plan.held_out, dict) else 0
        task, _ = prepare(model, tokenizer, train_dataset, seq_len=plan.get("seq_len"), seed=seed)
        if plan.held_out.get("held_out") and plan.held_out["held_out"] != task.split.held_out:
            raise InputError("the data's split differs from the plan's held-out rows; pass the train_dataset the plan was derived on")
        step = task.train_step_of(int(plan.get("micro_batch", 1)), int(plan.get("grad_accum", 1)))
        return cls(plan, task.held_out_losses(), step, **kw)

    # ---- Trainer's events ---------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kw: Any) -> None:
        from leadline.rate import LookaheadSchedule, lookahead_from

        if optimizer is None:
            raise InputError("LeadlineCallback needs Trainer's optimizer at on_train_begin; use transformers >= 4.45")
        optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper holds the torch optimizer
        params = self.params or [p for p in model.parameters() if p.requires_grad]
        device = params[0].device
        if self.cap and device.type == "cuda":
            from leadline.memory import forbid_spill

            self._cap_handle = forbid_spill(device)
        total = int(self.total_steps or state.max_steps or args.max_steps)
        if total < 1:
            raise InputError("LeadlineCallback needs the run's length: set TrainingArguments.max_steps or pass total_steps")
        self.schedule = LookaheadSchedule(params, optimizer, self.train_step, self.held_out_losses,
                                          lookahead_from(self.plan), total_steps=total)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.schedule is not None:
            self.schedule.before(int(state.global_step))

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        try:
            if self.schedule is not None:
                self.ending = self.schedule.finish()
        finally:
            self.close()

    def close(self) -> None:
        """Lift the cap this callback set. ``on_train_end`` does it, but Trainer does not call
        that when training raises: run ``with cb: trainer.train()`` to lift it on every exit."""
        if self._cap_handle is not None:
            self._cap_handle.lift()
            self._cap_handle = None

    def __enter__(self) -> LeadlineCallback:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def evidence(self) -> dict[str, Any] | None:
        """The schedule's checks and rollbacks, and the ending it kept."""
        return None if self.schedule is None else {**self.schedule.evidence(), "ending": self.ending}
