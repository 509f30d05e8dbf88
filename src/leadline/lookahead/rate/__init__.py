"""The look-ahead's learning rate (derive()'s phases 5-7, ``effort="full"``) and its schedule.

The default run decides its rate by the opening race and trains under the guard, both in the
core (:mod:`leadline.rate`). What follows is derive()'s ``full`` effort (the look-ahead) and what
it rests on:

- :func:`measure_first_step` -> :class:`FirstStep`: alpha1, the first safe step along Adam's
  own first update on held-out rows.
- :func:`lookahead_lr` -> :class:`Lookahead`: the rate by running the real optimizer ahead at
  alpha1 x 2^j, with a paired sequential test per comparison.
- :class:`LookaheadSchedule` with :func:`lookahead_from`: the plan's rate at each step, its
  checks every horizon carried out by the guard's :class:`~leadline.rate.watch.Watch` (rolled
  back and halved on a significant worsening), the ending decided at the end.
- :func:`anchor_rate` (:mod:`leadline.lookahead.rate.anchor`): the rewrite scale and the constant
  divisors, used only where nothing could be run; :mod:`leadline.lookahead.rate.warmup`: warmup
  from alpha1, weight decay 0.

The interface every phase shares: ``params`` (the trained tensors), ``opt`` (a torch optimizer
over them), ``train_step(step)`` (the caller's forward+backward of one optimizer step's
micro-batches; the phase calls ``opt.zero_grad``/``opt.step`` itself) and
``held_out_losses_per_row()`` (per-row losses on fixed held-out rows). The measurement phases
leave no trace. Importing this package loads no torch; the drivers load it when called.
"""

from __future__ import annotations

# Every module imported here is torch-free at import time (the drivers import torch inside).
from leadline.lookahead.rate.anchor import AnchorRate, anchor_rate
from leadline.lookahead.rate.first_step import FirstStep, measure_first_step
from leadline.lookahead.rate.lookahead import Lookahead, lookahead_lr
from leadline.lookahead.rate.schedule import LookaheadSchedule, ScheduleConfig, lookahead_from
from leadline.lookahead.rate.warmup import warmup_values

__all__ = [
    "AnchorRate", "FirstStep", "Lookahead", "LookaheadSchedule", "ScheduleConfig",
    "anchor_rate", "lookahead_from", "lookahead_lr", "measure_first_step", "warmup_values",
]
