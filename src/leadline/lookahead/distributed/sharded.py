"""The noise-scale probe on a sharded model (FSDP): the single-process probe's estimate, exactly.

The probe (:func:`leadline.lookahead.noise.measure_noise_scale`) reduces each draw to three sums over the
gradient: |g - M|², (g - M)·M and |M|² (:class:`~leadline.lookahead.noise._stream.MeanStream`, M the
running token-weighted mean). Each is a sum over coordinates. So when the gradient is sharded
across ranks, each rank sums its own shard and one all-reduce of three numbers gives the whole
gradient's. No rank holds more than its shard of M, and no gradient is gathered.

:class:`ShardedGradFn` is the ``grad_fn`` for it. Draw i is the world's micro-batches
i W .. i W + W - 1, rank r running micro-batch i W + r through the sharded model. Each rank's
mean loss is scaled by W t_r / T (t_r its scored tokens, T the world's), so the gradient FSDP's
reduce-scatter leaves (the mean over ranks) is the token-weighted mean over the world's scored
tokens. That is the gradient the single-process probe draws for those rows taken as one
micro-batch. Given the same micro-batches, the estimate is the single-process probe's, to float
rounding (``tests/test_distributed_job.py``, FSDP over 2 gloo ranks against an unsharded copy).

``derive_for`` uses it as the noise phase of a sharded model
(:class:`~leadline.lookahead.distributed.sharded_job.ShardedWorldTask`); it is also the noise phase for a
loop of your own (``derive(pieces=Pieces(gradients=...))``) or a probe by hand::

    with ShardedGradFn(fsdp_model, micro_batch_of) as grad_fn:
        noise = measure_noise_scale(grad_fn, budget_s=60)   # on every rank

The draws run the sharded model's backward, so its ``.grad`` is overwritten during the probe.
What the trained tensors held before is put back on exit, by any path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from leadline.errors import InputError
from leadline.lookahead.noise.gradfn import batch_inputs


def _local(t: Any) -> Any:
    """This rank's part of a tensor: a DTensor's local shard (FSDP2), else the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


