"""The default run's rate and its guard, as pure rules and the one place they touch tensors.

The default way to decide the rate is the opening race (``leadline run``, ``derive_for``'s
default effort): :func:`leadline.run.run_in_one` races schedule-free AdamW's rate on the run's
own opening steps and keeps the winner's steps, by the pure rules of :mod:`leadline.rate.opening`
(the candidates, the horizon, the climb, collapse); the run then goes on under the guard
(:mod:`leadline.rate.guard`: checks on held-out rows, the best check put back and the rate halved
on a worsening; :mod:`leadline.rate.watch` carries it out on the live tensors, for every loop:
:mod:`leadline.run.loop`, the LookaheadSchedule's step hook, the guard inside Trainer).
:mod:`leadline.rate.compare` decides between candidates on per-row held-out losses;
:mod:`leadline.rate.state` holds the snapshots and RNG states the loops put back.

The look-ahead effort's rate (alpha1, the look-ahead, the LookaheadSchedule) is
:mod:`leadline.lookahead.rate`. Importing this package loads no torch.
"""
