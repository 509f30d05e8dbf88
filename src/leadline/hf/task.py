"""The task's names where ``leadline.hf.task`` held them. The task is the run's own and lives in
:mod:`leadline.run.task`; this module re-exports its public names so code that imports them
from here keeps working. New code imports them from :mod:`leadline.run.task` (or :mod:`leadline.hf`).
"""

from __future__ import annotations

from leadline.run.task import (
    MAX_HELD_OUT_ROWS,
    Task,
    loss_resolution,
    prepare,
    probe_of,
    rows_of,
    split_sizes,
    tokens_to_steps,
    trained_as_of,
    trained_named_weights,
)

__all__ = ["MAX_HELD_OUT_ROWS", "Task", "loss_resolution", "prepare", "probe_of", "rows_of", "split_sizes",
           "tokens_to_steps", "trained_as_of", "trained_named_weights"]
