"""What a plan was measured on: the machine, the model, the data, as plain dicts; and the digest
that tells two sets of weights apart (:func:`tensors_digest`).

torch is read only when it is already imported or a device is named, so ``import leadline``
stays light.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leadline._version import __version__

if TYPE_CHECKING:
    import torch


def describe_machine(device: str | int | torch.device | None = None) -> dict[str, Any]:
    """The host and, where torch is loaded, the accelerator: name, memory, driver, torch version.

    Without ``device`` and with torch not yet imported, only the host is read (no torch import);
    with a CUDA device its name, memory, CUDA version and NVIDIA driver are added.

    Examples:
        >>> {"platform", "python", "cpu_count", "leadline"} <= set(describe_machine())
        True
        >>> describe_machine("cpu")["device"]
        'cpu'
    """
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "leadline": __version__,
    }
    if "torch" not in sys.modules and device is None:
        return info
    import torch

    info["torch"] = torch.__version__
    dev = torch.device(device) if device is not None else None
    if dev is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev is not None and dev.type == "cuda" and torch.cuda.is_available():
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        info.update(
            device=f"cuda:{idx}",
            device_name=props.name,
            device_memory_bytes=int(props.total_memory),
            cuda=torch.version.cuda,
            driver=_nvidia_driver(),
        )
    else:
        info["device"] = "cpu" if dev is None else str(dev)
    return info


def _nvidia_driver() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    for tok in text.split():
        if tok.count(".") >= 1 and tok.replace(".", "").isdigit():
            return tok
    return None


def describe_model(model: torch.nn.Module | None = None, *, name: str | None = None,
                   trained_as: str | None = None) -> dict[str, Any]:
    """The model's name, its trained (requires_grad) parameter count and how they are trained.

    The name is ``name``, else the config's ``_name_or_path``, else the class name.

    Examples:
        >>> import torch
        >>> describe_model(torch.nn.Linear(4, 2))  # 4 x 2 weights + 2 biases
        {'name': 'Linear', 'parameters': 10, 'trained_parameters': 10}
        >>> frozen_bias = torch.nn.Linear(4, 2)
        >>> _ = frozen_bias.bias.requires_grad_(False)
        >>> describe_model(frozen_bias, name="probe", trained_as="lora")
        {'name': 'probe', 'parameters': 10, 'trained_parameters': 8, 'trained_as': 'lora'}
        >>> describe_model(name="my-model")
        {'name': 'my-model'}
    """
    out: dict[str, Any] = {}
    if model is not None:
        cfg = getattr(model, "config", None)
        out["name"] = name or getattr(cfg, "_name_or_path", None) or type(model).__name__
        params = list(model.parameters())
        out["parameters"] = int(sum(p.numel() for p in params))
        out["trained_parameters"] = int(sum(p.numel() for p in params if p.requires_grad))
    elif name:
        out["name"] = name
    if trained_as:
        out["trained_as"] = trained_as
    return out


def content_hash(path_or_rows: str | os.PathLike[str] | Iterable[Mapping[str, object]]) -> str:
    """sha256 of a file's bytes, or of the rows as canonical JSON (sorted keys, one per line).

    Examples:
        >>> import hashlib, os, tempfile
        >>> content_hash([]) == hashlib.sha256(b"").hexdigest()
        True
        >>> content_hash([{"b": 2, "a": 1}]) == hashlib.sha256(b'{"a": 1, "b": 2}\\n').hexdigest()
        True
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     path = os.path.join(folder, "rows.txt")
        ...     with open(path, "wb") as f:
        ...         _ = f.write(b"abc")
        ...     content_hash(path)
        'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad'
    """
    h = hashlib.sha256()
    if isinstance(path_or_rows, (str, os.PathLike)):
        with open(path_or_rows, "rb") as f:
            for chunk in iter(lambda: f.read(8 << 20), b""):  # 8 MiB at a time
                h.update(chunk)
    else:
        for row in path_or_rows:
            h.update(json.dumps(row, sort_keys=True, default=str).encode())
            h.update(b"\n")
    return h.hexdigest()


def tensors_digest(tensors: Sequence[torch.Tensor]) -> str:
    """sha256 over the bytes of ``tensors`` (moved to the CPU): equal digests, equal weights."""
    h = hashlib.sha256()
    for t in tensors:
        a = t.detach()
        if a.dtype.is_floating_point and a.dtype.itemsize == 2:
            a = a.view(__import__("torch").int16)
        h.update(a.contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def describe_data(path_or_rows: str | os.PathLike[str] | Iterable[Mapping[str, object]],
                  rows: int | None = None) -> dict[str, Any]:
    """The data's path (None: it came in memory), its row count and its :func:`content_hash`.

    A path's row count is ``rows`` as given (the file is hashed, not parsed); rows in memory
    are counted unless ``rows`` says otherwise.

    Examples:
        >>> d = describe_data([{"text": "hi"}, {"text": "yo"}])
        >>> d["path"], d["rows"], d["sha256"][:12]
        (None, 2, '408c2de512d3')
    """
    if isinstance(path_or_rows, (str, os.PathLike)):
        return {"path": str(path_or_rows), "rows": rows, "sha256": content_hash(path_or_rows)}
    rows_list = list(path_or_rows)
    return {"path": None, "rows": len(rows_list) if rows is None else rows, "sha256": content_hash(rows_list)}
