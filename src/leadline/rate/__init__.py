"""The learning rate and the run (derive()'s phases 5-7 and "During the run").

The default way to decide the rate is the opening race (``leadline run``, ``derive_for``'s
default effort): :func:`leadline.run.run_in_one` races schedule-free AdamW's rate on the run's
own opening steps and keeps the winner's steps, by the pure rules of :mod:`leadline.rate.opening`
(the candidates, the horizon, the climb, collapse); the run then goes on under the guard
(:mod:`leadline.rate.guard`: checks on held-out rows, the best check put back and the rate halved
on a worsening; :mod:`leadline.rate.watch` carries it out on the live tensors, for every loop:
:mod:`leadline.run.loop`, the LookaheadSchedule's step hook, the guard inside Trainer). What
follows is derive()'s ``full`` effort (the look-ahead) and what it rests on:

- :func:`measure_first_step` -> :class:`FirstStep`: alpha1, the first safe step along Adam's
  own first update on held-out rows.
- :func:`lookahead_lr` -> :class:`Lookahead`: the rate by running the real optimizer ahead at
  alpha1 x 2^j, with a paired sequential test per comparison.
- :class:`LookaheadSchedule` with :func:`lookahead_from`: the plan's rate at each step, its
  checks every horizon carried out by the guard's :class:`~leadline.rate.watch.Watch` (rolled
  back and halved on a significant worsening), the ending decided at the end.
- :func:`anchor_rate` (:mod:`leadline.rate.anchor`): the rewrite scale and the constant divisors, used only where
  nothing could be run; :mod:`leadline.rate.warmup`: warmup from alpha1, weight decay 0.

The interface every phase shares: ``params`` (the trained tensors), ``opt`` (a torch optimizer
over them), ``train_step(step)`` (the caller's forward+backward of one optimizer step's
micro-batches; the phase calls ``opt.zero_grad``/``opt.step`` itself) and
``held_out_losses_per_row()`` (per-row losses on fixed held-out rows). The measurement phases
leave no trace. Importing this package loads no torch; the drivers load it when called.
"""

from __future__ import annotations

# Every module imported here is torch-free at import time (the drivers import torch inside).
from leadline.rate.anchor import AnchorRate, anchor_rate
from leadline.rate.first_step import FirstStep, measure_first_step
from leadline.rate.lookahead import Lookahead, lookahead_lr
from leadline.rate.schedule import LookaheadSchedule, ScheduleConfig, lookahead_from
from leadline.rate.warmup import warmup_values

__all__ = [
    "AnchorRate", "FirstStep", "Lookahead", "LookaheadSchedule", "ScheduleConfig",
    "anchor_rate", "lookahead_from", "lookahead_lr", "measure_first_step", "warmup_values",
]
