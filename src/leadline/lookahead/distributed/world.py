"""Joining the job a process belongs to: torchrun's environment read, the process group started
and ended. The job itself, :class:`~leadline.lookahead.world.World` and
:func:`~leadline.lookahead.world.current_world` (this process's place in it and the few
collectives leadline needs), is :mod:`leadline.lookahead.world`, below derive and this package;
whether torchrun launched several processes is the core's :func:`leadline.torchrun.launched_by_torchrun`
(the default run refuses a job in one sentence); they are importable from here too.

Every method of a :class:`World` is a collective: every rank must call it, in the same order.
leadline only calls them where every rank's control flow is the same by construction (see
docs/distributed.md).

``import leadline.lookahead.distributed`` loads no torch; :func:`current_world` reads torch only when it
is already imported, so a process that never touched torch is never "in a job".
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from leadline.lookahead.world import OPS, World, current_world
from leadline.torchrun import launched_by_torchrun

__all__ = ["OPS", "World", "current_world", "job_from_env", "join_job", "launched_by_torchrun"]


def join_job(device: Any = None, timeout_s: float = 1800.0) -> World | None:
    """The job this process is in: :func:`current_world`, or — when torchrun's environment says
    the process is one of several but no process group runs yet — the group started here from
    that environment (NCCL on ``device`` when it is a GPU, gloo otherwise) and left running for
    the training that follows, as ``TrainingArguments`` would start it, and destroyed at the
    process's exit if the script did not. None for a lone process.

    Examples:
        A process launched alone (``WORLD_SIZE`` 1 or unset) joins nothing and starts nothing:

        >>> import os
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"WORLD_SIZE": "1"}):
        ...     join_job("cpu") is None
        True
    """
    world = current_world()
    if world is not None or not launched_by_torchrun():
        return world
    import datetime

    import torch
    import torch.distributed as dist

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev.index if dev.index is not None else int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
    import atexit

    atexit.register(_destroy_at_exit)
    return current_world()


def _destroy_at_exit() -> None:
    """The group join_job started, destroyed before the interpreter shuts down (unless the
    script did it): a gloo group left running at exit can abort a rank with SIGABRT
    (docs/distributed.md, "The two commands")."""
    import datetime

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:  # every rank leaves together: a gloo rank whose peer closed its connections first aborts
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
        except Exception:  # a rank gone already: destroy anyway, it is the exit
            pass
        try:
            dist.destroy_process_group()
        except Exception:  # at exit, a group already torn down by its backend is not an error
            pass


@contextlib.contextmanager
def job_from_env(device: str | None = None, timeout_s: float = 1800.0) -> Iterator[World | None]:
    """Join the job torchrun described in the environment (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT) for the duration of the block; yield its :class:`World`, or None
    when the process was launched alone.

    NCCL on this rank's GPU (``cuda:LOCAL_RANK``) when there is one and ``device`` does not
    say ``cpu``; gloo otherwise. A process group this function started is destroyed on exit;
    one that was already running is left as it was.

    Examples:
        Launched alone, the block runs with no job:

        >>> import os
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"WORLD_SIZE": "1"}), job_from_env("cpu") as world:
        ...     print(world)
        None
    """
    if not launched_by_torchrun():
        yield None
        return
    import datetime

    import torch
    import torch.distributed as dist

    started = False
    if not dist.is_initialized():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        use_cuda = torch.cuda.is_available() and not (device or "").startswith("cpu")
        if use_cuda:
            torch.cuda.set_device(local)
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
        started = True
    try:
        yield current_world()
    finally:
        if started and dist.is_initialized():
            import gc

            gc.collect()  # a DDP wrapper still alive when the group goes aborts the process
            with contextlib.suppress(Exception):
                dist.barrier()
            dist.destroy_process_group()
