"""The first safe step (alpha1): a line search along Adam's own first update.

Adam's first update, with bias correction, is u = m1/(sqrt(v1) + eps) = g/(|g| + eps) per entry
(Kingma & Ba 2015, Algorithm 1 at t = 1) — a sign-like step of size lr whatever the gradient's
scale — plus, for AdamW, the decoupled decay lr * wd * W (Loshchilov & Hutter 2019). It is
linear in lr, so the optimizer's own first step at lr = 1 from an empty state gives the
direction exactly: u = W0 - W1. The walk sets W = W0 - lr * u for a geometric ladder of lr,
reads the mean held-out loss, and stops where it stops falling; a golden-section search in
log(lr) inside that bracket (Kiefer 1953) refines it, and stops early where its two inner points'
held-out losses differ by less than their paired standard error: the search can no longer tell
which side the minimum is on, so a further step would move alpha1 by less than its own error.
alpha1 is the step with the lowest held-out loss along the line. The weights are restored
bit-exactly.

The search logic (:func:`walk`, :func:`golden_section_log`) is pure and tested on known curves.

References: Kingma & Ba 2015, "Adam", <https://arxiv.org/abs/1412.6980>; Loshchilov & Hutter
2019, "Decoupled Weight Decay Regularization", <https://arxiv.org/abs/1711.05101>; Kiefer 1953,
"Sequential minimax search for a maximum".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from leadline import stats
from leadline.errors import InputError
from leadline.plan import Value
from leadline.run.precision import RESOLUTION

INV_PHI = (math.sqrt(5.0) - 1.0) / 2.0  # 0.618...


# ---- the pure search -------------------------------------------------------------------
@dataclass
class Walk:
    """The geometric walk: every (lr, loss) read, and the bracket around the fall's end.

    Examples:
        >>> w = walk(lambda lr: (math.log10(lr) + 3) ** 2, base=16.0)
        >>> w.fell, w.bracket, len(w.points)
        (True, (0.0004096, 0.0016384, 0.0065536), 9)
    """

    points: list[tuple[float, float]] = field(default_factory=list)
    bracket: tuple[float, float, float] | None = None
    """(lo, mid, hi) with loss(mid) below both sides' — None when the loss never turned up."""
    fell: bool = False
    """Some step lowered the loss below the base."""


def walk(f: Callable[[float], float], base: float, *, start: float = 1e-7, factor: float = 4.0, max_lr: float = 1.0,
         resolution: float = RESOLUTION) -> Walk:
    """Walk lr = start * factor^k upward until the loss, having fallen below ``base``, rises.

    A fall counts when the loss is below ``base`` by more than ``resolution x |base|``, a rise
    when it is above the previous point by more than that. A non-finite loss counts as +inf (a
    rise). Returns the points and the bracket (previous, lowest, first rise); the first point's
    lower side is ``start / factor``.

    Examples:
        A loss with its minimum at lr = 1e-3 is bracketed by the x4 ladder around 1.6e-3; a
        loss that never falls walks the whole ladder up to ``max_lr`` and brackets nothing:

        >>> walk(lambda lr: (math.log10(lr) + 3) ** 2, base=16.0).bracket
        (0.0004096, 0.0016384, 0.0065536)
        >>> w = walk(lambda lr: 5.0, base=5.0)
        >>> w.fell, w.bracket, w.points[-1]
        (False, None, (0.4194304, 5.0))
        >>> walk(lambda lr: 5.0, base=5.0, start=2.0)
        Traceback (most recent call last):
            ...
        leadline.errors.InputError: the walk needs 0 < start < max_lr and factor > 1, got start=2.0, max_lr=1.0, ...
    """
    if not (0 < start < max_lr) or factor <= 1.0:
        raise InputError(f"the walk needs 0 < start < max_lr and factor > 1, got start={start}, max_lr={max_lr}, "
                         f"factor={factor}")
    w = Walk()
    lr = start
    grain = resolution * abs(base) if math.isfinite(base) else 0.0
    while lr <= max_lr * (1 + 1e-12):
        loss = f(lr)
        loss = loss if math.isfinite(loss) else math.inf
        w.points.append((lr, loss))
        if len(w.points) >= 2:
            (lr_prev, loss_prev) = w.points[-2]
            if loss > loss_prev + grain and loss_prev < base - grain:
                lo = w.points[-3][0] if len(w.points) >= 3 else lr_prev / factor
                w.bracket = (lo, lr_prev, lr)
                w.fell = True
                return w
        if loss < base - grain:
            w.fell = True
        lr *= factor
    return w


