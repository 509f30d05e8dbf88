"""Candidates that are continued, not restarted, and the raced ending (torch).

A :class:`Candidate` is one rate's own run: its snapshot (trained tensors, optimizer state,
RNG states), the steps it has taken and its held-out readings. Every candidate starts from
the same origin with the same RNG state and calls ``train_step`` with the same step numbers,
so all of them see the same rows and the same dropout; advancing one to a longer horizon
continues from its snapshot.

:func:`race_ending` races the last 2h steps of a run: the constant ending (the run as it
went) against the same steps rerun from a copy with the rate falling linearly to zero, and
keeps the decayed one only when it is better by a one-sided paired t test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from leadline import stats
from leadline.rate.compare import compare
from leadline.rate.state import HeldOut, Snapshot, TrainStep, finite, read_held_out, run_steps
from leadline.rate.warmup import linear_decay_lr


@dataclass
class Candidate:
    """One rate's run, continued from one horizon to the next."""

    lr: float
    lr_at: Callable[[int], float]
    key: Any = None
    snapshot: Snapshot | None = None
    done: int = 0
    readings: dict[int, list[float]] = field(default_factory=dict)
    status: str = "running"
    """running, or why it stopped: dropped (significantly worse), diverged, unstable."""

    def advance(self, to_step: int, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer,
                train_step: TrainStep, held_out: HeldOut, origin: Snapshot, ratios: Sequence[float],
                rows: int, place: str) -> list[float]:
        """Run from this candidate's snapshot (or the origin) to ``to_step`` and read the held-out rows."""
        (self.snapshot or origin).load(params, opt)
        run_steps(opt, train_step, self.done, to_step, self.lr_at, ratios)
        self.done = to_step
        if self.snapshot is None:
            self.snapshot = Snapshot.take(params, opt, place=place)
        else:
            self.snapshot.save(params, opt)
        losses = read_held_out(held_out, rows)
        self.readings[to_step] = losses
        if not finite(losses):
            self.stop("diverged")
        return losses

    def stop(self, why: str) -> None:
        self.status = why
        self.snapshot = None

    def row(self, step: int, versus: dict[str, Any] | None = None) -> dict[str, Any]:
        """The evidence row at a horizon: lr, mean loss, its SE, the status and the test."""
        losses = self.readings[step]
        mean, se = stats.mean_se(losses) if finite(losses) else (float("inf"), float("inf"))
        out: dict[str, Any] = {"lr": self.lr, "loss": mean, "se": se, "status": self.status}
        if versus is not None:
            out["versus_best"] = versus
        return out


def race_ending(params: Sequence[torch.Tensor], opt: torch.optim.Optimizer, train_step: TrainStep,
                held_out: HeldOut, copy: Snapshot, copy_lr: float, start: int, end: int,
                ratios: Sequence[float], rows: int, *, alpha: float, place: str) -> tuple[dict[str, Any], list[float]]:
    """Keep the constant ending (the state now, at ``end``) or rerun ``start..end-1`` from ``copy``
    with lr(t) = copy_lr * (end - t) / (end - start) and keep that, whichever is better by test.

    The decayed ending is kept unless the constant one's per-row held-out losses are lower by a
    one-sided paired t test at ``alpha`` (one look), or the decayed ones are not finite; then the
    constant ending is put back bit-exactly. The decay is the null: it is the ending
    measured helping (``docs/rate.md``). On an exception the constant ending is put back and
    the error re-raised.
    Returns the evidence and the kept ending's per-row losses.
    """
    constant = read_held_out(held_out, rows)
    at_end = Snapshot.take(params, opt, place=place)
    try:
        copy.load(params, opt)
        run_steps(opt, train_step, start, end, lambda t: linear_decay_lr(t, start, end, copy_lr), ratios)
        decayed = read_held_out(held_out, rows)
    except BaseException:
        at_end.load(params, opt)
        raise
    verdict = compare(constant, decayed, alpha=alpha)
    keep = "constant" if verdict.better or not finite(decayed) else "decay"
    if keep == "constant":
        at_end.load(params, opt)
    c_mean, c_se = stats.mean_se(constant) if finite(constant) else (float("inf"), float("inf"))
    d_mean, d_se = stats.mean_se(decayed) if finite(decayed) else (float("inf"), float("inf"))
    return {
        "kept": keep, "from_step": start, "to_step": end, "lr_at_copy": copy_lr,
        "constant": {"loss": c_mean, "se": c_se}, "decay": {"loss": d_mean, "se": d_se},
        "constant_versus_decay": verdict.as_dict(), "alpha": alpha,
    }, (decayed if keep == "decay" else constant)
