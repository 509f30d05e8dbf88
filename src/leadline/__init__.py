"""leadline: fine-tuning hyperparameters sounded from your machine and your task.

The default run is :func:`run_in_one` (``leadline run``): one load of the model, the rate raced
on the run's opening steps, one guarded loop, and a :class:`RunResult`. Every number comes back
as a :class:`Value` with its kind, its source sentence and its evidence. ``import leadline``
loads no torch: the heavy parts load when first used.
"""

from __future__ import annotations

import importlib
from typing import Any

from leadline._version import __version__
from leadline.errors import InputError, LeadlineError
from leadline.plan import KINDS, Plan, Value

# The public surface, name -> module. Loaded on first use so `import leadline` stays light.
_LAZY: dict[str, str] = {
    # the default run: one load, the opening race, the guarded loop
    "run_in_one": "leadline.run",
    "RunOptions": "leadline.run",
    "RunResult": "leadline.run.result",
    # the statistics
    "stats": "leadline.stats",
    # the corpus
    "profile_corpus": "leadline.corpus",
    "CorpusProfile": "leadline.corpus",
    "read_rows": "leadline.corpus",
    "tokenize_rows": "leadline.corpus",
    "collate": "leadline.corpus",
    "pack_steps": "leadline.corpus",
    "split_rows": "leadline.corpus",
    # memory
    "TrainingStep": "leadline.memory",
    "ramp": "leadline.lookahead.memory",
    "forbid_spill": "leadline.memory",
    "lift_cap": "leadline.memory",
    "watched": "leadline.memory",
    "SpillWatch": "leadline.memory",
    "measure_fit": "leadline.memory",
    # the look-ahead effort (leadline.lookahead): the noise scale and tokens per step
    "measure_noise_scale": "leadline.lookahead.noise",
    "ModelGradFn": "leadline.lookahead.noise",
    "NoiseScale": "leadline.lookahead.noise",
    "tokens_per_step": "leadline.lookahead.noise",
    "NoiseMonitor": "leadline.lookahead.noise",
    "Controller": "leadline.lookahead.noise",
    # the look-ahead's rate
    "measure_first_step": "leadline.lookahead.rate",
    "lookahead_lr": "leadline.lookahead.rate",
    "LookaheadSchedule": "leadline.lookahead.rate",
    "lookahead_from": "leadline.lookahead.rate",
    # derive
    "derive": "leadline.lookahead.derive",
    "Corpus": "leadline.lookahead.pieces",
    "Pieces": "leadline.lookahead.pieces",
}

__all__ = ["KINDS", "InputError", "LeadlineError", "Plan", "Value", "__version__", *sorted(_LAZY)]


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
