"""The torch side of the estimator's streaming: gradients in, :class:`Draw` scalars out.

Two drivers feed :mod:`leadline.lookahead.noise.estimator`, each with at most two gradient-sized fp32
buffers: :class:`MeanStream` (the probe: one accumulator, the token-weighted mean) and the
monitor's mirror + mean (:mod:`leadline.lookahead.noise.monitor`). torch is imported when used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.lookahead.noise.estimator import Draw

if TYPE_CHECKING:
    import torch


def as_tensor_list(gradient: Any, what: str) -> list[torch.Tensor]:
    """A gradient given as one tensor or a list/tuple of tensors, as a list.

    Examples:
        >>> import torch
        >>> len(as_tensor_list(torch.zeros(3), "g")), len(as_tensor_list((torch.zeros(3), torch.ones(2)), "g"))
        (1, 2)
        >>> as_tensor_list([], "grad_fn(0)'s gradient")
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: grad_fn(0)'s gradient must be a torch.Tensor or a non-empty list of tensors, ...
    """
    import torch

    if isinstance(gradient, torch.Tensor):
        return [gradient]
    if isinstance(gradient, Sequence) and gradient and all(isinstance(g, torch.Tensor) for g in gradient):
        return list(gradient)
    raise InputError(f"{what} must be a torch.Tensor or a non-empty list of tensors, got {type(gradient).__name__}")


def accumulator_dtype(t: torch.Tensor) -> torch.dtype:
    """fp32, or fp64 where the gradient already is (never lower than fp32).

    Examples:
        >>> import torch
        >>> accumulator_dtype(torch.zeros(1, dtype=torch.bfloat16)), accumulator_dtype(torch.zeros(1).double())
        (torch.float32, torch.float64)
    """
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

    Examples:
        One-number gradients 1 and 3 of one token each (the draws
        :class:`~leadline.lookahead.noise.estimator.NoiseSums` reads):

        >>> import torch
        >>> stream = MeanStream()
        >>> stream.add([torch.tensor([1.0])], 1)
        Draw(tokens=1.0, innovation_sq=1.0, mean_sq=1.0, cross=0.0)
        >>> stream.add([torch.tensor([3.0])], 1)             # |3 - 1|², |2|², (3 - 1)·1
        Draw(tokens=1.0, innovation_sq=4.0, mean_sq=4.0, cross=2.0)
        >>> stream.mean, stream.tokens
        ([tensor([2.])], 2.0)
    """

    def __init__(self, reduce: Callable[[torch.Tensor], Any] | None = None) -> None:
        self.mean: list[torch.Tensor] | None = None
        self.tokens = 0.0
        self.reduce = reduce

    def add(self, grads: list[torch.Tensor], tokens: float) -> Draw:
        """Fold one draw of ``tokens`` scored tokens into the mean; its scalars against the mean before it."""
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
