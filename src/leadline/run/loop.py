"""The run's one loop: optimizer steps, the guard's checks between them, rollbacks carried out.

The loop takes the steps ``todo``; after each it watches the step loss (:func:`leadline.rate.guard.spiked`),
and at the guard's check steps it reads the held-out subset at the optimizer's averaged weights
(schedule-free's ``eval()``), puts the training weights back bit for bit (``eval()`` and ``train()``
are not exact inverses in floating point), and does what :class:`leadline.rate.guard.Guard` says:
keep a copy of a new best, put a best back at a lower rate, or stop. Copies hold the trained
tensors, their optimizer state and the optimizer's per-group counters (schedule-free's step count
and weight sum), on the card where it has room.
"""

from __future__ import annotations

import copy
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from leadline.rate.guard import Guard, Step, spiked


class StateCopy:
    """The trained tensors, their optimizer state and the optimizer's group counters at one step (the
    optimizer's train/eval mode is the live one's, never put back).

    Examples:
        >>> import torch
        >>> w = torch.zeros(2, requires_grad=True)
        >>> opt = torch.optim.Adam([w], lr=0.1)
        >>> kept = StateCopy.take([w], opt)
        >>> w.sum().backward(); opt.step()
        >>> kept.load([w], opt)
        >>> w.tolist(), len(opt.state), opt.param_groups[0]["lr"]
        ([0.0, 0.0], 0, 0.1)
    """

    def __init__(self, snapshot: Any, groups: list[dict[str, Any]]) -> None:
        self.snapshot, self.groups = snapshot, groups

    @staticmethod
    def _groups(opt: Any) -> list[dict[str, Any]]:
        return [{k: copy.deepcopy(v) for k, v in g.items() if k not in ("params", "lr", "train_mode")}
                for g in opt.param_groups]

    @classmethod
    def take(cls, params: Sequence[Any], opt: Any) -> StateCopy:
        from leadline.rate.state import Snapshot

        return cls(Snapshot.take(params, opt, rng=False), cls._groups(opt))

    def save(self, params: Sequence[Any], opt: Any) -> None:
        """Copy again into the same buffers."""
        self.snapshot.save(params, opt, rng=False)
        self.groups = self._groups(opt)

    def load(self, params: Sequence[Any], opt: Any, *, weights_only: bool = False) -> None:
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


@dataclass
class Looped:
    """What the loop did: the steps taken, the reads and their seconds, where it stopped."""

    steps: int = 0
    reads: int = 0
    read_seconds: float = 0.0
    copy_seconds: float = 0.0
    stopped_at: int | None = None
    spikes: list[int] = field(default_factory=list)


def read_averaged(opt: Any, model: Any, params: Sequence[Any], read: Callable[[], list[float]],
                  spare: StateCopy) -> list[float]:
    """The held-out losses at the optimizer's averaged weights (its ``eval()`` where it has one), the
    training state saved in ``spare`` first and its tensors put back after, on every exit path."""
    spare.save(params, opt)
    averaged = hasattr(opt, "eval")
    if averaged:
        opt.eval()
    model.eval()
    try:
        return read()
    finally:
        if averaged:
            opt.train()
        model.train()
        spare.load(params, opt, weights_only=True)


def _set_lr(opt: Any, lr: float, ratios: Sequence[float]) -> None:
    for g, r in zip(opt.param_groups, ratios):
        g["lr"] = lr * r


def guarded_steps(opt: Any, model: Any, params: Sequence[Any], step: Callable[[int], float],
                  read: Callable[[], list[float]], todo: range, guard: Guard, checks: Sequence[int],
                  kept: dict[int, StateCopy], on_step: Callable[[dict[str, Any]], Any] | None = None) -> Looped:
    """Take the steps ``todo`` under ``guard``; ``kept`` maps each of the guard's kept checks to its
    copy (the start's at least) and is kept up to date. Ends with the training weights of the last
    step taken (or of the check the guard stopped at)."""
    done, recent = Looped(), deque(maxlen=16)
    ratios = [g["lr"] / opt.param_groups[0]["lr"] if opt.param_groups[0]["lr"] else 1.0 for g in opt.param_groups]
    spare = StateCopy.take(params, opt)
    at_checks, called = set(checks), False
    t0 = time.monotonic()
    for s in todo:
        opt.zero_grad(set_to_none=True)
        loss = step(s)
        if not math.isfinite(loss):
            opt.zero_grad(set_to_none=True)
            said = guard.diverged(s)
        else:
            opt.step()
            done.steps += 1
            if on_step is not None:
                on_step({"step": s, "loss": loss, "lr": float(opt.param_groups[0]["lr"]),
                         "seconds": time.monotonic() - t0})
            spike = not called and spiked(loss, recent)
            recent.append(loss)
            if s + 1 not in at_checks and not spike:
                continue
            if spike:
                done.spikes.append(s + 1)
            called = spike
            t = time.perf_counter()
            losses = read_averaged(opt, model, params, read, spare)
            done.read_seconds += time.perf_counter() - t
            done.reads += 1
            said = guard.check(s + 1, losses, why="step loss spike" if spike else "scheduled")
        if _carry_out(said, opt, params, kept, spare, s + 1, ratios, done):
            return done
        if said.action == "rollback":
            recent.clear()
    return done


def _carry_out(said: Step, opt: Any, params: Sequence[Any], kept: dict[int, StateCopy], spare: StateCopy,
               step: int, ratios: Sequence[float], done: Looped) -> bool:
    """Do what the guard said; True where the run stops."""
    t = time.perf_counter()
    if said.action == "best":
        reuse = kept.pop(said.dropped) if said.dropped is not None else None
        if reuse is not None:
            reuse.save(params, opt)
            kept[step] = reuse
        else:
            kept[step] = StateCopy.take(params, opt)
    elif said.action in ("rollback", "stop"):
        assert said.to_step is not None
        for k in [k for k in kept if k > said.to_step]:
            del kept[k]
        kept[said.to_step].load(params, opt)
        _set_lr(opt, said.lr if said.lr is not None else opt.param_groups[0]["lr"], ratios)
    done.copy_seconds += time.perf_counter() - t
    if said.action == "stop":
        done.stopped_at = step
        return True
    return False
