"""derive_for() inside a torchrun job: the pieces of a :class:`~leadline.hf.Task` that touch
the other ranks.

:class:`WorldTask` wraps the task's model in a DDP wrapper of its own (the caller's model, or
the module inside the caller's DDP, is never given a hook it keeps), registers the
:class:`~leadline.lookahead.distributed.hook.NoiseHook`, and hands derive():

- ``grad_fn()`` — a :class:`~leadline.lookahead.distributed.hook.DDPNoise` (the noise from the all-reduce);
- ``train_step_of(micro_batch, grad_accum)`` — the real DDP step: the world's step is
  micro_batch x grad_accum x W rows, rank r takes micro-batches r, r + W, ... of it, each
  rank's mean loss scaled by W t_r / T so DDP's average is the token-weighted mean over the
  world's step; the first grad_accum - 1 micro-batches under ``no_sync()``; every forward
  agreed before any rank enters the backward;
- ``held_out_losses()`` — the held-out rows split over the ranks (rank r reads rows r, r + W,
  ...), every rank's losses gathered back in the rows' order, so every rank reads the same
  list and every paired test decides the same way.

It also checks, before anything runs, that every rank holds the same trained weights and the
same tokenized rows (sha256, one all-gather each). Rows that differ are refused with one
sentence (two ranks on different data would derive two plans); trained weights that differ
(an adapter initialised without a common seed) are replaced by rank 0's for the derive, as
DDP's first broadcast would replace them for training, and put back on close. The frozen
weights are taken to be the same checkpoint on every rank: they are not hashed.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from typing import Any

from leadline.errors import InputError
from leadline.lookahead.distributed.agree import agreed
from leadline.lookahead.distributed.hook import DDPNoise, NoiseHook
from leadline.lookahead.distributed.stopline import StopLine


def unwrap(model: Any) -> Any:
    """The module inside a ``DistributedDataParallel`` wrapper; else ``model`` itself.

    Examples:
        >>> import torch
        >>> model = torch.nn.Linear(4, 2)
        >>> unwrap(model) is model
        True
    """
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def is_sharded(model: Any) -> bool:
    """True when any part of ``model`` is sharded by FSDP (``FullyShardedDataParallel`` or
    ``fully_shard``'s ``FSDPModule``): derive_for then runs :class:`ShardedWorldTask`, not
    :class:`WorldTask`.

    Examples:
        >>> import torch
        >>> is_sharded(torch.nn.Sequential(torch.nn.Linear(4, 2)))
        False
    """
    kinds = []
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        kinds.append(FullyShardedDataParallel)
    except ImportError:  # pragma: no cover - torch without FSDP
        pass
    try:
        from torch.distributed.fsdp import FSDPModule  # type: ignore[attr-defined]

        kinds.append(FSDPModule)
    except ImportError:  # pragma: no cover - torch before FSDP2
        pass
    return any(isinstance(m, tuple(kinds)) for m in model.modules()) if kinds else False


FSDP_SENTENCE = (  # WorldTask's refusal of a sharded model
    "the model is sharded by FSDP, and WorldTask wraps its model in DDP; "
    "derive_for runs a sharded model through leadline.lookahead.distributed.sharded_job.ShardedWorldTask "
    "(chosen by itself when is_sharded(model))"
)


def _no_buffer_sync() -> dict[str, bool]:
    """DDP's switch for not broadcasting buffers each forward, under its name in this torch."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    names = inspect.signature(DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in names else {"broadcast_buffers": False}


def rows_digest(rows: Any, order: Any) -> str:
    """sha256 of the tokenized rows (ids and labels) and the draw order.

    Examples:
        >>> from types import SimpleNamespace
        >>> rows = [SimpleNamespace(input_ids=[1, 2, 3], labels=[-100, 2, 3])]
        >>> len(rows_digest(rows, [0])), rows_digest(rows, [0]) == rows_digest(rows, [0, 0])
        (64, False)
    """
    h = hashlib.sha256()
    for r in rows:
        h.update(repr((list(r.input_ids), list(r.labels))).encode())
    h.update(repr(list(order)).encode())
    return h.hexdigest()


def check_same_everywhere(world: Any, what: str, digest: str, fix: str) -> None:
    """Raise the same sentence on every rank when the ranks' digests of ``what`` differ (one
    ``gather_object``).

    Examples:
        Rank 0 of two, whose peer holds another digest (the reply is rank 1's part):

        >>> class RankZeroOfTwo:
        ...     rank, world_size = 0, 2
        ...     def gather_object(self, obj): return [obj, "b"]
        >>> check_same_everywhere(RankZeroOfTwo(), "the tokenized training rows", "a", "give every rank the same data")
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: the tokenized training rows differ between ranks (rank 1 against rank 0); ...
    """
    got = world.gather_object(digest)
    odd = [r for r, d in enumerate(got) if d != got[0]]
    if odd:
        raise InputError(f"{what} differ between ranks (rank {odd[0]} against rank 0); {fix}")


def step_share(task: Any, world: Any, step: int, micro_batch: int, grad_accum: int) -> tuple[list[Any], float]:
    """This rank's micro-batches of the world's step ``step`` (rank r takes micro-batches
    r, r + W, ... of its micro_batch x grad_accum x W rows, agreed) and the world's scored tokens.

    The world's step ``step`` is the ``micro_batch x grad_accum x W`` rows of ``task.order``
    from ``step x`` that many on, wrapping around the order.

    Examples:
        Rank 1 of two, a step of 1 x 2 x 2 = 4 rows of an order of 8 (the replies stand for rank
        0 scoring as many tokens):

        >>> from types import SimpleNamespace
        >>> class RankOneOfTwo:
        ...     rank, world_size = 1, 2
        ...     def all_gather(self, values): return [list(values), list(values)]
        ...     def all_reduce(self, values, op="sum"): return [2 * v for v in values]
        >>> task = SimpleNamespace(order=list(range(8)),
        ...                        batch=lambda rows: SimpleNamespace(rows=rows, scored_tokens=10 * len(rows)))
        >>> mine, total = step_share(task, RankOneOfTwo(), 0, 1, 2)
        >>> [m.rows for m in mine], total          # micro-batches 1 and 3 of step 0: rows 1 and 3
        ([[1], [3]], 40.0)
        >>> [m.rows for m in step_share(task, RankOneOfTwo(), 1, 1, 2)[0]]
        [[5], [7]]
    """
    order, n_w, rank = task.order, world.world_size, world.rank
    per_step = micro_batch * grad_accum * n_w
    start = (step * per_step) % max(1, len(order))
    idx = [order[(start + j) % len(order)] for j in range(per_step)]
    mine = agreed(world, lambda: [task.batch(idx[(k * n_w + rank) * micro_batch:(k * n_w + rank + 1) * micro_batch])
                                  for k in range(grad_accum)], f"step {step}'s micro-batches")
    total = world.all_reduce([float(sum(m.scored_tokens for m in mine))], "sum")[0] or 1.0
    return mine, total


class WorldTask:
    """The DDP side of a :class:`~leadline.hf.Task` (see the module).

    Args:
        task: the :class:`~leadline.hf.Task`, built on the unwrapped model.
        params: the trained tensors.
        world: the :class:`~leadline.lookahead.distributed.World`.

    Raises:
        InputError: the model is sharded by FSDP (:data:`FSDP_SENTENCE`), or the ranks'
            tokenized rows differ; on every rank, before the model is wrapped.

    Examples:
        Rank 0 of two, whose peer tokenized other rows (the reply is rank 1's digest):

        >>> import torch
        >>> from types import SimpleNamespace
        >>> class RankZeroOfTwo:
        ...     rank, world_size = 0, 2
        ...     def gather_object(self, obj): return [obj, "0" * 64]
        >>> rows = [SimpleNamespace(input_ids=[1, 2, 3], labels=[-100, 2, 3])]
        >>> task = SimpleNamespace(model=torch.nn.Linear(4, 2), rows=rows, order=[0], device="cpu")
        >>> WorldTask(task, list(task.model.parameters()), RankZeroOfTwo())
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: the tokenized training rows differ between ranks (rank 1 against rank 0); ...
    """

    def __init__(self, task: Any, params: list[Any], world: Any) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel

        from leadline.lookahead.digest import tensors_digest

        if is_sharded(task.model):
            raise InputError(FSDP_SENTENCE)
        self.task, self.params, self.world = task, params, world
        self.line = StopLine(world)  # a failure inside one rank's all-reducing backward stops every rank
        self._device_before: int | None = None
        dev = torch.device(task.device)
        if dev.type == "cuda" and dev.index is not None and torch.cuda.current_device() != dev.index:
            # NCCL's object collectives use the current device: make it this rank's, until close()
            self._device_before = torch.cuda.current_device()
            torch.cuda.set_device(dev.index)
        self.notes: list[str] = []
        self._own: list[Any] | None = None
        self._noise: DDPNoise | None = None
        self.hook = NoiseHook(carry_mean=True)
        self.ddp: Any = None
        try:
            check_same_everywhere(world, "the tokenized training rows", rows_digest(task.rows, task.order),
                                  "give every rank the same data file, tokenizer and seed")
            digests = world.gather_object(tensors_digest(params))
            if any(d != digests[0] for d in digests):
                self._take_rank0_weights(digests)
            self.ddp = DistributedDataParallel(task.model, device_ids=[dev.index] if dev.type == "cuda" else None,
                                               init_sync=False, **_no_buffer_sync())
            self.ddp.register_comm_hook(None, self.hook.communicate)
            self.hook.active = False
        except BaseException:
            self.close()
            raise

    def _take_rank0_weights(self, digests: list[str]) -> None:
        """The ranks' trained weights differ (an adapter initialised without a common seed):
        derive with rank 0's, as DDP would train, and put this rank's own back in :meth:`close`."""
        import torch
        import torch.distributed as dist

        odd = [r for r, d in enumerate(digests) if d != digests[0]]
        self._own = [p.detach().to("cpu", copy=True) for p in self.params]
        with torch.no_grad():
            for p in self.params:
                dist.broadcast(p.data, src=0, group=self.world.group)
        self.notes.append(f"the trained weights differed between ranks (rank {odd[0]} against rank 0): derive used "
                          "rank 0's, "
                          "as DDP's first broadcast would train them; seed the adapter's initialisation the same on "
                          "every rank to avoid it")

    # ---- the noise ------------------------------------------------------------------------
    def grad_fn(self) -> DDPNoise:
        """derive()'s noise source: the noise read from DDP's all-reduce through the hook."""
        self._noise = DDPNoise(self.ddp, self.hook, self.task.micro_batch_of, self.world)
        return self._noise

    # ---- the rate phases --------------------------------------------------------------------
    def train_step_of(self, micro_batch: int, grad_accum: int) -> Callable[[int], float]:
        """``train_step(step)``: this rank's share of the world's step ``step``; returns the
        world's token-weighted mean loss (the same on every rank)."""
        import torch

        task, world = self.task, self.world
        n_w = world.world_size

        def train_step(step: int) -> float:
            mine, total = step_share(task, world, step, micro_batch, grad_accum)
            loss_sum = 0.0
            ddp = self.ddp  # read per step: close() drops it, and no closure keeps it alive
            for k, m in enumerate(mine):
                sync = k == grad_accum - 1
                with contextlib.nullcontext() if sync else ddp.no_sync():
                    def forward(m: Any = m, k: int = k) -> Any:
                        with torch.enable_grad():
                            loss = ddp(**m.to(task.device).model_inputs()).loss
                        if not bool(torch.isfinite(loss.detach())):
                            raise InputError(f"the loss of step {step}'s micro-batch {k} is {float(loss.detach())} "
                                             "under DDP; check these rows and the model's dtype")
                        return loss

                    loss = agreed(world, forward, f"step {step}'s forward (micro-batch {k})")
                    # the last micro-batch's backward all-reduces: a rank that fails inside it
                    # leaves the others in DDP's all-reduce, where no agreement reaches them
                    guard = self.line.guard(f"step {step}'s backward (micro-batch {k})") if sync else None
                    with guard or contextlib.nullcontext():
                        (loss * (n_w * m.scored_tokens / total)).backward()
                loss_sum += float(loss.detach()) * m.scored_tokens
                del loss
            return world.all_reduce([loss_sum], "sum")[0] / total

        return train_step

    def held_out_losses(self) -> Callable[[], list[float]]:
        """The held-out rows' losses, each rank reading every W-th row, gathered in order."""
        from leadline.corpus.losses import row_losses

        task, world = self.task, self.world
        rows = [task.rows[i] for i in task.split.held_out]
        if not rows:
            raise InputError("the split has no held_out rows; give split_rows a larger held_out")
        mine = rows[world.rank::world.world_size]

        def losses() -> list[float]:
            local = agreed(world,
                           lambda: row_losses(task.model, mine, None, task.device, pad_id=task.pad_id) if mine else [],
                           "the held-out read")
            parts = world.gather_object([float(x) for x in local])
            out: list[float] = [0.0] * len(rows)
            for r, part in enumerate(parts):
                out[r::world.world_size] = part
            return out

        return losses

    def close(self) -> None:
        """Drop the DDP wrapper and its hook; the model is left as it came."""
        import gc

        self.hook.release()
        if getattr(self, "_noise", None) is not None:
            self._noise.ddp = None
        self.ddp = None  # type: ignore[assignment]
        gc.collect()  # DDP's reducer removes its autograd hooks when the wrapper goes
        import torch

        if self._own is not None:
            with torch.no_grad():
                for p, own in zip(self.params, self._own):
                    p.copy_(own.to(p.device))
            self._own = None
        if self._device_before is not None:
            torch.cuda.set_device(self._device_before)
            self._device_before = None
