"""The look-ahead's result record: :class:`Lookahead` (the rate, every horizon it read, why it
stopped) and :class:`Branch` (a candidate's run handed back for the run to continue from).

The search itself is :func:`leadline.lookahead.rate.lookahead.lookahead_lr`; this module only holds what it
returns and how that becomes the plan's values (:meth:`Lookahead.as_values`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from leadline.lookahead.rate.warmup import warmup_values
from leadline.plan import Value

LookaheadStop = Literal["unsettled", "budget", "diverged", "settled", "run_length", "max_seconds"]
"""Why the look-ahead stopped: the horizons ran out unsettled, the
step budget, every rate diverged or was unstable, the trend settled, the run's length, derive's
max_seconds. ``stopped_because`` is the sentence shown for it."""


@dataclass
class Branch:
    """A candidate's run the look-ahead handed back: ``steps`` optimizer steps at ``lr`` from the
    origin, without a warmup unless ``warmup_steps``, and its state after them (a
    :class:`~leadline.rate.state.Snapshot` of the trained tensors, the optimizer's state and the
    RNG states).

    Examples:
        Four weights trained from 0 toward 0.01 (as in :func:`~leadline.lookahead.rate.lookahead_lr`): the
        best grid rate at the last horizon, 0.01 / 8, after its 8 steps; loading the snapshot
        puts the run where that candidate left it:

        >>> import torch
        >>> from leadline.lookahead.rate import lookahead_lr
        >>> w = torch.zeros(4, requires_grad=True)
        >>> opt = torch.optim.Adam([w])
        >>> train_step = lambda step: ((w - 0.01) ** 2).mean().backward()
        >>> held_out = lambda: ((w - 0.01) ** 2).tolist()
        >>> b = lookahead_lr([w], opt, train_step, held_out, 0.01, total_steps=16, warmup_steps=0,
        ...                  keep_branch=True).branch
        >>> b.lr, b.steps, b.warmup_steps
        (0.00125, 8, 0)
        >>> b.snapshot.load([w], opt)
        >>> [round(x, 4) for x in w.tolist()]
        [0.0093, 0.0093, 0.0093, 0.0093]
    """

    lr: float
    steps: int
    snapshot: Any
    warmup_steps: int = 0
    alpha1: float | None = None


@dataclass
class Lookahead:
    """The look-ahead's answer and everything it read.

    Attributes:
        lr: the rate.
        rates: the grid tried.
        horizon_steps: the last horizon read — the schedule's check interval h.
        horizons: per horizon, every candidate's mean held-out loss, SE, status and test.
        stopped_because: the sentence saying why it stopped (displayed; ``stop`` is the reason).
        stop: why it stopped, one of :data:`LookaheadStop`.

    Examples:
        A look-ahead's values:

        >>> la = Lookahead(lr=2e-3, alpha1=1e-3, rates=[5e-4, 1e-3, 2e-3], horizon_steps=16,
        ...                steps_used=150, budget_steps=200, total_steps=100, warmup_steps=0, beta1=0.9,
        ...                stopped_because="settled", held_out_rows=64, stop="settled")
        >>> values = la.as_values()
        >>> list(values)
        ['lr', 'lookahead_horizon_steps', 'warmup_steps', 'weight_decay']
        >>> [v.kind for v in values.values()]
        ['measured', 'measured', 'constant', 'constant']
        >>> values["lr"].value, values["lookahead_horizon_steps"].value
        (0.002, 16)
    """

    lr: float
    alpha1: float
    rates: list[float]
    horizon_steps: int
    steps_used: int
    budget_steps: int
    total_steps: int
    warmup_steps: int
    beta1: float
    stopped_because: str
    held_out_rows: int = 0
    horizons: list[dict[str, Any]] = field(default_factory=list)
    trend_slope: float | None = None
    snapshots: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    stop: LookaheadStop = "unsettled"
    warmup_race: dict[str, Any] | None = None
    branch: Branch | None = field(default=None, repr=False, compare=False)

    def evidence(self) -> dict[str, Any]:
        return {"plot": "lookahead", "horizons": self.horizons, "chosen_lr": self.lr, "alpha1": self.alpha1,
                "rates": self.rates, "steps_used": self.steps_used, "budget_steps": self.budget_steps,
                "total_steps": self.total_steps, "stopped_because": self.stopped_because, "stop": self.stop,
                "trend_slope": self.trend_slope, "held_out_rows": self.held_out_rows, "snapshots": self.snapshots,
                "candidate_warmup_steps": self.warmup_steps,
                **({"warmup_race": self.warmup_race} if self.warmup_race else {})}

    def as_values(self) -> dict[str, Value]:
        """``lr``, ``lookahead_horizon_steps``, ``warmup_steps``, ``weight_decay``."""
        out: dict[str, Value] = {}
        out["lr"] = Value(
            self.lr, "measured",
            f"look-ahead: {len(self.rates)} rates alpha1 x 2^j run by the optimizer from the same weights on the "
            f"same rows, compared on {self.held_out_rows} held-out rows by a paired sequential test, up to "
            f"{self.horizon_steps} steps ({self.stopped_because}; {self.steps_used} steps of a "
            f"{self.budget_steps}-step budget)",
            evidence=self.evidence(), seconds=self.seconds, unit="per step")
        out["lookahead_horizon_steps"] = Value(self.horizon_steps, "measured",
                                               "the horizon the look-ahead's answer was read at "
                                               f"({self.stopped_because}); LookaheadSchedule checks every this "
                                               "many steps", unit="steps")
        out.update(warmup_values(self.alpha1, self.lr, beta1=self.beta1, race=self.warmup_race))
        return out
