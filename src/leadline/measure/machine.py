"""The machine a measurement ran on: the host and, where torch is loaded, the accelerator.

torch is read only when it is already imported or a device is named, so importing this module
stays light.
"""

from __future__ import annotations

import os
import platform
import sys
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
