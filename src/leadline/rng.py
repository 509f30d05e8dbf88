"""The random number streams a training step can draw from, captured and put back: the one
implementation every part of leadline uses (the run and its race, the rate phases' snapshots and
held-out reads, derive()'s no-trace guard).

The streams are Python's ``random``, and NumPy's and torch's (CPU, and CUDA once it has started)
where the process has loaded them: this module imports neither, so ``import leadline`` stays light.
"""

from __future__ import annotations

import random
import sys
from typing import Any


def capture_rng() -> dict[str, Any]:
    """The RNG states a training step can draw from: ``random``, and torch's CPU and CUDA (once
    started) and NumPy's where the process has loaded them.

    Examples:
        >>> import torch
        >>> state = capture_rng()
        >>> drawn = torch.rand(2)
        >>> restore_rng(state)
        >>> torch.equal(torch.rand(2), drawn)
        True
        >>> restore_rng(state)  # and the stream is where it was before the example
    """
    state: dict[str, Any] = {"random": random.getstate()}
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        state["numpy"] = np.random.get_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back what :func:`capture_rng` read.

    Examples:
        >>> state = capture_rng()
        >>> drawn = random.random()
        >>> restore_rng(state)
        >>> random.random() == drawn
        True
        >>> restore_rng(state)  # and the stream is where it was before the example
    """
    random.setstate(state["random"])
    torch = sys.modules.get("torch")
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state and sys.modules.get("numpy") is not None:
        sys.modules["numpy"].random.set_state(state["numpy"])