def golden_section_log(f: Callable[[float], float], lo: float, hi: float, *, rel_tol: float = 0.05,
                       max_evals: int = 30,
                       resolved: Callable[[float, float], bool] | None = None) -> list[tuple[float, float]]:
    """Golden-section search for the minimum of ``f`` on [lo, hi] in log(lr).

    Stops when hi/lo < 1 + ``rel_tol``, or when ``resolved(c, d)`` says the two inner points'
    losses can no longer be told apart. Returns every (lr, loss) evaluated; the caller takes the
    lowest (together with the walk's points).

    Examples:
        >>> pts = golden_section_log(lambda lr: (math.log10(lr) + 3) ** 2, 1e-5, 1e-1, rel_tol=0.05)
        >>> round(min(pts, key=lambda p: p[1])[0], 5), len(pts)
        (0.001, 13)
        >>> len(golden_section_log(lambda lr: (math.log10(lr) + 3) ** 2, 1e-5, 1e-1,
        ...                        resolved=lambda c, d: abs(math.log10(c / d)) > 0.5))
        4
    """
    if not 0 < lo < hi:
        raise InputError(f"golden_section_log needs 0 < lo < hi, got {lo}, {hi}")
    a, b = math.log(lo), math.log(hi)
    tol = math.log1p(rel_tol)
    c, d = b - INV_PHI * (b - a), a + INV_PHI * (b - a)
    seen: list[tuple[float, float]] = []

    def ev(u: float) -> float:
        y = f(math.exp(u))
        y = y if math.isfinite(y) else math.inf
        seen.append((math.exp(u), y))
        return y

    fc, fd = ev(c), ev(d)
    while b - a > tol and len(seen) < max_evals:
        if resolved is not None and not resolved(math.exp(c), math.exp(d)):
            break
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - INV_PHI * (b - a)
            fc = ev(c)
        else:
            a, c, fc = c, d, fd
            d = a + INV_PHI * (b - a)
            fd = ev(d)
    return seen


# ---- the result --------------------------------------------------------------------------
@dataclass
class FirstStep:
    """The first safe step and the walk that found it.

    Attributes:
        alpha1: the step with the lowest held-out loss along Adam's first update; None when no
            step lowered the loss (``found`` is False).
        base_loss: the mean held-out loss before the step.
        loss: the mean held-out loss at alpha1.
        walk: every (lr, loss) read, walk and refinement, in order.
        versus_base: the paired test of the loss at alpha1 against the base (same rows).
        stopped_because: why the walk ended.

    Examples:
        >>> fs = FirstStep(alpha1=1e-3, found=True, base_loss=2.0, loss=1.5, walk=[{"lr": 1e-3, "loss": 1.5}],
        ...                held_out_rows=64, versus_base={}, stopped_because="bracketed", seconds=0.1)
        >>> v = fs.as_values()["alpha1"]
        >>> v.value, v.kind
        (0.001, 'measured')
        >>> v.source
        "the step along Adam's first update where the held-out loss on 64 rows stops falling (2 -> 1.5; bracketed)"
    """

    alpha1: float | None
    found: bool
    base_loss: float
    loss: float
    walk: list[dict[str, float]]
    held_out_rows: int
    versus_base: dict[str, Any]
    stopped_because: str
    seconds: float
    at_alpha1: Any = None
    """What ``at_alpha1=`` returned, read with the weights at alpha1 (e.g. the noise scale past
    the answer's format); None when not asked or not found."""

    def evidence(self) -> dict[str, Any]:
        return {"plot": "first_step", "walk": self.walk, "base_loss": self.base_loss, "alpha1": self.alpha1,
                "loss": self.loss, "held_out_rows": self.held_out_rows, "versus_base": self.versus_base,
                "stopped_because": self.stopped_because}

    def as_values(self) -> dict[str, Value]:
        """``alpha1`` (measured), with the walk as its evidence."""
        if not self.found:
            src = (f"not found: the held-out loss on {self.held_out_rows} rows did not fall along Adam's first update "
                   f"({self.stopped_because})")
        else:
            src = (f"the step along Adam's first update where the held-out loss on {self.held_out_rows} rows stops "
                   f"falling ({self.base_loss:.4g} -> {self.loss:.4g}; {self.stopped_because})")
        return {"alpha1": Value(self.alpha1, "measured", src, evidence=self.evidence(), seconds=self.seconds,
                                unit="per step")}


