"""Candidates that are continued, not restarted, and the raced ending (torch).

A :class:`Candidate` is one rate's own run: its snapshot (trained tensors, optimizer state,
RNG states), the steps it has taken and its held-out readings. Every candidate starts from
the same origin with the same RNG state and calls ``train_step`` with the same step numbers,
so all of them see the same rows and the same dropout; advancing one to a longer horizon
continues from its snapshot.

:func:`race_ending` races a run's ending: the constant ending (the run as it went) against
its last steps rerun from one or more copies with the rate falling linearly to zero (the last
2h and the last half, by default), and keeps the best decayed one unless the constant one is
better by a one-sided paired t test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from leadline import stats
from leadline.lookahead.rate.measuring import HeldOut, TrainStep, finite, read_held_out, run_steps
from leadline.lookahead.rate.warmup import linear_decay_lr
from leadline.rate.compare import compare
from leadline.rate.state import Snapshot


@dataclass
class Candidate:
    """One rate's run, continued from one horizon to the next.

    Examples:
        Four weights trained from 0 toward 0.01 at 0.0025: run to step 2, then continued (not
        restarted) from its own snapshot to step 4, where it reaches the target:

        >>> from leadline.rate.state import Snapshot
        >>> w = torch.zeros(4, requires_grad=True)
        >>> opt = torch.optim.Adam([w])
        >>> train_step = lambda step: ((w - 0.01) ** 2).mean().backward()
        >>> held_out = lambda: ((w - 0.01) ** 2).tolist()
        >>> origin = Snapshot.take([w], opt)
        >>> c = Candidate(0.0025, lambda t: 0.0025)
        >>> losses = c.advance(2, [w], opt, train_step, held_out, origin, [1.0], 4, "auto")
        >>> origin.load([w], opt)  # another candidate's turn would start here
        >>> losses = c.advance(4, [w], opt, train_step, held_out, origin, [1.0], 4, "auto")
        >>> c.done, c.status, [round(x, 4) for x in w.tolist()]
        (4, 'running', [0.0095, 0.0095, 0.0095, 0.0095])
    """

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
        mean, se = _mean_se(losses)
        out: dict[str, Any] = {"lr": self.lr, "loss": mean, "se": se, "status": self.status}
        if versus is not None:
            out["versus_best"] = versus
        return out


@dataclass
class EndingCopy:
    """A copy of the run taken for the raced ending: the state at ``start`` and the rate then.

    Examples:
        >>> from leadline.rate.state import Snapshot
        >>> w = torch.zeros(2, requires_grad=True)
        >>> copy = EndingCopy(Snapshot.take([w], torch.optim.Adam([w])), lr=1e-3, start=8)
        >>> copy.lr, copy.start
        (0.001, 8)
    """

    snapshot: Snapshot
    lr: float
    start: int


def race_ending(params: Sequence[torch.Tensor], opt: torch.optim.Optimizer, train_step: TrainStep,
                held_out: HeldOut, copies: Sequence[EndingCopy], end: int,
                ratios: Sequence[float], rows: int, *, alpha: float, place: str) -> tuple[dict[str, Any], list[float]]:
    """Keep the constant ending (the state now, at ``end``) or the best of the decayed endings:
    each copy's steps ``start..end-1`` rerun from it with lr(t) = copy.lr * (end - t) / (end - start).

    The decayed endings are ranked by their mean held-out loss; the best of them is kept unless
    the constant one's per-row held-out losses are lower by a one-sided paired t test at
    ``alpha`` (one look), or its losses are not finite; then the constant ending is put back
    bit-exactly. The decay is the null: it is the ending measured helping (``docs/rate.md``).
    Each copy's snapshot holds its decayed ending once it has run (no other memory is taken).
    On an exception the constant ending is put back and the error re-raised.
    Returns the evidence (``decays``: every length raced) and the kept ending's per-row losses.

    Examples:
        Four weights trained from 0 toward 0.01 at 0.0025 overshoot it by step 8; the copy at
        step 2 reruns steps 2-7 with the rate falling to zero, lands nearer, and is kept:

        >>> from leadline.lookahead.rate.measuring import run_steps
        >>> from leadline.rate.state import Snapshot
        >>> w = torch.zeros(4, requires_grad=True)
        >>> opt = torch.optim.Adam([w])
        >>> train_step = lambda step: ((w - 0.01) ** 2).mean().backward()
        >>> held_out = lambda: ((w - 0.01) ** 2).tolist()
        >>> run_steps(opt, train_step, 0, 2, lambda t: 0.0025, [1.0])
        >>> copy = EndingCopy(Snapshot.take([w], opt), 0.0025, start=2)
        >>> run_steps(opt, train_step, 2, 8, lambda t: 0.0025, [1.0])
        >>> round(w[0].item(), 4)
        0.0144
        >>> ending, losses = race_ending([w], opt, train_step, held_out, [copy], 8, [1.0], 4, alpha=0.05, place="auto")
        >>> ending["kept"], ending["from_step"], round(w[0].item(), 4)
        ('decay', 2, 0.0118)
    """
    if not copies:
        raise ValueError("race_ending needs at least one copy")
    constant = read_held_out(held_out, rows)
    at_end = Snapshot.take(params, opt, place=place)
    try:
        read = _endings_read(params, opt, train_step, held_out, copies, end, ratios, rows)
    except BaseException:
        at_end.load(params, opt)
        raise
    best, losses = min(read, key=lambda r: _mean(r[1]))
    verdict = compare(constant, losses, alpha=alpha)
    keep = "constant" if verdict.better or not finite(losses) else "decay"
    if keep == "decay":
        best.snapshot.load(params, opt)
    else:
        at_end.load(params, opt)
    evidence = _ending_evidence(keep, best, end, constant, losses, verdict, alpha, read)
    return evidence, (constant if keep == "constant" else losses)


def _endings_read(params: Sequence[torch.Tensor], opt: torch.optim.Optimizer, train_step: TrainStep,
                  held_out: HeldOut, copies: Sequence[EndingCopy], end: int, ratios: Sequence[float],
                  rows: int) -> list[tuple[EndingCopy, list[float]]]:
    """Every copy's decayed ending run and read, the shortest first (each copy's snapshot then holds
    its ending): each copy and its per-row losses."""
    read: list[tuple[EndingCopy, list[float]]] = []
    for copy in sorted(copies, key=lambda c: -c.start):  # the shortest ending first
        copy.snapshot.load(params, opt)
        run_steps(opt, train_step, copy.start, end, lambda t, c=copy: linear_decay_lr(t, c.start, end, c.lr),
                  ratios)
        read.append((copy, read_held_out(held_out, rows)))
        copy.snapshot.save(params, opt)  # the copy now holds this decayed ending
    return read


def _ending_evidence(keep: str, best: Any, end: int, constant: list[float], losses: list[float],
                     verdict: Any, alpha: float, read: list[tuple[EndingCopy, list[float]]]) -> dict[str, Any]:
    """The raced ending's evidence: the one kept, the constant against the best, every length raced."""
    c_mean, c_se = _mean_se(constant)
    d_mean, d_se = _mean_se(losses)
    return {
        "kept": keep, "from_step": best.start, "to_step": end, "lr_at_copy": getattr(best, "lr", None),
        "constant": {"loss": c_mean, "se": c_se}, "decay": {"loss": d_mean, "se": d_se},
        "constant_versus_decay": verdict.as_dict(), "alpha": alpha,
        "decays": [{"from_step": c.start, "steps": end - c.start, "lr_at_copy": c.lr,
                    "loss": _mean_se(ls)[0], "se": _mean_se(ls)[1]} for c, ls in read],
    }


