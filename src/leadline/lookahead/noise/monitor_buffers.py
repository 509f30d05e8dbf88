"""The noise monitor's flat gradient buffers: the torch side of :mod:`leadline.lookahead.noise.monitor`.

:class:`_Group` holds the trained tensors of one device and dtype: their gradient in one flat
buffer of their dtype with each ``.grad`` a view of it, and the accumulator-dtype (fp32) mirror
and token-weighted mean the monitor reads each micro-batch's increment with; it adopts fresh
``.grad`` into the views, and between steps lets a large buffer go with the ``.grad`` that hold
it. :func:`_is_sharded` tells the DTensor parameters whose ``.grad`` cannot be such a view. The
module docstring of :mod:`leadline.lookahead.noise.monitor` says why and what it costs; torch is imported
when used.
"""

from __future__ import annotations

import itertools
import weakref
from operator import attrgetter, is_
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


_grad_of = attrgetter("grad")
_STALE: Any = object()  # expected of a view whose contents are not yet its .grad's


class _Group:
    """The trained tensors of one device and dtype: their gradient in a flat buffer with a view
    per tensor, and the accumulator-dtype mirror and mean. ``expect[i]`` is what tensor i's
    ``.grad`` is while the buffer holds it: its view, or None where the view is zero."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        import torch

        from leadline.lookahead.noise._stream import accumulator_dtype

        self.params = params
        self.offsets = [0, *itertools.accumulate(p.numel() for p in params)]
        self.mirror = torch.zeros(self.offsets[-1], dtype=accumulator_dtype(params[0]), device=params[0].device)
        self.mean = torch.zeros_like(self.mirror)
        self.live = False  # some .grad here is defined (else g = 0 here)
        self.grad: torch.Tensor | None = None
        self.views: list[torch.Tensor] = []
        self.expect: list[Any] = []
        self._refs: tuple[Any, list[Any], list[bool]] | None = None  # weakly, between steps

    def take(self) -> None:
        """Make the buffer hold every ``.grad``: each is its view, or None with a zero view."""
        changed = self.grad is None
        if changed:
            self._resume()
        if not all(map(is_, map(_grad_of, self.params), self.expect)):
            self._adopt()
            changed = True
        if changed:
            self.live = any(e is not None for e in self.expect)

    def release(self, release_bytes: int) -> None:
        """Close the step; a buffer of ``release_bytes`` or more is held from now on only by the
        ``.grad`` that are its views (the monitor passes its ``_RELEASE_BYTES``)."""
        if self.grad is not None and self.grad.nbytes >= release_bytes:
            self._refs = (weakref.ref(self.grad), [weakref.ref(v) for v in self.views],
                          [e is None for e in self.expect])
            self.grad, self.views, self.expect = None, [], []
        self.mirror.zero_()
        self.mean.zero_()

    def _resume(self) -> None:
        import torch

        buf_ref, view_refs, zeros = self._refs or (lambda: None, [], [])
        buf = buf_ref()
        if buf is None:  # never made, or freed with the .grad (zero_grad(set_to_none=True))
            p0 = self.params[0]
            buf = torch.empty(self.offsets[-1], dtype=p0.dtype, device=p0.device)
            self.views = list(torch._utils._unflatten_dense_tensors(buf, self.params))
            self.expect = [_STALE] * len(self.params)
        else:
            self.views = [ref() for ref in view_refs]
            self.expect = [None if z else v for v, z in zip(self.views, zeros)]
            for i, v in enumerate(self.views):
                if v is None:  # no .grad held this view any more: a new one on the same memory
                    self.views[i] = buf[self.offsets[i]:self.offsets[i + 1]].view(self.params[i].shape)
                    self.expect[i] = None if zeros[i] else _STALE
        self.grad = buf

    def _adopt(self) -> None:
        """Copy each ``.grad`` that is not its view into the view and set ``.grad`` to it; zero
        the view where ``.grad`` is None (no gradient reached the tensor)."""
        import torch

        taken, grads, zero = [], [], []
        for i, (p, v) in enumerate(zip(self.params, self.views)):
            g = p.grad
            if g is None and self.expect[i] is not None:
                zero.append(v)
            elif g is not None and g is not v:
                taken.append(i)
                grads.append(g)
            self.expect[i] = None if g is None else v
        with torch.no_grad():
            if grads:
                torch._foreach_copy_([self.views[i] for i in taken], grads)
            if zero:
                torch._foreach_zero_(zero)
        for i in taken:
            self.params[i].grad = self.views[i]


def _is_sharded(p: Any) -> bool:
    """A DTensor (FSDP2's ``fully_shard``, tensor parallelism): its ``.grad`` cannot be a view of a flat buffer."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return isinstance(p, DTensor)
