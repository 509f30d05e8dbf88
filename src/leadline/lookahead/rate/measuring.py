"""What the look-ahead's measurement phases share: the no-trace guard, a candidate's steps, the held-out read (torch).

:func:`no_trace` is the context every measurement phase runs in: on every exit path it puts
back the weights bit-exactly, the optimizer state (cleared where there was none), every
param group's hyperparameters (the learning rate among them), the ``.grad`` of every tensor
the optimizer holds, and the RNG states (torch CPU and CUDA, ``random``, numpy). The snapshot
it takes and the RNG states are the core's (:mod:`leadline.rate.state`).

Conventions shared by the phases (the interface a caller writes against):

- ``params``: the list of trained tensors (``requires_grad=True`` leaves).
- ``opt``: a torch optimizer over them (Adam/AdamW); the phases set its learning rate and
  call ``opt.zero_grad(set_to_none=True)`` and ``opt.step()`` themselves.
- ``train_step(step)``: the caller's forward+backward of one optimizer step's micro-batches
  (the rows of step ``step``, the same rows every time it is called with that step).
- ``held_out_losses_per_row()``: the per-row losses on fixed held-out rows (a list of floats,
  one per row, the same rows in the same order at every call).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from leadline.errors import InputError
from leadline.rate.state import Snapshot, capture_rng, restore_rng, set_lr

TrainStep = Callable[[int], Any]
HeldOut = Callable[[], Sequence[float]]


def run_steps(opt: torch.optim.Optimizer, train_step: TrainStep, start: int, stop: int,
              lr_at: Callable[[int], float], ratios: Sequence[float]) -> None:
    """Optimizer steps ``start .. stop-1``: set the rate, zero the gradients, the caller's
    forward+backward of that step, ``opt.step()``.

    Examples:
        Plain SGD on sum(w) (gradient 1) at lr(t) = t / 2 for steps 2, 3 and 4:

        >>> w = torch.zeros(2, requires_grad=True)
        >>> opt = torch.optim.SGD([w], lr=0.1)
        >>> seen = []
        >>> def train_step(t):
        ...     seen.append((t, opt.param_groups[0]["lr"]))
        ...     w.sum().backward()
        >>> run_steps(opt, train_step, 2, 5, lambda t: t / 2, [1.0])
        >>> seen, w.tolist()
        ([(2, 1.0), (3, 1.5), (4, 2.0)], [-4.5, -4.5])
    """
    for t in range(start, stop):
        set_lr(opt, lr_at(t), ratios)
        opt.zero_grad(set_to_none=True)
        train_step(t)
        opt.step()


def read_held_out(held_out: HeldOut, expected_rows: int | None = None) -> list[float]:
    """The per-row held-out losses, read without drawing from the training RNG streams.

    Non-finite losses are kept (a diverged candidate reads as such); a changing row count
    is refused because every comparison pairs the same rows.

    Examples:
        A reader that draws from torch's RNG leaves the training stream where it was:

        >>> state = torch.get_rng_state()
        >>> read_held_out(lambda: [1.0, float("nan"), float(torch.rand(1) * 0)])
        [1.0, nan, 0.0]
        >>> torch.equal(torch.get_rng_state(), state)
        True
        >>> read_held_out(lambda: [1.0, 2.0], expected_rows=3)
        Traceback (most recent call last):
            ...
        leadline.errors.InputError: held_out_losses_per_row() returned 2 losses, earlier 3; it must read the same ...
    """
    state = capture_rng()
    try:
        losses = [float(x) for x in held_out()]
    finally:
        restore_rng(state)
    if len(losses) < 2:
        raise InputError(f"held_out_losses_per_row() returned {len(losses)} losses; it must return one loss per "
                         "held-out row, at least 2 rows")
    if expected_rows is not None and len(losses) != expected_rows:
        raise InputError(f"held_out_losses_per_row() returned {len(losses)} losses, earlier {expected_rows}; it must "
                         "read the same fixed rows every time")
    return losses


def finite(losses: Sequence[float]) -> bool:
    """True when every loss is finite (no candidate diverged).

    Examples:
        >>> finite([1.0, 2.0]), finite([1.0, float("inf")])
        (True, False)
    """
    return all(math.isfinite(x) for x in losses)


def check_params(params: Sequence[torch.Tensor], opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Validate the trained tensors against the optimizer; returns them as a list.

    Examples:
        >>> w, other = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
        >>> opt = torch.optim.Adam([w])
        >>> len(check_params((w,), opt))
        1
        >>> check_params([w, other], opt)
        Traceback (most recent call last):
            ...
        leadline.errors.InputError: params[1] is not in the optimizer; build opt over the same trained tensors you ...
    """
    params = list(params)
    if not params:
        raise InputError("params is empty; pass the list of trained tensors (those with requires_grad=True)")
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    missing = [i for i, p in enumerate(params) if id(p) not in held]
    if missing:
        raise InputError(f"params[{missing[0]}] is not in the optimizer; build opt over the same trained tensors you "
                         "pass as params")
    return params


@contextmanager
def no_trace(params: Sequence[torch.Tensor], opt: torch.optim.Optimizer, *,
             place: str = "auto") -> Iterator[Snapshot]:
    """Run a phase and leave no trace of it, on every exit path (an exception included).

    Yields the snapshot of the state at entry (the origin the phase's candidates start from).

    Examples:
        A step at another rate inside the block; afterwards the weights, the rate, the
        gradient and the (empty) optimizer state are as they were:

        >>> w = torch.zeros(2, requires_grad=True)
        >>> opt = torch.optim.Adam([w], lr=1e-3)
        >>> with no_trace([w], opt):
        ...     opt.param_groups[0]["lr"] = 1.0
        ...     w.sum().backward()
        ...     opt.step()
        >>> w.tolist(), opt.param_groups[0]["lr"], w.grad, len(opt.state)
        ([0.0, 0.0], 0.001, None, 0)
    """
    origin = Snapshot.take(params, opt, place=place)
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    held = [p for g in opt.param_groups for p in g["params"]]
    grads = [p.grad for p in held]

    def restore() -> None:
        origin.load(params, opt)
        for g, saved in zip(opt.param_groups, groups):
            for k in [k for k in g if k != "params" and k not in saved]:
                del g[k]
            g.update(saved)
        for p, gr in zip(held, grads):
            p.grad = gr

    try:
        yield origin
    finally:
        restore()