# ---- the driver (torch) ------------------------------------------------------------------
def measure_first_step(params: Sequence[Any], opt: Any, train_step: Callable[[int], Any],
                       held_out_losses_per_row: Callable[[], Sequence[float]], *, step: int = 0,
                       start: float = 1e-7, factor: float = 4.0, max_lr: float = 1.0, rel_tol: float = 0.05,
                       place: str = "auto", resolution: float = RESOLUTION,
                       at_alpha1: Callable[[], Any] | None = None) -> FirstStep:
    """Measure alpha1: walk the trained tensors along the optimizer's own first update.

    Args:
        params: the trained tensors.
        opt: the optimizer over them (Adam/AdamW; any optimizer whose first step from an empty
            state is linear in lr). Its state is cleared for the measurement and restored.
        train_step: ``train_step(step)`` runs the forward+backward of one optimizer step's
            micro-batches (the gradient the first update is taken from).
        held_out_losses_per_row: per-row losses on fixed held-out rows.
        step: which step's rows give the gradient.
        start, factor, max_lr: the ladder lr = start * factor^k, up to max_lr.
        rel_tol: the refinement stops when the bracket is narrower than this ratio.
        place: where the copies live (``"auto"``: on the card when there is room).
        resolution: the share of the base loss below which a change is rounding.
        at_alpha1: called (with gradients enabled) while the weights sit at alpha1, before
            they are restored; its result is ``FirstStep.at_alpha1``. derive() reads the noise
            scale there: at step 0 every row agrees on the answer's format, and the first
            step is the one that learns it.

    Returns:
        :class:`FirstStep`. Weights, optimizer state, learning rates, gradients and RNG states
        are bit-identical afterwards, also when ``train_step`` or the reader raises.

    Examples:
        Four weights trained from 0 toward 0.01, one held-out row each. Adam's first update
        moves every entry by lr, so the held-out loss along it is lowest at lr = 0.01:

        >>> import torch
        >>> w = torch.zeros(4, requires_grad=True)
        >>> opt = torch.optim.Adam([w], lr=1e-3)
        >>> train_step = lambda step: ((w - 0.01) ** 2).mean().backward()
        >>> held_out = lambda: ((w - 0.01) ** 2).tolist()
        >>> fs = measure_first_step([w], opt, train_step, held_out)
        >>> fs.found, round(fs.alpha1, 4)
        (True, 0.01)
        >>> w.tolist(), opt.param_groups[0]["lr"], len(opt.state)
        ([0.0, 0.0, 0.0, 0.0], 0.001, 0)
    """
    import torch

    from leadline.lookahead.rate.measuring import check_params, no_trace

    t0 = time.perf_counter()
    params = check_params(params, opt)
    with no_trace(params, opt, place=place) as origin, torch.no_grad():
        line = _Line.of(params, opt, train_step, step, origin.params, held_out_losses_per_row)
        w = walk(line.loss_at, line.base, start=start, factor=factor, max_lr=max_lr, resolution=resolution)
        points, why = _refined(line, w, start=start, factor=factor, max_lr=max_lr, rel_tol=rel_tol)
        best_lr, best_loss = min(points, key=lambda p: (p[1], p[0]))
        found = w.fell and best_loss < line.base
        extra = line.call_at(best_lr, at_alpha1) if found and at_alpha1 is not None else None
    return _first_step(line, points, best_lr if found else None, best_loss, why, time.perf_counter() - t0, extra)


