"""Snapshots, the RNG states and a loop's rate, as every loop puts them back (torch).

A :class:`Snapshot` holds copies of the **trained** tensors, their optimizer state and the
RNG states — nothing else of the model. It lives on the card when there is room for it
twice over (what the process could still allocate, under its cap if one is set, >= 2 x its
bytes) and the copy succeeds; otherwise in host memory.
An out-of-memory while placing it on the card is caught and recorded (``on_card=False``).

capture_rng / restore_rng (:mod:`leadline.rng`, the one reader of RNG states, re-exported here)
take and put back the RNG states a training step draws from; :func:`group_ratios` /
:func:`set_lr` set a rate on every param group, keeping their ratios. The guard's watch
(:mod:`leadline.rate.watch`), the run's opening race and the look-ahead's measurement phases
(:mod:`leadline.lookahead.rate.measuring`) are built on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from leadline.errors import InputError
from leadline.rng import capture_rng, restore_rng

__all__ = ["Snapshot", "capture_rng", "card_room_bytes", "group_ratios", "restore_rng", "set_lr"]


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
    cap) - allocated, read through :mod:`leadline.memory_readings` (the one place memory is read)."""
    from leadline.memory_readings import CudaMemory

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
