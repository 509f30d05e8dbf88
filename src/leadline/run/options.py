"""What a run is asked to do (:class:`RunOptions`) and the recipe's constants it falls back on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from leadline.errors import InputError
from leadline.plan import Value
from leadline.rate.opening import DECIDE_SHARE

ROWS_PER_STEP = 16
"""The step's rows: the default recipe's (a constant: a run of a few hundred steps cannot pay for
the noise probe that would measure it)."""
WARMUP_SHARE = 0.02
"""Schedule-free's warmup: 2% of the run (the setting that won AlgoPerf's self-tuning track)."""


@dataclass(frozen=True)
class RunOptions:
    """The run's options, each with the default ``leadline run`` uses.

    Args:
        total_steps: the run's length in optimizer steps (None: ``epochs`` passes over the training rows).
        epochs: passes over the training rows where ``total_steps`` is not given (None: one).
        rows_per_step: the rows a step takes (None: :data:`ROWS_PER_STEP`, listed as a constant).
        decide_share: the share of the run's steps the race's losers may cost
            (:data:`leadline.rate.opening.DECIDE_SHARE`).
        seed: the split and the rows' order.
        seq_len: the longest row in tokens (None: the corpus's longest).
        fields: the columns that hold the prompt and the completion, where they are not the usual names.
        test_share: a share of the rows kept out of training and deciding, for a verdict (0: none).
        eval_data: the user's own rows for that verdict (else the verdict is on the held-out rows
            the decisions read, and the result says so).
        train_held_out: the held-out rows no check reads train after the opening race (the
            default; False keeps every held-out row out of training; the run alone: a race alone
            trains nothing).
        rate: a rate already decided or given (``--lr``, or a race's plan's ``lr``), with its source:
            no race, the run trains at it from the start under the same guard.

    Examples:
        >>> RunOptions(total_steps=20, decide_share=0.1).rows_per_step is None
        True
        >>> RunOptions(test_share=0.5)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: test_share=0.5 must be a share in [0, 0.5); pass 0 (the default) or e.g. 0.1
    """

    total_steps: int | None = None
    epochs: float | None = None
    rows_per_step: int | None = None
    decide_share: float = DECIDE_SHARE
    seed: int = 0
    seq_len: int | None = None
    fields: dict[str, str] | None = None
    test_share: float = 0.0
    eval_data: Any = None
    train_held_out: bool = True
    rate: Value | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.test_share < 0.5:
            raise InputError(f"test_share={self.test_share!r} must be a share in [0, 0.5); pass 0 (the default) or "
                             "e.g. 0.1")


def options_of(options: RunOptions | None) -> RunOptions:
    """``options`` as given, the defaults where None; anything else is refused in one sentence.

    Examples:
        >>> options_of(None) == RunOptions()
        True
        >>> options_of({"total_steps": 20})
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: options must be a RunOptions (from leadline import RunOptions), got dict; pass ...
    """
    if options is None:
        return RunOptions()
    if not isinstance(options, RunOptions):
        given = ", ".join(f"{k}={v!r}" for k, v in options.items()) if isinstance(options, dict) else "..."
        raise InputError(f"options must be a RunOptions (from leadline import RunOptions), got "
                         f"{type(options).__name__}; pass RunOptions({given})")
    return options