class ShardedGradFn:
    """``grad_fn`` for :func:`~leadline.lookahead.noise.measure_noise_scale` on a model sharded by FSDP.

    Args:
        model: the sharded module (``FullyShardedDataParallel`` or ``fully_shard``); its
            reduce-scatter must average over the ranks (FSDP's default).
        micro_batch_of: ``micro_batch_of(j)`` -> micro-batch j, as for
            :class:`~leadline.lookahead.noise.ModelGradFn`; the same on every rank (rank r runs j = i W + r).
        params: the trained tensors as the sharded model holds them (default: its parameters
            with ``requires_grad``).
        group: the process group (None: the default one).
        guard: ``guard(what)`` -> a context manager each draw runs inside (derive_for passes its
            :meth:`~leadline.lookahead.distributed.stopline.StopLine.guard`: a failure on one rank inside the
            draw's collectives stops every rank with its sentence).

    ``grad_fn(i)`` returns this rank's shard of the world's gradient and the world's scored
    tokens, or None on every rank when any rank's data ran out. ``reduce_sums`` all-reduces the
    probe's three partial sums and ``agree_stop`` the decision to stop before a draw (a time
    budget runs on each rank's clock); :func:`measure_noise_scale` uses both by itself.

    Raises:
        InputError: no process group runs; ``micro_batch_of`` is not callable; nothing is trained.

    Examples:
        Every draw is a collective, so it is built inside a job only:

        >>> import torch
        >>> ShardedGradFn(torch.nn.Linear(4, 2), lambda j: None)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: ShardedGradFn needs torch.distributed initialised (run under torchrun, or ...
    """

    def __init__(self, model: Any, micro_batch_of: Callable[[int], Any], params: Iterable[Any] | None = None,
                 group: Any = None, guard: Callable[[str], Any] | None = None) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise InputError("ShardedGradFn needs torch.distributed initialised (run under torchrun, or "
                             "init_process_group first)")
        if not callable(micro_batch_of):
            raise InputError("ShardedGradFn(micro_batch_of=...) must be callable j -> micro-batch, got "
                             f"{type(micro_batch_of).__name__}")
        self.model, self.micro_batch_of, self.group, self.guard = model, micro_batch_of, group, guard
        self.params = [p for p in (params if params is not None else model.parameters()) if p.requires_grad]
        if not self.params:
            raise InputError("ShardedGradFn found no trained tensors (none with requires_grad); pass params= or "
                             "unfreeze them")
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._saved: list[Any] | None = None

    def __enter__(self) -> ShardedGradFn:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Put back the ``.grad`` the trained tensors held before the first draw."""
        if self._saved is not None:
            for p, g in zip(self.params, self._saved):
                p.grad = g
            self._saved = None

    def reduce_sums(self, sums: Any) -> None:
        """Sum the draw's partial sums over the ranks, in place."""
        import torch.distributed as dist

        dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=self.group)

    def agree_stop(self, stopping: bool) -> bool:
        """Whether any rank stops before this draw (its time budget ran out first)."""
        return self._world_sum([float(stopping)])[0] > 0

    def weight_norms(self, named: Iterable[tuple[str, Any]]) -> dict[str, tuple[float, int]]:
        """``{name: (frobenius_norm, numel)}`` of the whole trained tensors: each rank's shard's
        sum of squares and entries, summed over the ranks (one all-reduce). The anchor's
        rewrite scale reads them (:func:`~leadline.lookahead.rate.anchor_rate`'s ``norms``)."""
        import torch

        named = list(named)
        with torch.no_grad():
            local = [_local(t.detach()) for _, t in named]
            sums = self._world_sum([float(torch.sum(t.double() ** 2)) for t in local]
                                   + [float(t.numel()) for t in local])
        n = len(named)
        return {name: (sums[i] ** 0.5, int(sums[n + i])) for i, (name, _) in enumerate(named)}

    def _world_sum(self, values: list[float]) -> list[float]:
        import torch
        import torch.distributed as dist

        device = _local(self.params[0]).device
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return t.cpu().tolist()

    def __call__(self, i: int) -> tuple[list[Any], int] | None:
        """Draw ``i``: this rank's shard of the world's gradient and the world's scored tokens
        (``([], 0)`` when no rank scored a token; None on every rank when any rank's data ran out)."""
        if self.guard is None:
            return self._draw(i)
        with self.guard(f"the sharded noise probe's draw {i}"):
            return self._draw(i)

    def _draw(self, i: int) -> tuple[list[Any], int] | None:
        import torch

        j = i * self.world_size + self.rank
        try:
            mb = self.micro_batch_of(j)
        except IndexError:
            mb = None
        kwargs, scored = ({}, 0) if mb is None else batch_inputs(mb, j)
        if mb is not None and scored is None:
            labels = kwargs.get("labels")
            if labels is None:
                raise InputError(f"micro-batch {j} has neither labels nor scored_tokens; pass labels (-100 where not "
                                 "scored) or scored_tokens")
            scored = int((labels[..., 1:] != -100).sum())
        ended, total = self._world_sum([float(mb is None), float(scored)])
        if ended:  # every rank stops at the same draw
            return None
        if total == 0:
            return [], 0
        if self._saved is None:
            self._saved = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None
        device = _local(self.params[0]).device
        batch = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
        with torch.enable_grad():
            out = self.model(**batch)
            if scored:
                loss = out.loss * (self.world_size * scored / total)
            else:  # nothing scored here: the backward still runs, for the world's collectives
                loss = out.logits.sum() * 0.0
        bad = self._world_sum([float(not bool(torch.isfinite(loss.detach())))])[0]
        if bad:  # agreed before the backward, whose collectives every rank must enter
            raise InputError(f"the loss of the world's draw {i} is not finite on {int(bad)} rank(s) (sharded noise "
                             "probe; "
                             f"this rank's micro-batch {j}: {float(loss.detach())}); check these rows and the model's "
                             "dtype")
        loss.backward()
        grads = []
        for p in self.params:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            grads.append(_local(g))
        return grads, int(total)
