"""The run: ``leadline run``'s default job, one load and one loop.

The task prepared once, the rate decided on the run's opening steps (the race, :mod:`leadline.rate.opening`),
one loop (:mod:`leadline.run.loop`) under the guard (:mod:`leadline.rate.guard`, carried out by
:mod:`leadline.rate.watch`), and typed results. The CLI, ``derive_for`` and ``train_with_plan`` all go
through it: a look-ahead plan and the recipe's train through the same loop.
"""

from leadline.run.one import run_in_one, run_steps_of

__all__ = ["run_in_one", "run_steps_of"]
