"""Snapshots and the no-trace guard the rate phases share (torch).

A :class:`Snapshot` holds copies of the **trained** tensors, their optimizer state and the
RNG states — nothing else of the model. It lives on the card when there is room for it
twice over (what the process could still allocate, under its cap if one is set, >= 2 x its
bytes) and the copy succeeds; otherwise in host memory.
An out-of-memory while placing it on the card is caught and recorded (``on_card=False``).

:func:`no_trace` is the context every measurement phase runs in: on every exit path it puts
back the weights bit-exactly, the optimizer state (cleared where there was none), every
param group's hyperparameters (the learning rate among them), the ``.grad`` of every tensor
the optimizer holds, and the RNG states (torch CPU and CUDA, ``random``, numpy: :mod:`leadline.rng`).

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
from leadline.rng import capture_rng, restore_rng

TrainStep = Callable[[int], Any]
HeldOut = Callable[[], Sequence[float]]


# ---- snapshots of the trained tensors and their optimizer state ---------------------------
def _state_bytes(params: Sequence[torch.Tensor], opt: torch.optim.Optimizer) -> int:
    n = sum(p.numel() * p.element_size() for p in params)
    for p in params:
        for v in opt.state.get(p, {}).values():
            if torch.is_tensor(v):
                n += v.numel() * v.element_size()
    return n


def card_room_bytes(device: torch.device) -> int:
    """What this process could still allocate on ``device``: min(free + reserved, the process
    cap) - allocated, read through :mod:`leadline.memory.readings` (the one place memory is read)."""
    from leadline.memory.readings import CudaMemory

    mem = CudaMemory(device)
    free, _total = mem.free_total()
    cap = mem.get_cap()
    reachable = free + mem.reserved()
    return max(0, (reachable if cap is None else min(reachable, cap)) - mem.allocated())


def _place(params: Sequence[torch.Tensor], nbytes: int, place: str) -> torch.device:
    """Where a snapshot of ``nbytes`` goes: the card when it has room for it twice (under the
    process cap, if one is set), else the host."""
    dev = params[0].device if params else torch.device("cpu")
    if dev.type != "cuda" or place == "host":
        return torch.device("cpu")
    if place == "card":
        return dev
    return dev if card_room_bytes(dev) >= 2 * nbytes else torch.device("cpu")


class Snapshot:
    """Copies of the trained tensors, their optimizer state and (optionally) the RNG states.

    ``Snapshot.take(params, opt)`` copies; ``snap.load(params, opt)`` puts them back bit-exactly;
    ``snap.save(params, opt)`` copies again into the same buffers (no new allocation when the
    shapes are unchanged).

    Args:
        place: ``"auto"`` (the card when its room >= 2 x the snapshot's bytes, else the host),
            ``"card"`` or ``"host"``.

    Examples:
        Taken before a step, loaded after it: the weights and the (empty) Adam state come back.
        Tensors on the CPU are copied to the host:

        >>> w = torch.zeros(2, requires_grad=True)
        >>> opt = torch.optim.Adam([w], lr=0.1)
        >>> snap = Snapshot.take([w], opt)
        >>> w.sum().backward()
        >>> opt.step()
        >>> [round(x, 4) for x in w.tolist()], len(opt.state)
        ([-0.1, -0.1], 1)
        >>> snap.load([w], opt)
        >>> w.tolist(), len(opt.state)
        ([0.0, 0.0], 0)
        >>> snap.evidence()
        {'bytes': 8, 'device': 'cpu', 'on_card': False}
        >>> Snapshot(place="disk")
        Traceback (most recent call last):
            ...
        leadline.errors.InputError: snapshot place must be 'auto', 'card' or 'host', got 'disk'
    """

    def __init__(self, place: str = "auto") -> None:
        if place not in ("auto", "card", "host"):
            raise InputError(f"snapshot place must be 'auto', 'card' or 'host', got {place!r}")
        self.place = place
        self.params: list[torch.Tensor] = []
        self.opt_state: list[dict[str, tuple[Any, torch.device | None]]] = []
        self.rng: dict[str, Any] | None = None
        self.device: torch.device | None = None
        self.nbytes = 0

    @property
    def on_card(self) -> bool:
        return self.device is not None and self.device.type == "cuda"

    @classmethod
    def take(cls, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer, *, rng: bool = True,
             place: str = "auto") -> Snapshot:
        snap = cls(place)
        snap.save(params, opt, rng=rng)
        return snap

    def _copy(self, t: torch.Tensor, old: torch.Tensor | None) -> torch.Tensor:
        assert self.device is not None
        if old is not None and old.shape == t.shape and old.dtype == t.dtype:
            old.copy_(t)
            return old
        try:
            return t.detach().to(self.device, copy=True)
        except torch.OutOfMemoryError:
            self.device = torch.device("cpu")
            return t.detach().to(self.device, copy=True)

    @torch.no_grad()
    def save(self, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer, *, rng: bool = True) -> None:
        if self.device is None:
            self.nbytes = _state_bytes(params, opt)
            self.device = _place(params, self.nbytes, self.place)
        old_params = self.params if len(self.params) == len(params) else [None] * len(params)
        self.params = [self._copy(p, o) for p, o in zip(params, old_params)]
        old_states = self.opt_state if len(self.opt_state) == len(params) else [{} for _ in params]
        states: list[dict[str, tuple[Any, torch.device | None]]] = []
        for p, old in zip(params, old_states):
            entry: dict[str, tuple[Any, torch.device | None]] = {}
            for k, v in opt.state.get(p, {}).items():
                if torch.is_tensor(v):
                    prev = old.get(k, (None, None))[0]
                    entry[k] = (self._copy(v, prev if torch.is_tensor(prev) else None), v.device)
                else:
                    entry[k] = (v, None)
            states.append(entry)
        self.opt_state = states
        self.rng = capture_rng() if rng else None

    @torch.no_grad()
    def load(self, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer, *, rng: bool = True) -> None:
        if len(params) != len(self.params):
            raise InputError(f"this snapshot holds {len(self.params)} tensors, not {len(params)}; load it into the "
                             "params it was taken from")
        for p, s in zip(params, self.params):
            p.copy_(s)
        for p, entry in zip(params, self.opt_state):
            if not entry:
                opt.state.pop(p, None)
                continue
            live = opt.state.get(p)
            same = live is not None and live.keys() == entry.keys() and all(
                (torch.is_tensor(live[k]) and live[k].shape == v.shape and live[k].device == dev) if dev is not None
                else True
                for k, (v, dev) in entry.items()
            )
            if same:
                assert live is not None
                for k, (v, dev) in entry.items():
                    if dev is not None:
                        live[k].copy_(v)
                    else:
                        live[k] = v
            else:
                opt.state[p] = {k: (v.to(dev, copy=True) if dev is not None else v) for k, (v, dev) in entry.items()}
        if rng and self.rng is not None:
            restore_rng(self.rng)

    def evidence(self) -> dict[str, Any]:
        return {"bytes": self.nbytes, "device": str(self.device), "on_card": self.on_card}


# ---- the rate, the steps, the held-out reading -------------------------------------------
def group_ratios(opt: torch.optim.Optimizer) -> list[float]:
    """Each param group's learning rate relative to the first group's (1.0 when it is 0).

    Examples:
        >>> w, b = torch.zeros(2, requires_grad=True), torch.zeros(1, requires_grad=True)
        >>> opt = torch.optim.Adam([{"params": [w]}, {"params": [b], "lr": 1e-4}], lr=1e-3)
        >>> group_ratios(opt)
        [1.0, 0.1]
    """
    lrs = [float(g["lr"]) for g in opt.param_groups]
    first = lrs[0]
    return [lr / first if first > 0 else 1.0 for lr in lrs]


def set_lr(opt: torch.optim.Optimizer, lr: float, ratios: Sequence[float]) -> None:
    """Set the rate: the first group gets ``lr``, the others keep their ratio to it.

    Examples:
        >>> w, b = torch.zeros(2, requires_grad=True), torch.zeros(1, requires_grad=True)
        >>> opt = torch.optim.Adam([{"params": [w]}, {"params": [b], "lr": 1e-4}], lr=1e-3)
        >>> set_lr(opt, 2e-3, group_ratios(opt))
        >>> [g["lr"] for g in opt.param_groups]
        [0.002, 0.0002]
    """
    for g, r in zip(opt.param_groups, ratios):
        g["lr"] = lr * r


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
