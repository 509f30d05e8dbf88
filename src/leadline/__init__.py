"""leadline: fine-tuning hyperparameters sounded from your machine and your task.

The default run is :func:`run_in_one` (``leadline run``): one load of the model, the rate raced
on the run's opening steps, one guarded loop, and a :class:`RunResult`; :func:`race_only` is its
race alone. On a Hugging Face model: :func:`derive_for` a plan, :func:`train_with_plan` or
``Trainer`` with :func:`training_arguments` and :class:`LeadlineCallback` to train it. Every number
comes back as a :class:`Value` with its kind, its source sentence and its evidence, in a
:class:`Plan`; bad input raises :class:`InputError`, one sentence naming the input and the fix.
``import leadline`` loads no torch: the heavy parts load when first used.

The look-ahead effort (``--effort full``, ``effort="full"``) lives in :mod:`leadline.lookahead`,
reached through ``derive_for(..., effort="full")``; its names are not part of this surface.
"""

from __future__ import annotations

import importlib
from typing import Any

from leadline._version import __version__
from leadline.errors import InputError, LeadlineError
from leadline.plan import KINDS as KINDS  # the plan's kinds, as the top level named them before
from leadline.plan import Plan, Value

_API: dict[str, str] = {
    # the default run: one load, the opening race, the guarded loop
    "run_in_one": "leadline.run",
    "race_only": "leadline.run",
    "RunOptions": "leadline.run",
    "RunResult": "leadline.run.result",
    # a Hugging Face model: the plan, the run, Trainer
    "derive_for": "leadline.hf",
    "train_with_plan": "leadline.train",
    "load_model": "leadline.hf",
    "load_tokenizer": "leadline.hf",
    "training_arguments": "leadline.hf",
    "LeadlineCallback": "leadline.hf",
}
"""The documented API, name -> module, loaded on first use so ``import leadline`` stays light."""

_EARLIER: dict[str, str] = {
    "stats": "leadline.stats",
    "profile_corpus": "leadline.corpus",
    "CorpusProfile": "leadline.corpus",
    "read_rows": "leadline.corpus",
    "tokenize_rows": "leadline.corpus",
    "collate": "leadline.corpus",
    "pack_steps": "leadline.corpus",
    "split_rows": "leadline.corpus",
    "TrainingStep": "leadline.memory",
    "forbid_spill": "leadline.memory",
    "lift_cap": "leadline.memory",
    "watched": "leadline.memory",
    "SpillWatch": "leadline.memory",
    "measure_fit": "leadline.memory",
    "ramp": "leadline.lookahead.memory",
    "measure_noise_scale": "leadline.lookahead.noise",
    "ModelGradFn": "leadline.lookahead.noise",
    "NoiseScale": "leadline.lookahead.noise",
    "tokens_per_step": "leadline.lookahead.noise",
    "NoiseMonitor": "leadline.lookahead.noise",
    "Controller": "leadline.lookahead.noise",
    "measure_first_step": "leadline.lookahead.rate",
    "lookahead_lr": "leadline.lookahead.rate",
    "LookaheadSchedule": "leadline.lookahead.rate",
    "lookahead_from": "leadline.lookahead.rate",
    "derive": "leadline.lookahead.derive",
    "Corpus": "leadline.lookahead.pieces",
    "Pieces": "leadline.lookahead.pieces",
}
"""Names the top level exported before, still resolvable from it for code that imports them so,
and not part of ``__all__``: import them from their home (the module named here)."""

_LAZY: dict[str, str] = {**_API, **_EARLIER}

__all__ = ["InputError", "LeadlineError", "Plan", "Value", "__version__", *sorted(_API)]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'leadline' has no attribute {name!r}")
    mod = importlib.import_module(module)
    obj = mod if module.endswith("." + name) and not hasattr(mod, name) else getattr(mod, name)
    globals()[name] = obj
    return obj


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
