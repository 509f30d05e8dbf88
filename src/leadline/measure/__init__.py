"""The measurement tools, usable on their own: what the machine really delivers.

- :func:`measure_gpu` / :func:`transfer_bandwidth` / :func:`virtualisation` — the card and
  whether its timings can be trusted (``leadline gpu``);
- :func:`disk_queue_depth` — read throughput per queue depth, page cache bypassed
  (``leadline disk``);
- :func:`quant_error` / :func:`roundtrip` — int8/int4 round-trip error per weight family
  (``leadline quant``).

Names are loaded on first use: ``import leadline.measure`` imports no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, str] = {
    "virtualisation": "leadline.measure.virt",
    "Virtualisation": "leadline.measure.virt",
    "parse_nvidia_smi": "leadline.measure.virt",
    "measure_gpu": "leadline.measure.gpu",
    "transfer_bandwidth": "leadline.measure.gpu",
    "GpuReport": "leadline.measure.gpu",
    "datasheet_for": "leadline.measure.gpu",
    "disk_queue_depth": "leadline.measure.disk",
    "DiskSweep": "leadline.measure.disk",
    "quant_error": "leadline.measure.quant",
    "QuantReport": "leadline.measure.quant",
    "roundtrip": "leadline.measure.quant",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'leadline.measure' has no attribute {name!r}")
    obj = getattr(importlib.import_module(module), name)
    globals()[name] = obj
    return obj


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
