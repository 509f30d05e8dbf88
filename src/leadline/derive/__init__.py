"""derive(): the plan from measurements, phase by phase.

- :mod:`~leadline.derive.recipe` — derive() itself: the phases in order, one call each.
- :mod:`~leadline.derive.phases` — each phase: what it takes, the result it returns; the step's
  in :mod:`~leadline.derive.batches`, the rate's in :mod:`~leadline.derive.rate_phases`.
- :mod:`~leadline.derive.runner` — the time budget, progress and the resume file around a phase.
- :mod:`~leadline.derive.timed` — train steps and held-out reads held to the time budget.
- :mod:`~leadline.derive.no_trace` — the guard that restores what derive() touched.
"""

from __future__ import annotations

from leadline.derive.recipe import EFFORTS, TRAINED_AS, derive

__all__ = ["EFFORTS", "TRAINED_AS", "derive"]
