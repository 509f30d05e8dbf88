"""The guard carried out on live tensors: its readings taken, its copies kept, its rollbacks put back.

:class:`leadline.rate.guard.Guard` decides on numbers; :class:`Watch` does what it says to the
trained tensors and their optimizer. It is the one implementation of check-and-rollback, fed by
every loop that trains under the guard:

- the run's loop, :func:`leadline.run.loop.guarded_steps` (``leadline run``, and
  :func:`leadline.train.train_with_plan` for every plan);
- the LookaheadSchedule's step hook (:class:`leadline.lookahead.rate.schedule.LookaheadSchedule`: a plan of
  the look-ahead in ``Trainer`` or in a loop of your own);
- the guard inside ``Trainer`` (:class:`leadline.hf.guarded.TrainerGuard`).

What it does, in the order a run meets it:

1. **The start** (:meth:`Watch.start`): the start's reading and its copy (weights, optimizer state,
   the optimizer's per-group counters such as schedule-free's step count and weight sum).
2. **The watch** (:meth:`Watch.see`): each step loss (or a logged mean) seen; a non-finite one is
   a rollback at the next :meth:`Watch.after_step` without a read; one far above the recent ones
   (:func:`leadline.rate.guard.spiked`) calls a check there, at most one between two scheduled.
3. **A check** (:meth:`Watch.check`): the held-out subset read at the optimizer's averaged weights
   (schedule-free's ``eval()``; the training weights put back bit for bit after, since ``eval()``
   and ``train()`` are not exact inverses in floating point), then the guard's word carried out:
   a new best's copy kept (reusing the buffers of the copy it drops), or a kept check put back
   at the guard's rate (a rollback or a stop).
4. **The end** (:meth:`Watch.end`): the end kept unless significantly worse than the best check
   (then put back); the kept model's losses on every held-out row returned.

Copies go on the card where it has room, else in host memory (:class:`leadline.rate.state.Snapshot`).
"""

from __future__ import annotations

import copy
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from leadline.rate.guard import SPIKE_WINDOW, Guard, Step, spiked

if TYPE_CHECKING:
    import torch

    from leadline.rate.state import Snapshot


class StateCopy:
    """The trained tensors, their optimizer state and the optimizer's group counters at one step (the
    optimizer's train/eval mode is the live one's, never put back).

    Examples:
        >>> import torch
        >>> w = torch.zeros(2, requires_grad=True)
        >>> opt = torch.optim.Adam([w], lr=0.1)
        >>> kept = StateCopy.take([w], opt)
        >>> kept.fresh
        True
        >>> w.sum().backward(); opt.step()
        >>> kept.load([w], opt)
        >>> w.tolist(), len(opt.state), opt.param_groups[0]["lr"]
        ([0.0, 0.0], 0, 0.1)
    """

    def __init__(self, snapshot: Snapshot, groups: list[dict[str, Any]]) -> None:
        self.snapshot, self.groups = snapshot, groups

    @staticmethod
    def _groups(opt: torch.optim.Optimizer) -> list[dict[str, Any]]:
        return [{k: copy.deepcopy(v) for k, v in g.items() if k not in ("params", "lr", "train_mode")}
                for g in opt.param_groups]

    @classmethod
    def take(cls, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer, *, place: str = "auto") -> StateCopy:
        from leadline.rate.state import Snapshot

        return cls(Snapshot.take(params, opt, rng=False, place=place), cls._groups(opt))

    @property
    def fresh(self) -> bool:
        """A copy of an optimizer that has taken no step (no state): a rollback to it restarts the warmup."""
        return not any(self.snapshot.opt_state)

    def save(self, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer) -> None:
        """Copy again into the same buffers."""
        self.snapshot.save(params, opt, rng=False)
        self.groups = self._groups(opt)

    def load(self, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer, *, weights_only: bool = False) -> None:
        """Put it back bit for bit (``weights_only``: the tensors alone, after a read)."""
        import torch

        if weights_only:
            with torch.no_grad():
                for p, s in zip(params, self.snapshot.params):
                    p.copy_(s)
            return
        self.snapshot.load(params, opt, rng=False)
        for g, kept in zip(opt.param_groups, self.groups):
            g.update(copy.deepcopy(kept))


