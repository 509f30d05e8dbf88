"""Whether this process is one of several that torchrun (or accelerate) launched, read from the environment.

The default run trains in one process and refuses a job of several in one sentence; the
look-ahead effort joins the job (:mod:`leadline.lookahead.distributed.world`). Loads no torch.
"""

from __future__ import annotations

import os


def launched_by_torchrun() -> bool:
    """True when the environment says this process is one of several (torchrun, accelerate):
    ``WORLD_SIZE`` > 1. A ``WORLD_SIZE`` that is not a whole number reads as one process.

    Examples:
        >>> import os
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"WORLD_SIZE": "2"}):
        ...     launched_by_torchrun()
        True
        >>> with mock.patch.dict(os.environ, {"WORLD_SIZE": "two"}):
        ...     launched_by_torchrun()
        False
    """
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False
