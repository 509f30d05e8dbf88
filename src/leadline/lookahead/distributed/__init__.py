"""Several GPUs: derive() inside a torch.distributed job, the noise scale from DDP's own
all-reduce, and how far data parallelism pays.

- :class:`World` / :func:`current_world` / :func:`job_from_env` — this process's place in the
  job, and the collectives on host numbers and objects leadline uses.
- :func:`agreed` / :class:`RankFailed` — did anyone fail? A failure on one rank becomes the
  same sentence on every rank (an out-of-memory stays one), never a collective that hangs.
- :func:`broadcast_plan` / :func:`plan_digest` — every rank ends with rank 0's plan, checked by
  its sha256.
- :class:`NoiseHook` / :class:`DDPNoise` — a DDP communication hook that reads the noise scale
  (McCandlish et al. 2018) from each rank's local bucket against the all-reduced one, and
  derive()'s noise phase built on it; :func:`world_draws` the math, pure.
- :class:`ShardedGradFn` — the noise probe's ``grad_fn`` on a model sharded by FSDP: each rank
  sums its shard, one all-reduce of three numbers a draw, the single-process estimate exactly.
- :class:`StopLine` / :class:`WorldAborted` — a rank that fails inside a sharded model's
  collectives while another is still inside them stops the job through the store, every rank
  with the same sentence, instead of the backend's timeout.
- :func:`scale_out` / :class:`ScaleOut` — from a plan: the global batch, steps, tokens and wall
  time to the same loss at 1, 2, 4, ... GPUs, and where adding GPUs stops paying.
- :class:`AgreedPhaseRunner`, :func:`world_memory`, :func:`world_step`, :class:`WorldTask`,
  :class:`ShardedWorldTask` — what derive() and derive_for() use inside a job (DDP; FSDP).

``import leadline.lookahead.distributed`` loads no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, str] = {
    "World": "leadline.lookahead.distributed.world",
    "current_world": "leadline.lookahead.distributed.world",
    "job_from_env": "leadline.lookahead.distributed.world",
    "launched_by_torchrun": "leadline.lookahead.distributed.world",
    "join_job": "leadline.lookahead.distributed.world",
    "agreed": "leadline.lookahead.distributed.agree",
    "RankFailed": "leadline.lookahead.distributed.agree",
    "broadcast_plan": "leadline.lookahead.distributed.sync",
    "plan_digest": "leadline.lookahead.distributed.sync",
    "NoiseHook": "leadline.lookahead.distributed.hook",
    "DDPNoise": "leadline.lookahead.distributed.hook",
    "world_draws": "leadline.lookahead.distributed.noise_math",
    "scale_out": "leadline.lookahead.distributed.scale_out",
    "scale_out_table": "leadline.lookahead.distributed.scale_out",
    "ScaleOut": "leadline.lookahead.distributed.scale_out",
    "ScaleRow": "leadline.lookahead.distributed.scale_out",
    "AgreedPhaseRunner": "leadline.lookahead.distributed.phases",
    "world_memory": "leadline.lookahead.distributed.phases",
    "world_step": "leadline.lookahead.distributed.phases",
    "WorldTask": "leadline.lookahead.distributed.job",
    "ShardedGradFn": "leadline.lookahead.distributed.sharded",
    "ShardedWorldTask": "leadline.lookahead.distributed.sharded_job",
    "StopLine": "leadline.lookahead.distributed.stopline",
    "WorldAborted": "leadline.lookahead.distributed.stopline",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'leadline.lookahead.distributed' has no attribute {name!r}")
    obj = getattr(importlib.import_module(module), name)
    globals()[name] = obj
    return obj


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
