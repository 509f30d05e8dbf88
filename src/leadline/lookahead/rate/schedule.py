"""LookaheadSchedule: the plan's rate, checked every horizon and rolled back when it gets worse.

Used inside the caller's loop::

    sched = LookaheadSchedule(params, opt, train_step, held_out_losses_per_row,
                              lookahead_from(plan), total_steps=T)
    for step in range(T):
        sched.before(step)          # checks, rolls back, copies, sets the rate
        opt.zero_grad(set_to_none=True)
        train_step(step)
        opt.step()
    sched.finish()                  # races the ending, keeps the better

- The rate: warmup from alpha1 over the plan's warmup steps, then the plan's rate.
- A check every h steps (h = the look-ahead's horizon, at most T/8 so that the run is
  checked at least 8 times and the raced ending, 2h, is at most a quarter of it), step 0
  included: the
  per-row held-out losses against the best check's, paired t at
  :func:`leadline.stats.sequential_bar` (look k of T/h). Significantly worse (or non-finite):
  put the best check back (trained tensors and their optimizer state, bit-exactly) and halve
  the rate. When the run fails again from that same check without ever improving on it, the
  check itself is suspect — a state already collapsed — and the schedule goes one check
  further back (as far as step 0, where the warmup restarts). It keeps step 0 and the last
  ``keep_checks - 1`` best checks. These rules are :class:`leadline.rate.guard.Guard`'s (the default
  run's guard, with no stop: the caller's loop is not the schedule's to end); the schedule reads
  the checks, feeds them to it and carries out what it says, each kept check's snapshot
  under its step.
- Copies at T/2 and at T - 2h; ``finish()`` reruns the last half and the last 2h steps from
  them with the rate falling linearly to zero, ranks the two decayed endings by their mean
  held-out loss, and keeps the better one unless the constant ending's held-out loss is lower
  by a one-sided paired t test (the decay is the null: it is the ending measured helping;
  docs/rate.md). Neither length wins on every task, so both are raced (measured: docs/rate.md,
  "Why two lengths"). Then a final check against the best check, which is put back if the
  ending is significantly worse. ``ending_steps`` (``lookahead_from(..., ending_steps=n)``)
  races one length only: the copy at T - n, n steps rerun. A copy is a state the run passed
  through; a rollback after it does not void it (its decayed ending is raced like the others).

Snapshots hold the trained tensors and their optimizer state only, on the card when it has
room for them twice (else in host memory).

``ending="to_zero"`` (``lookahead_from(..., ending="to_zero")``) replaces the raced ending:
the rate falls linearly to zero over the run's own steps (from the first step it takes itself
to T), a rollback's halving applied on top; no copy is taken and ``finish()`` only makes the
final check. It is the ending the recipe's linear schedule uses, here under the same checks.

A run whose first n steps were taken elsewhere — derive's look-ahead, at the branch's rate
(``ScheduleConfig.taken_steps``/``taken_lr``, :func:`lookahead_from`'s ``taken=``) — checks at
step 0 and then at the multiples of h from n on: the look-ahead read those steps itself. The
caller either runs them (``before(t)`` for t < n sets the branch's rate) or, after ``before(0)``,
loads the branch's state and calls :meth:`LookaheadSchedule.continue_at`; the two give the same
run, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from leadline.errors import InputError
from leadline.lookahead.rate.warmup import linear_decay_lr, warmup_lr
from leadline.plan import Plan, Value
from leadline.rate.guard import Guard, Step
from leadline.rate.watch import Watch

ENDINGS = ("raced", "to_zero")


@dataclass(frozen=True)
class ScheduleConfig:
    """What LookaheadSchedule takes from a plan: the rate, the warmup and the check interval.

    Examples:
        >>> cfg = ScheduleConfig(1e-3, alpha1=1e-2, horizon_steps=16)
        >>> cfg.lr, cfg.warmup_steps, cfg.horizon_steps, cfg.ending, cfg.ending_steps
        (0.001, 0, 16, 'raced', None)
        >>> ScheduleConfig(1e-3, ending="cosine")
        Traceback (most recent call last):
            ...
        leadline.errors.InputError: ending must be one of raced, to_zero, got 'cosine'
    """

    lr: float
    alpha1: float | None = None
    warmup_steps: int = 0
    horizon_steps: int | None = None
    taken_steps: int = 0
    """The run's first steps, taken elsewhere (the look-ahead's branch): no check inside them."""
    taken_lr: float | None = None
    """The rate they were taken at (with the warmup, where ``warmup_steps``)."""
    ending: Literal["raced", "to_zero"] = "raced"
    """``raced``: the last half and the last 2h steps rerun with the rate decaying and the best
    ending kept; ``to_zero``: the rate falls linearly to zero over the run's own steps, nothing raced."""
    ending_steps: int | None = None
    """One raced ending's length: the last steps rerun from the copy with the rate decaying
    (None: the last half and the last 2h, both raced)."""

    def __post_init__(self) -> None:
        if self.ending not in ENDINGS:
            raise InputError(f"ending must be one of {', '.join(ENDINGS)}, got {self.ending!r}")
        if self.ending_steps is not None and (isinstance(self.ending_steps, bool) or not isinstance(
                self.ending_steps, int) or self.ending_steps < 1):
            raise InputError(f"ending_steps must be a whole number of steps >= 1 (or None for the default), got "
                             f"{self.ending_steps!r}")
        if self.ending_steps is not None and self.ending != "raced":
            raise InputError(f"ending_steps sets the raced ending's length, and ending={self.ending!r} races nothing; "
                             "drop one of them")


