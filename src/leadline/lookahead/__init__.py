"""The look-ahead effort (``--effort full``, ``effort="full"``): derive() and everything only it needs.

The default run (:mod:`leadline.run`, the race, the guard, the corpus, the memory fit and spill
cap, Trainer, the plan, the report, the command line) is the core and imports nothing from here.
The core reaches this package through one door, three modules that handle the full effort:
``leadline.cli.derive`` (the command line's ``--effort full``), ``leadline.hf.deriving``
(``derive_for(..., effort="full")``) and ``leadline.train`` (a full-effort plan trained, in
``train_with_plan`` and ``LeadlineCallback``). This package imports the core, never the reverse.

- :mod:`~leadline.lookahead.derive` — derive(): the phases in order, each one call; the branch kept
  beside the plan; the pieces of a Hugging Face model it runs on.
- :mod:`~leadline.lookahead.noise` — the gradient noise scale and tokens per step (B*).
- :mod:`~leadline.lookahead.rate` — alpha1, the look-ahead rate, the LookaheadSchedule and its ending.
- :mod:`~leadline.lookahead.memory` — the ramp: the micro-batch a training run fits.
- :mod:`~leadline.lookahead.distributed` — derive() inside a torchrun job (DDP, FSDP), the scale-out.
- ``runner``, ``pieces``, ``strategy``, ``budget``, ``world``: what derive()'s phases run in.

``import leadline.lookahead`` loads nothing else.
"""
