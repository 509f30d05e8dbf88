"""derive(): the plan from measurements, phase by phase.

- :mod:`~leadline.lookahead.derive.recipe` — derive() itself: the phases in order, one call each.
- :mod:`~leadline.lookahead.derive.phases` — each phase: what it takes, the result it returns; the step's
  in :mod:`~leadline.lookahead.derive.batches`, the burn-in past the format's in
  :mod:`~leadline.lookahead.derive.past_format`, the rate's in :mod:`~leadline.lookahead.derive.rate_phases`.
- :mod:`~leadline.lookahead.runner` — the time budget, progress and the resume file around a phase.
- :mod:`~leadline.lookahead.derive.timed` — train steps and held-out reads held to the time budget.
- :mod:`~leadline.lookahead.derive.no_trace` — the guard that restores what derive() touched.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from leadline.lookahead.derive.recipe import EFFORTS, TRAINED_AS, derive

__all__ = ["EFFORTS", "TRAINED_AS", "derive"]


class _CallableModule(types.ModuleType):
    """This package, callable as :func:`derive`: once ``leadline.lookahead.derive`` is imported,
    Python sets the package as the attribute ``derive`` of ``leadline.lookahead``, so ``from
    leadline.lookahead import derive`` gives the package; calling it calls the function."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return derive(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
