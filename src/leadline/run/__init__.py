"""The run: ``leadline run``'s default job, one load and one loop.

The task prepared once, the rate decided on the run's opening steps (the race, :mod:`leadline.rate.opening`),
one loop (:mod:`leadline.run.loop`) under the guard (:mod:`leadline.rate.guard`, carried out by
:mod:`leadline.rate.watch`), and typed results. The CLI, ``derive_for`` and ``train_with_plan`` all go
through it: a look-ahead plan and the recipe's train through the same loop. :func:`run_in_one` is the
recipe (:mod:`leadline.run.one`), :func:`race_only` its race alone, :class:`RunOptions` what it is asked.
"""

from leadline.run.job import run_steps_of
from leadline.run.one import race_only, run_in_one
from leadline.run.options import RunOptions

__all__ = ["RunOptions", "race_only", "run_in_one", "run_steps_of"]
