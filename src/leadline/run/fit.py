"""The micro-batch: the most of the step's rows a forward and backward runs on the card, found by
the first real steps (each out-of-memory error halves it), and the run's step that halves it again
where the card runs short mid-run."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.run.job import Job

if TYPE_CHECKING:
    from leadline.run.task import Task


def fit(job: Job) -> None:
    """The job's micro-batch, what it tried and the seconds it took, and the run's step at it."""
    t = time.perf_counter()
    job.micro_batch, job.tried = micro_batch(job.task, job.rows_per_step)
    job.fit_seconds = time.perf_counter() - t
    job.step = halving_step(job)


def halved(micro_batch: int, rows_per_step: int) -> int:
    """The next micro-batch down: the largest divisor of the step's rows at most half of ``micro_batch``.

    Examples:
        >>> halved(16, 16), halved(5, 16), halved(12, 12), halved(6, 12), halved(2, 16)
        (8, 2, 6, 3, 1)
    """
    return max(d for d in range(1, micro_batch) if rows_per_step % d == 0 and d <= micro_batch // 2)


def micro_batch(task: Task, rows_per_step: int) -> tuple[int, list[dict[str, Any]]]:
    """The most rows of a step (a divisor of it) whose forward and backward at the corpus's longest
    rows runs: each out-of-memory error halves it. Off a CUDA card the whole step runs at once."""
    import torch

    tried: list[dict[str, Any]] = []
    mb = rows_per_step
    on_card = str(task.device).startswith("cuda")
    while on_card:
        try:
            task.loss_of(mb, task.seq_len).backward()
            tried.append({"rows": mb, "verdict": "runs"})
            break
        except torch.OutOfMemoryError:
            tried.append({"rows": mb, "verdict": "out of memory"})
            if mb == 1:
                raise InputError(f"one row of {task.seq_len} tokens does not fit this card; pass a smaller "
                                 "--seq-len, --gradient-checkpointing or --load-in-4bit") from None
            mb = halved(mb, rows_per_step)
        finally:
            task.model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
    return mb, tried


def halving_step(job: Job) -> Callable[[int], float]:
    """The run's step at the fitted micro-batch; where the card runs out of memory mid-run (another
    process took what was free at the fit), the micro-batch halves to the next divisor of the
    step's rows and the same step is taken again from the same state (its gradient is the same sum
    over the same rows), recorded in ``job.halved``. One row that does not fit is the fit's sentence."""
    import torch

    inner = job.task.train_step_of(job.micro_batch, job.rows_per_step // job.micro_batch)

    def step(s: int) -> float:
        nonlocal inner
        while True:
            try:
                return inner(s)
            except torch.OutOfMemoryError:
                job.task.model.zero_grad(set_to_none=True)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                if job.micro_batch == 1:
                    raise
                mb = halved(job.micro_batch, job.rows_per_step)
                job.halved.append({"step": s, "from": job.micro_batch, "to": mb})
                job.micro_batch = mb
                inner = job.task.train_step_of(mb, job.rows_per_step // mb)
    return step
