"""The guard that makes derive() leave no trace: the trained tensors, the optimizers' state and
settings, and the RNG states, restored on every exit path."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from leadline.rng import capture_rng, restore_rng


@contextlib.contextmanager
def leave_no_trace(params: Sequence[Any] = (), optimizers: Sequence[Any] = ()) -> Iterator[None]:
    """Restore on every exit path what derive() may touch: the trained tensors' values (from a
    copy kept on the CPU), the optimizers' state and hyperparameters, the RNG states of Python,
    NumPy and torch (CPU and CUDA)."""
    torch = sys.modules.get("torch")
    rng = capture_rng()
    copies = [p.detach().to("cpu", copy=True) for p in params]
    groups = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] for opt in optimizers]
    try:
        yield
    finally:
        if copies:
            with torch.no_grad():
                for p, c in zip(params, copies):
                    p.copy_(c.to(p.device))
                    p.grad = None
        for opt, saved in zip(optimizers, groups):
            opt.state.clear()
            for g, s in zip(opt.param_groups, saved):
                g.update(s)
        restore_rng(rng)
