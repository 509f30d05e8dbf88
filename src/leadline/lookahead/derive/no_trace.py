"""The guard that makes derive() leave no trace: the trained tensors, the optimizers' state and
settings, and the RNG states, restored on every exit path."""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Iterator, Sequence
from typing import Any


@contextlib.contextmanager
def leave_no_trace(params: Sequence[Any] = (), optimizers: Sequence[Any] = ()) -> Iterator[None]:
    """Restore on every exit path what derive() may touch: the trained tensors' values (from a
    copy kept on the CPU), the optimizers' state and hyperparameters, the RNG states of Python,
    NumPy and torch (CPU and CUDA)."""
    torch = sys.modules.get("torch")
    py_state = random.getstate()
    np_mod = sys.modules.get("numpy")
    np_state = np_mod.random.get_state() if np_mod is not None else None
    torch_state = torch.random.get_rng_state() if torch is not None else None
    cuda_states = None
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda_states = torch.cuda.get_rng_state_all()
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
        random.setstate(py_state)
        if np_state is not None:
            np_mod.random.set_state(np_state)
        if torch_state is not None:
            torch.random.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
