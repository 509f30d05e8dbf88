"""The digest that tells two sets of weights apart: the look-ahead's kept branch checks the
weights it started from, and a torchrun job checks every rank starts from the same ones."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def tensors_digest(tensors: Sequence[torch.Tensor]) -> str:
    """sha256 over the bytes of ``tensors`` (moved to the CPU): equal digests, equal weights."""
    h = hashlib.sha256()
    for t in tensors:
        a = t.detach()
        if a.dtype.is_floating_point and a.dtype.itemsize == 2:
            a = a.view(__import__("torch").int16)
        h.update(a.contiguous().cpu().numpy().tobytes())
    return h.hexdigest()