def lookahead_from(source: Plan | Mapping[str, Any] | Any, *, taken: tuple[int, float] | None = None,
                   ending: Literal["raced", "to_zero"] = "raced", ending_steps: int | None = None) -> ScheduleConfig:
    """The schedule's settings from a :class:`Plan` (values ``lr``, ``alpha1``, ``warmup_steps``,
    ``lookahead_horizon_steps``), a mapping with those keys, or a :class:`Lookahead`.
    ``taken``: (steps, rate) of the run's first steps taken elsewhere; ``ending``: ``raced`` or
    ``to_zero``; ``ending_steps``: one raced ending's length (default: the last half and 2h, both raced;
    see the module docstring).

    Examples:
        >>> cfg = lookahead_from({"lr": 2e-3, "alpha1": 1e-2, "warmup_steps": 0, "lookahead_horizon_steps": 16})
        >>> cfg.lr, cfg.alpha1, cfg.horizon_steps, cfg.ending
        (0.002, 0.01, 16, 'raced')
        >>> cfg = lookahead_from({"lr": 2e-3}, taken=(16, 2e-3), ending_steps=30)
        >>> cfg.taken_steps, cfg.taken_lr, cfg.ending_steps
        (16, 0.002, 30)
        >>> lookahead_from({"alpha1": 1e-2})
        Traceback (most recent call last):
            ...
        leadline.errors.InputError: the plan has no usable 'lr' (got None); derive one with lookahead_lr() or ...
    """
    cfg = replace(_config_of(source), ending=ending, ending_steps=ending_steps)
    if taken is None:
        return cfg
    steps, rate = taken
    if not isinstance(steps, int) or steps < 0 or not (isinstance(rate, (int, float)) and rate > 0):
        raise InputError(f"taken must be (steps >= 0, a rate > 0), got {taken!r}")
    return replace(cfg, taken_steps=steps, taken_lr=float(rate))


def _config_of(source: Plan | Mapping[str, Any] | Any) -> ScheduleConfig:
    from leadline.lookahead.rate.lookahead import Lookahead

    if isinstance(source, Lookahead):
        return ScheduleConfig(source.lr, source.alpha1, source.warmup_steps, source.horizon_steps or None)
    if isinstance(source, Plan):
        get = source.get
    elif isinstance(source, Mapping):
        get = source.get
    else:
        raise InputError("lookahead_from needs a Plan, a Lookahead or a mapping with 'lr', got "
                         f"{type(source).__name__}")
    lr = get("lr")
    if not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise InputError(f"the plan has no usable 'lr' (got {lr!r}); derive one with lookahead_lr() or pass {{'lr': "
                         "...}")
    a1, w, h = get("alpha1"), get("warmup_steps", 0), get("lookahead_horizon_steps")
    return ScheduleConfig(float(lr), float(a1) if a1 else None, int(w or 0), int(h) if h else None)