def ending_why(ending: dict[str, Any]) -> str:
    """The sentence for a raced ending's record: what was rerun and what was kept.

    Examples:
        >>> ending_why({"kept": "decay", "from_step": 50, "to_step": 100})
        'the last 50 steps rerun from a copy with the rate falling linearly to zero: kept: the constant ending was ...'
    """
    decays = ending.get("decays") or [{"steps": ending["to_step"] - ending["from_step"]}]
    if len(decays) == 1:
        rerun = f"the last {decays[0]['steps']} steps rerun from a copy with the rate falling linearly to zero"
    else:
        lengths = " and ".join(f"the last {d['steps']}" for d in decays)
        rerun = (f"{lengths} steps each rerun from a copy with the rate falling linearly to zero; the decay over the "
                 f"last {ending['to_step'] - ending['from_step']} read lower on the held-out rows ("
                 + " against ".join(f"{d['loss']:.4f}" for d in sorted(decays, key=lambda d: d["loss"])) + ")")
    return rerun + (": kept: the constant ending was not better by a one-sided paired t test"
                    if ending["kept"] == "decay" else ": the constant ending kept: better by a one-sided paired t test")


def _mean(losses: list[float]) -> float:
    return _mean_se(losses)[0]


def _mean_se(losses: list[float]) -> tuple[float, float]:
    return stats.mean_se(losses) if finite(losses) else (float("inf"), float("inf"))