def read_averaged(opt: torch.optim.Optimizer, model: torch.nn.Module | None, params: Sequence[torch.Tensor],
                  read: Callable[[], Sequence[float]], spare: Callable[[], StateCopy]) -> list[float]:
    """The held-out losses at the optimizer's averaged weights (its ``eval()`` where it has one; the
    training weights saved in ``spare()`` first and put back after, on every exit path), the model
    in eval mode for the read (``model`` None: the reader sets its own mode)."""
    averaged = hasattr(opt, "eval")
    held = spare() if averaged else None
    if held is not None:
        held.save(params, opt)
        opt.eval()
    if model is not None:
        model.eval()
    try:
        return [float(x) for x in read()]
    finally:
        if held is not None:
            opt.train()
            held.load(params, opt, weights_only=True)
        if model is not None:
            model.train()


class Watch:
    """The guard's word carried out on ``params`` and ``opt`` (the module docstring).

    Args:
        guard: the rules' state; :meth:`start` gives it the start's reading.
        read: per-row losses on the held-out subset a check reads.
        model: put in eval mode for each read (None: ``read`` sets its own mode).
        checks: the steps after which a check is due (:func:`leadline.rate.guard.check_steps`).
        spikes: whether a step loss far above the recent ones calls a check.
        place: where copies go (``"auto"``, ``"card"``, ``"host"``).
        set_rate: sets the rate after a rollback (default: the optimizer's groups, each keeping its
            ratio to the first).
        on_said: called with ``(step, said)`` after each of the guard's words is carried out.

    Examples:
        Four weights trained toward 1; a step multiplied past divergence at step 6 is caught at the
        check after it, the best check (step 4) put back and the rate halved:

        >>> import torch
        >>> from leadline.rate.guard import Guard
        >>> w = torch.zeros(4, requires_grad=True)
        >>> opt = torch.optim.SGD([w], lr=0.2)
        >>> held = lambda: ((w - 1) ** 2).tolist()
        >>> watch = Watch(Guard(rate=0.2, looks=4), [w], opt, held, checks=[2, 4, 6, 8])
        >>> watch.start(0)
        >>> for s in range(8):
        ...     opt.zero_grad(); loss = ((w - 1) ** 2).sum(); loss.backward()
        ...     if s == 5: w.grad *= -30
        ...     opt.step(); watch.see(loss.item()); said = watch.after_step(s + 1)
        >>> [(r["step"], r["action"]) for r in watch.guard.records]
        [(0, 'start'), (2, 'best'), (4, 'best'), (6, 'rollback'), (8, 'best')]
        >>> opt.param_groups[0]["lr"], sorted(watch.kept)
        (0.1, [0, 4, 8])
    """

    def __init__(self, guard: Guard, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer,
                 read: Callable[[], Sequence[float]], *, model: torch.nn.Module | None = None,
                 checks: Iterable[int] = (), spikes: bool = True, place: str = "auto",
                 set_rate: Callable[[float], None] | None = None,
                 on_said: Callable[[int, Step], None] | None = None) -> None:
        from leadline.rate.state import group_ratios

        self.guard, self.params, self.opt, self.read, self.model = guard, list(params), opt, read, model
        self.checks, self.spikes, self.place = set(checks), spikes, place
        ratios = group_ratios(opt)
        self.set_rate = set_rate or (lambda lr: _set_lr(opt, lr, ratios))
        self.on_said = on_said
        self.kept: dict[int, StateCopy] = {}
        self.reads, self.read_seconds, self.copy_seconds = 0, 0.0, 0.0
        self.spiked_at: list[int] = []
        self.stopped_at: int | None = None
        self._recent: deque[float] = deque(maxlen=SPIKE_WINDOW)
        self._called = False  # a check called by the watch since the last scheduled one
        self._due: str | None = None  # what the watch saw: "spike" or "diverged", acted on at the next step's end
        self._spare: StateCopy | None = None

    def _spare_copy(self) -> StateCopy:
        if self._spare is None:
            self._spare = StateCopy.take(self.params, self.opt, place=self.place)
        return self._spare

    def read_now(self, read: Callable[[], Sequence[float]] | None = None) -> list[float]:
        """A reading at the averaged weights (``read``, default the check's subset), counted and timed."""
        t = time.perf_counter()
        try:
            return read_averaged(self.opt, self.model, self.params, read or self.read, self._spare_copy)
        finally:
            self.reads += 1
            self.read_seconds += time.perf_counter() - t

    def start(self, step: int = 0, losses: Sequence[float] | None = None, copy: StateCopy | None = None) -> None:
        """The start's reading (read now where not given) and its copy (taken now where not given)."""
        losses = self.read_now() if losses is None else losses
        self.guard.start(step, losses)
        self.kept[step] = copy if copy is not None else StateCopy.take(self.params, self.opt, place=self.place)
        if self.on_said is not None:
            self.on_said(step, Step("start"))

    def see(self, loss: float) -> None:
        """A step loss (or a logged mean) seen: a spike or a non-finite loss is acted on at the next step's end."""
        if not math.isfinite(loss):
            self._due = "diverged"
            return
        if self.spikes and not self._called and spiked(loss, self._recent):
            self._due = "spike"
        self._recent.append(loss)

    def after_step(self, step: int) -> Step | None:
        """A step's end (``step`` steps taken): a check where one is due, what the guard says carried out."""
        due, self._due = self._due, None
        if due == "diverged":
            return self.diverged(step)
        if step not in self.checks and due != "spike":
            return None
        spike = due == "spike" and step not in self.checks
        self._called = spike
        if spike:
            self.spiked_at.append(step)
        return self.check(step, why="step loss spike" if spike else "scheduled")

    def check(self, step: int, losses: Sequence[float] | None = None, *, why: str = "scheduled") -> Step:
        """A check at ``step`` (read now where ``losses`` are not given) and the guard's word carried out."""
        losses = self.read_now() if losses is None else losses
        return self._carry_out(self.guard.check(step, losses, why=why), step)

    def diverged(self, step: int) -> Step:
        """A non-finite loss at ``step``: a rollback without a read."""
        return self._carry_out(self.guard.diverged(step), step)

    def finish(self, step: int, losses: Sequence[float]) -> Step:
        """The guard's last word on the end's reading: the end kept, or the best check put back."""
        said = self.guard.finish(step, losses)
        if said.action == "restore":
            assert said.to_step is not None
            self.kept[said.to_step].load(self.params, self.opt)
        if self.on_said is not None:
            self.on_said(step, said)
        return said

    def end(self, step: int, read_all: Callable[[], Sequence[float]]) -> list[float]:
        """The run's end decided (:meth:`finish` on the check's rows of every held-out row, or the
        stop already kept) and the kept model's losses on every held-out row."""
        rows = len(self.guard.chain[0][1])
        losses = self.read_now(read_all)
        if self.stopped_at is not None:
            self.guard.finish(step, [])
            return losses
        if self.finish(step, losses[:rows]).action == "restore":
            losses = self.read_now(read_all)
        return losses

    def _carry_out(self, said: Step, step: int) -> Step:
        """Keep a new best's copy, or put a kept check back at the guard's rate (a rollback or a stop)."""
        t = time.perf_counter()
        if said.action == "best":
            reuse = self.kept.pop(said.dropped) if said.dropped is not None else None
            if reuse is not None:
                reuse.save(self.params, self.opt)
                self.kept[step] = reuse
            else:
                self.kept[step] = StateCopy.take(self.params, self.opt, place=self.place)
        elif said.action in ("rollback", "stop"):
            assert said.to_step is not None
            for k in [k for k in self.kept if k > said.to_step]:
                del self.kept[k]
            self.kept[said.to_step].load(self.params, self.opt)
            self._recent.clear()
            if said.lr is not None:
                self.set_rate(said.lr)
            if said.action == "stop":
                self.stopped_at = step
        self.copy_seconds += time.perf_counter() - t
        if self.on_said is not None:
            self.on_said(step, said)
        return said


def _set_lr(opt: torch.optim.Optimizer, lr: float, ratios: Sequence[float]) -> None:
    for g, r in zip(opt.param_groups, ratios):
        g["lr"] = lr * r