def check_interval(config: ScheduleConfig, total_steps: int) -> int:
    """h: the look-ahead's horizon, at most T/8 (so the run is checked at least 8 times), at least 1.

    Examples:
        >>> check_interval(ScheduleConfig(1e-3, horizon_steps=40), 200), check_interval(ScheduleConfig(1e-3), 64)
        (25, 8)
    """
    return max(1, min(config.horizon_steps or total_steps, total_steps // 8))


def ending_lengths(config: ScheduleConfig, total_steps: int) -> tuple[int, ...]:
    """The raced endings' steps, longest first: ``config.ending_steps`` (at most T - 1) alone,
    else the last half and 2h (2h alone where the half is not longer, or where the run continues
    from steps taken elsewhere that reach past T/2).

    Examples:
        >>> ending_lengths(ScheduleConfig(1e-3, horizon_steps=12), 100)
        (50, 24)
        >>> ending_lengths(ScheduleConfig(1e-3, horizon_steps=12, ending_steps=30), 100)
        (30,)
        >>> ending_lengths(ScheduleConfig(1e-3, horizon_steps=1), 3)
        (2,)
    """
    if config.ending_steps is not None:
        return (max(1, min(config.ending_steps, total_steps - 1)),)
    two_h = min(2 * check_interval(config, total_steps), max(1, total_steps - 1))
    half = total_steps // 2
    lengths = (half, two_h) if half > two_h else (two_h,)
    # a run continued from steps taken elsewhere races the endings that start after them
    return tuple(n for n in lengths if total_steps - n > config.taken_steps) or lengths[-1:]


def ending_length(config: ScheduleConfig, total_steps: int) -> int:
    """The longest raced ending's steps: the first copy is taken at T minus it.

    Examples:
        >>> ending_length(ScheduleConfig(1e-3, horizon_steps=12), 100)
        50
        >>> ending_length(ScheduleConfig(1e-3, horizon_steps=12, ending_steps=30), 100)
        30
    """
    return ending_lengths(config, total_steps)[0]


def ending_copy_step(config: ScheduleConfig, total_steps: int) -> int | None:
    """The step at which the schedule takes its first copy for the raced ending: T minus the
    longest ending (the last half unless a length is given), at least 1; None for the
    ``to_zero`` ending, which copies nothing.

    Examples:
        >>> ending_copy_step(ScheduleConfig(1e-3, horizon_steps=12), 100)
        50
        >>> ending_copy_step(ScheduleConfig(1e-3, ending="to_zero"), 100) is None
        True
    """
    if config.ending == "to_zero":
        return None
    return max(1, total_steps - ending_length(config, total_steps))


class LookaheadSchedule:
    """The run's rate, checked every horizon h on held-out rows (see the module docstring).

    Args:
        params: the trained tensors.
        opt: the optimizer over them; the schedule sets its learning rate in ``before``.
        train_step: ``train_step(step)``, the loop's forward+backward; ``finish()`` calls it to
            rerun the raced endings' steps (the same rows for the same step).
        held_out_losses_per_row: per-row losses on fixed held-out rows.
        config: ``lookahead_from(plan)``.
        total_steps: T.
        alpha: the error rate of the tests.
        keep_checks: how many checks keep a snapshot (step 0 and the last best ones).
        place: where the snapshots live (``"auto"``: on the card when there is room).

    Examples:
        Four weights trained from 0 toward 0.01, one held-out row each, at 0.0025: Adam moves
        every entry by about lr a step, so the run reaches the target at step 4 and overshoots.
        The check at step 6 is significantly worse than the best (step 4) and gives back 8% of the
        fall from the start: step 4 is put back and the rate halved. The check at step 8 is worse
        by only 1.3% of the fall, a wobble: kept. The check at step 10 fails again from step 4
        (5.2%) without improving on it, so step 4 is suspect: the schedule goes one check further
        back, to step 2, halves again and goes on at 0.000625:

        >>> import torch
        >>> w = torch.zeros(4, requires_grad=True)
        >>> opt = torch.optim.Adam([w])
        >>> train_step = lambda step: ((w - 0.01) ** 2).mean().backward()
        >>> held_out = lambda: ((w - 0.01) ** 2).tolist()
        >>> sched = LookaheadSchedule([w], opt, train_step, held_out, lookahead_from({"lr": 0.0025}), total_steps=16)
        >>> for step in range(16):
        ...     sched.before(step)
        ...     opt.zero_grad(set_to_none=True)
        ...     train_step(step)
        ...     opt.step()
        >>> ending = sched.finish()
        >>> sched.h, sched.rollbacks, sched.rate
        (2, 2, 0.000625)
        >>> [(c["step"], c["action"], c.get("to_step")) for c in sched.checks[2:6]]
        [(4, 'best', None), (6, 'rollback', 4), (8, 'keep', None), (10, 'rollback', 2)]
    """

    def __init__(self, params: Sequence[Any], opt: Any, train_step: Callable[[int], Any],
                 held_out_losses_per_row: Callable[[], Sequence[float]], config: ScheduleConfig, *,
                 total_steps: int, alpha: float = 0.05, keep_checks: int = 3, place: str = "auto",
                 on_check: Callable[[dict[str, Any]], None] | None = None) -> None:
        from leadline.lookahead.rate.measuring import check_params
        from leadline.rate.state import group_ratios

        if not isinstance(config, ScheduleConfig):
            raise InputError("config must come from lookahead_from(plan)")
        if not isinstance(total_steps, int) or total_steps < 1:
            raise InputError(f"total_steps must be the run's length in optimizer steps (>= 1), got {total_steps!r}")
        if keep_checks < 2:
            raise InputError(f"keep_checks must be at least 2 (step 0 and the best check), got {keep_checks}")
        self.params = check_params(params, opt)
        self.opt, self.train_step, self.held_out = opt, train_step, held_out_losses_per_row
        self.config, self.total_steps, self.alpha = config, total_steps, alpha
        self.keep_checks, self.place, self.on_check = keep_checks, place, on_check
        self.h = check_interval(config, total_steps)
        self.ending_lens = ending_lengths(config, total_steps)
        self.ending_len = self.ending_lens[0]
        self.max_looks = max(1, total_steps // self.h)
        # the decision rule: the guard's; the schedule carries out what it says
        self.guard = Guard(rate=config.lr, looks=self.max_looks, keep=keep_checks, max_rollbacks=None, alpha=alpha)
        # the guard's word carried out (copies, rollbacks) as in every guarded loop; no spike watch
        self.watch = Watch(self.guard, self.params, opt, self._read, spikes=False, place=place, on_said=self._said)
        self.warm_from = 0
        self.ratios = group_ratios(opt)
        self.rows: int | None = None
        self.checks: list[dict[str, Any]] = []
        self.copies: list[Any] = []  # EndingCopy, one per raced ending, longest first
        self.ending: dict[str, Any] = {}
        self.last_step = -1
        self.finished = False

    @property
    def rate(self) -> float:
        """The rate after the warmup: the plan's, times the guard's factor for each rollback."""
        return self.guard.rate

    # ---- the rate --------------------------------------------------------------------
    def lr_at(self, step: int) -> float:
        """Warmup from alpha1 (restarted after a rollback to a fresh optimizer), then the rate;
        inside the steps taken elsewhere, their rate."""
        if step < self.config.taken_steps and self.warm_from == 0 and self.config.taken_lr is not None:
            return warmup_lr(step, self.config.taken_lr, self.config.alpha1, self.config.warmup_steps)
        lr = warmup_lr(step - self.warm_from, self.rate, self.config.alpha1, self.config.warmup_steps)
        if self.config.ending == "to_zero":
            return linear_decay_lr(step, self.config.taken_steps, self.total_steps, lr)
        return lr

    def continue_at(self, step: int) -> None:
        """The run goes on at ``step`` = the steps taken elsewhere, whose state the caller has just
        loaded; call it after ``before(0)`` (the check at step 0, on the state before them)."""
        if self.last_step != 0 or step != self.config.taken_steps or step < 1:
            raise InputError(f"continue_at({step!r}) needs before(0) first and the config's taken_steps "
                             f"({self.config.taken_steps}) >= 1")
        if self.config.ending == "raced" and step >= self.total_steps - self.ending_len:
            raise InputError(f"continue_at({step}) leaves no room for the raced ending: the copy is taken at step "
                             f"{self.total_steps - self.ending_len}")
        self.last_step = step - 1

    def before(self, step: int) -> None:
        """Call before each optimizer step: the check at multiples of h, the copy for the raced
        endings (at T/2 and T - 2h unless a length is given), the rate."""
        from leadline.rate.state import Snapshot, set_lr

        if self.finished:
            raise InputError("this LookaheadSchedule has finished; build a new one for another run")
        if not isinstance(step, int) or step <= self.last_step or step >= self.total_steps:
            raise InputError(f"before(step) needs increasing steps in 0..{self.total_steps - 1}; got {step!r} after "
                             f"{self.last_step}")
        self.last_step = step
        if step % self.h == 0 and (step == 0 or step >= self.config.taken_steps):
            if self.watch.kept:
                self.watch.check(step)
            else:
                self.watch.start(step)
        if self.config.ending == "raced" and step > 0 and len(self.copies) < len(self.ending_lens):
            from leadline.lookahead.rate._run import EndingCopy

            copy_at = self.total_steps - self.ending_lens[len(self.copies)]
            if step >= copy_at and all(c.start < step for c in self.copies):
                self.copies.append(EndingCopy(Snapshot.take(self.params, self.opt, place=self.place),
                                              self.lr_at(step), step))
        set_lr(self.opt, self.lr_at(step), self.ratios)

    # ---- the checks ------------------------------------------------------------------
    def _read(self) -> list[float]:
        from leadline.lookahead.rate.measuring import read_held_out

        losses = read_held_out(self.held_out, self.rows)
        self.rows = len(losses)
        return losses

    def _record(self, step: int, action: str, **extra: Any) -> None:
        """The check's row: the guard's reading (loss, se, versus_best) at the rate the run takes at ``step``."""
        said = self.guard.records[-1]
        row = {"step": step, "loss": said["loss"], "se": said["se"], "lr": self.lr_at(step), "action": action, **extra}
        if "versus_best" in said:
            row["versus_best"] = said["versus_best"]
        self.checks.append(row)
        if self.on_check is not None:
            self.on_check(row)

    @property
    def snapshots(self) -> dict[int, Any]:
        """Each kept check's step: its copy (the start's and the latest bests'; none once finished)."""
        return self.watch.kept

    def _said(self, step: int, said: Step) -> None:
        """The check's row for what the guard said; a rollback to a fresh optimizer restarts the warmup."""
        if said.action in ("start", "best"):
            self._record(step, "best")
        elif said.action == "rollback":
            assert said.to_step is not None
            if self.watch.kept[said.to_step].fresh:  # the start: a fresh optimizer
                self.warm_from = step
            self._record(step, "rollback", to_step=said.to_step, further_back=said.further_back)
        elif said.action == "restore":
            self._record(step, "rollback", to_step=said.to_step, final=True)
        elif said.action == "final":
            self._record(step, "final")
        else:
            self._record(step, "keep")

    # ---- the end ---------------------------------------------------------------------
    def finish(self) -> dict[str, Any]:
        """Race the ending (the decays from the copies against the constant run), keep the best
        by a test, then a final check against the best check. Returns the ending's evidence."""
        from leadline.lookahead.rate._run import ending_why, race_ending

        if self.finished:
            raise InputError("finish() was already called for this LookaheadSchedule")
        if self.copies:
            self.ending, losses = race_ending(
                self.params, self.opt, self.train_step, self.held_out, self.copies, self.total_steps, self.ratios,
                self._rows(), alpha=self.alpha, place=self.place)
            self.ending["why"] = ending_why(self.ending)
        elif self.config.ending == "to_zero":
            losses = self._read()
            start = self.config.taken_steps
            self.ending = {"kept": "to_zero", "from_step": start, "to_step": self.total_steps,
                           "why": f"the rate fell linearly to zero from step {start} to {self.total_steps}, as asked "
                                  "(ending to_zero): nothing raced"}
        else:
            losses = self._read()
            self.ending = {"kept": "constant",
                           "why": f"no copy: the run ({self.total_steps} steps) is not longer than its raced ending "
                                  f"({self.ending_len} steps)"}
        if self.watch.kept:  # the guard's final check: the end kept unless significantly worse than the best
            self.watch.finish(self.total_steps, losses)
        self.finished = True
        self.watch.kept.clear()  # the copies go; the checks' record stays
        self.copies = []
        return self.ending

    def _rows(self) -> int:
        if self.rows is None:
            self._read()
        assert self.rows is not None
        return self.rows

    @property
    def rollbacks(self) -> int:
        return sum(1 for c in self.checks if c["action"] == "rollback")

    def evidence(self) -> dict[str, Any]:
        return {"plot": "schedule", "checks": self.checks, "ending": self.ending, "horizon_steps": self.h,
                "total_steps": self.total_steps, "rate": self.rate, "rollbacks": self.rollbacks}

    def as_values(self) -> dict[str, Value]:
        """``schedule_rollbacks`` with the checks as evidence, and ``ending`` once finished."""
        out = {"schedule_rollbacks": Value(
            self.rollbacks, "measured",
            f"checks every {self.h} steps on {self.rows or 0} held-out rows; a significantly worse check put the best "
            f"back and halved the rate (rate now {self.rate:.3g})",
            evidence=self.evidence())}
        if self.ending:
            kind = "given" if self.ending["kept"] == "to_zero" else "measured"
            out["ending"] = Value(self.ending["kept"], kind, self.ending["why"], evidence=self.ending)
        return out