class _Line:
    """The held-out loss along Adam's first update from the origin: :meth:`loss_at` puts the
    weights at origin - lr x update and reads the held-out rows, each read kept by its rate."""

    def __init__(self, params: Sequence[Any], origin: Sequence[Any], direction: list[Any] | None,
                 held_out: Callable[[], Sequence[float]], base_rows: list[float]) -> None:
        self.params, self.origin, self.direction, self.held_out = params, origin, direction, held_out
        self.base_rows = base_rows
        self.base = math.fsum(base_rows) / len(base_rows)
        self.rows_at: dict[float, list[float]] = {}

    @classmethod
    def of(cls, params: Sequence[Any], opt: Any, train_step: Callable[[int], Any], step: int, origin: Sequence[Any],
           held_out: Callable[[], Sequence[float]]) -> _Line:
        """The line from the origin: the held-out rows read there (finite, or refused), then the
        first update of a step at lr 1 from a cleared optimizer state."""
        import torch

        from leadline.lookahead.rate.measuring import finite, read_held_out

        base_rows = read_held_out(held_out)
        if not finite(base_rows):
            raise InputError("held_out_losses_per_row() returned a non-finite loss before any step; check the held-out "
                             "rows and the model")
        opt.state.clear()
        for g in opt.param_groups:
            g["lr"] = 1.0
        opt.zero_grad(set_to_none=True)
        with torch.enable_grad():
            train_step(step)
        opt.step()
        direction = [torch.sub(w0.to(p.device), p).to(w0.device) for w0, p in zip(origin, params)]
        opt.state.clear()
        opt.zero_grad(set_to_none=True)
        return cls(params, origin, direction, held_out, base_rows)

    def move_to(self, lr: float) -> None:
        """The weights at origin - ``lr`` x the update."""
        import torch

        assert self.direction is not None
        for p, w0, u in zip(self.params, self.origin, self.direction):
            p.copy_(torch.add(w0.to(p.device), u.to(p.device), alpha=-lr))

    def loss_at(self, lr: float) -> float:
        """The mean held-out loss at ``lr`` along the line (inf where a row's loss is not finite)."""
        from leadline.lookahead.rate.measuring import finite, read_held_out

        self.move_to(lr)
        rows = read_held_out(self.held_out, len(self.base_rows))
        self.rows_at[lr] = rows
        return math.fsum(rows) / len(rows) if finite(rows) else math.inf

    def call_at(self, lr: float, fn: Callable[[], Any]) -> Any:
        """``fn()`` with gradients on, the weights at ``lr`` along the line (the update's memory let go first)."""
        import torch

        self.move_to(lr)
        self.direction = None
        with torch.enable_grad():
            return fn()


def _refined(line: _Line, w: Walk, *, start: float, factor: float, max_lr: float,
             rel_tol: float) -> tuple[list[tuple[float, float]], str]:
    """The walk's points, and a bracket's refined by golden section until its inner points read
    within their standard error (or to ``rel_tol``); with the sentence of why the search stopped."""
    points = list(w.points)
    if w.bracket is not None:
        tied: list[float] = []

        def resolved(c: float, d: float) -> bool:  # the inner points differ by more than their SE
            if abs(stats.paired_difference(line.rows_at[c], line.rows_at[d]).t) >= 1.0:
                return True
            tied.append(max(c, d) / min(c, d))
            return False

        points += golden_section_log(line.loss_at, w.bracket[0], w.bracket[2], rel_tol=rel_tol, resolved=resolved)
        why = (f"bracketed x{factor:g} at {w.bracket[1]:.3g}, refined by golden section "
               + (f"until its inner points, x{tied[0]:.3g} apart, read within their standard error" if tied
                  else f"to {rel_tol:.0%}"))
    elif w.fell:
        why = f"the loss still fell at max_lr = {max_lr:g}: alpha1 is the largest step walked"
    else:
        why = f"no step from {start:g} to {max_lr:g} lowered the held-out loss"
    return points, why


def _first_step(line: _Line, points: list[tuple[float, float]], alpha1: float | None, best_loss: float, why: str,
                seconds: float, extra: Any) -> FirstStep:
    """The result: alpha1 (None where no step lowered the loss) against the origin's loss, and the walk."""
    found = alpha1 is not None
    versus = stats.paired_difference(line.rows_at[alpha1], line.base_rows).as_dict() if found else {}
    return FirstStep(
        alpha1=alpha1, found=found, base_loss=line.base, loss=best_loss if found else line.base,
        walk=[{"lr": lr, "loss": loss} for lr, loss in points], held_out_rows=len(line.base_rows),
        versus_base=versus, stopped_because=why, seconds=seconds, at_alpha1=extra,
    )
