"""The torch side of the estimator's streaming: gradients in, :class:`Draw` scalars out.

Two drivers feed :mod:`leadline.noise.estimator`, each with at most two gradient-sized fp32
buffers: :class:`MeanStream` (the probe: one accumulator, the token-weighted mean) and the
monitor's mirror + mean (:mod:`leadline.noise.monitor`). torch is imported when used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.noise.estimator import Draw

if TYPE_CHECKING:
    import torch


def as_tensor_list(gradient: Any, what: str) -> list[torch.Tensor]:
    """A gradient given as one tensor or a list/tuple of tensors, as a list."""
    import torch

    if isinstance(gradient, torch.Tensor):
        return [gradient]
    if isinstance(gradient, Sequence) and gradient and all(isinstance(g, torch.Tensor) for g in gradient):
        return list(gradient)
    raise InputError(f"{what} must be a torch.Tensor or a non-empty list of tensors, got {type(gradient).__name__}")


def accumulator_dtype(t: torch.Tensor) -> torch.dtype:
    """fp32, or fp64 where the gradient already is (never lower than fp32)."""
    import torch

    return torch.promote_types(t.dtype, torch.float32)


class MeanStream:
    """The token-weighted running mean m_j of the gradients seen (one fp32 accumulator).

    ``add(grads, tokens)`` updates m by Welford's rule m_j = m_{j-1} + (t_j/T_j)(g_j - m_{j-1}),
    one tensor at a time (a transient difference of one tensor, never of the whole gradient),
    and returns the draw's scalars with one host synchronisation.

    ``reduce``: for a gradient sharded across ranks (each rank passes its shard), a callable
    that sums the draw's three partial sums (a float64 tensor of 3) over the ranks in place,
    e.g. an all-reduce; every sum is over coordinates, so the result is the whole gradient's.
    """

    def __init__(self, reduce: Callable[[torch.Tensor], Any] | None = None) -> None:
        self.mean: list[torch.Tensor] | None = None
        self.tokens = 0.0
        self.reduce = reduce

    def add(self, grads: list[torch.Tensor], tokens: float) -> Draw:
        import torch

        if self.mean is None:
            self.mean = [torch.zeros(g.shape, dtype=accumulator_dtype(g), device=g.device) for g in grads]
        if len(grads) != len(self.mean) or any(g.shape != m.shape for g, m in zip(grads, self.mean)):
            raise InputError(
                "every gradient the probe draws must have the same tensors in the same order and shapes; "
                f"got {len(grads)} tensors where the first draw had {len(self.mean)}"
            )
        t_now = self.tokens + float(tokens)
        w = float(tokens) / t_now
        rs, xs, us = [], [], []
        for g, m in zip(grads, self.mean):
            d = g.to(m.dtype) - m
            df, mf = d.reshape(-1), m.view(-1)
            rs.append(torch.dot(df, df))
            xs.append(torch.dot(df, mf))
            m.add_(d, alpha=w)
            us.append(torch.dot(mf, mf))
        sums = torch.stack([torch.stack(v).double().sum() for v in (rs, xs, us)])
        if self.reduce is not None:
            self.reduce(sums)
        vals = sums.cpu().tolist()
        self.tokens = t_now
        return Draw(tokens=float(tokens), innovation_sq=vals[0], mean_sq=vals[2], cross=vals[1])
