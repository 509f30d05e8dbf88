"""This process's place in a ``torch.distributed`` job, and the few collectives leadline needs,
on host numbers.

A :class:`World` is this process's place in a job of more than one process (launched by
torchrun, accelerate or ``torch.multiprocessing``): its rank, the world size, the backend, and
the device whose tensors the backend moves (``cuda:N`` for NCCL, the CPU for gloo). Its methods
reduce, gather and broadcast plain Python numbers and objects, so the callers (derive's phases,
the agreement, the plan broadcast) never build tensors for it. :func:`current_world` says
whether this process is in a job; joining one is :mod:`leadline.lookahead.distributed`'s.

Every method is a collective: every rank must call it, in the same order. leadline only calls
them where every rank's control flow is the same by construction (see docs/distributed.md).

``import leadline.lookahead.world`` loads no torch; :func:`current_world` reads torch only when it is
already imported, so a process that never touched torch is never "in a job".
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from leadline.errors import InputError

__all__ = ["OPS", "World", "current_world"]

OPS = ("sum", "min", "max")
"""The reductions :meth:`World.all_reduce` takes."""


@dataclass(frozen=True)
class World:
    """This process's place in a job of ``world_size`` > 1 processes.

    Attributes:
        rank: 0 .. world_size - 1; rank 0 writes files and prints.
        world_size: the processes in the job (GPUs under DDP).
        local_rank: the rank on this host (the CUDA device index under torchrun).
        backend: ``nccl`` or ``gloo`` (what ``torch.distributed.get_backend()`` says).
        device: where the backend's tensors live: ``cuda:N`` for NCCL, ``cpu`` otherwise.
        group: the process group (None: the default group).

    Examples:
        The record is plain data (inside a job :func:`current_world` builds it); every method
        but :attr:`is_main` and :meth:`synchronize` is a collective:

        >>> w = World(rank=1, world_size=2, local_rank=1, backend="gloo", device="cpu")
        >>> w.is_main, w.group
        (False, None)
        >>> w.synchronize()                     # nothing to wait for on the CPU
        >>> w.all_reduce([1.0, 2.0], op="mean")  # refused before any collective
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: World.all_reduce(op='mean') is not one of sum, min, max
    """

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: str
    group: Any = None

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes the plan and prints."""
        return self.rank == 0

    # ---- numbers ----------------------------------------------------------------------------
    def _tensor(self, values: Sequence[float]) -> Any:
        import torch

        return torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)

    def all_reduce(self, values: Sequence[float], op: str = "sum") -> list[float]:
        """Element-wise ``op`` (one of :data:`OPS`) of ``values`` over the ranks, in float64.

        Every rank passes as many values and gets the same list back: on two ranks holding
        ``[1, 5]`` and ``[3, 2]``, ``sum`` gives ``[4.0, 7.0]`` and ``max`` ``[3.0, 5.0]``.
        An ``op`` outside :data:`OPS` is refused before the collective (see the class).
        """
        import torch.distributed as dist

        if op not in OPS:
            raise InputError(f"World.all_reduce(op={op!r}) is not one of {', '.join(OPS)}")
        t = self._tensor(values)
        red = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op]
        dist.all_reduce(t, op=red, group=self.group)
        return [float(x) for x in t.cpu().tolist()]

    def all_min(self, value: float) -> float:
        """The least ``value`` over the ranks."""
        return self.all_reduce([value], "min")[0]

    def all_max(self, value: float) -> float:
        """The largest ``value`` over the ranks."""
        return self.all_reduce([value], "max")[0]

    def all_gather(self, values: Sequence[float]) -> list[list[float]]:
        """Every rank's ``values`` (the same length on every rank), indexed by rank."""
        import torch
        import torch.distributed as dist

        t = self._tensor(values)
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t, group=self.group)
        return [[float(x) for x in o.cpu().tolist()] for o in out]

    # ---- objects -----------------------------------------------------------------------------
    def gather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, indexed by rank."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s picklable ``obj`` on every rank."""
        import torch.distributed as dist

        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]

    def barrier(self) -> None:
        """Wait until every rank reaches this call."""
        import torch.distributed as dist

        dist.barrier(group=self.group)

    def synchronize(self) -> None:
        """Wait for this rank's device (a no-op on the CPU)."""
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(self.device)


def current_world() -> World | None:
    """This process's :class:`World`, or None outside a ``torch.distributed`` job of more than
    one process (no torch loaded, no process group initialised, or a world of one).

    The device is ``cuda:LOCAL_RANK`` (or the current CUDA device) under NCCL with a GPU,
    ``cpu`` otherwise. It never starts a process group: :func:`join_job` does.

    Examples:
        A process that started no process group is not in a job:

        >>> current_world() is None
        True
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        return None
    size = dist.get_world_size()
    if size < 2:
        return None
    backend = str(dist.get_backend())
    local = int(os.environ.get("LOCAL_RANK", dist.get_rank() % max(1, torch.cuda.device_count() or 1)))
    if "nccl" in backend and torch.cuda.is_available():
        device = f"cuda:{local if 'LOCAL_RANK' in os.environ else torch.cuda.current_device()}"
    else:
        device = "cpu"
    return World(rank=dist.get_rank(), world_size=size, local_rank=local, backend=backend, device=device)
