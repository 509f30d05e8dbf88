"""What a run did, as typed records the CLI, the report and Trainer read by attribute, and the
run's files written once, at the end (:func:`write`).

``RunResult.as_dict()`` is ``run.json``: written once, at the end, with every second in it.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from leadline._io import save_run, write_atomic

if TYPE_CHECKING:
    import torch

    from leadline.plan import Plan

EXIT_NOT_IMPROVED = 3
"""``leadline run``'s exit status when the kept model is no better than the start on the held-out
rows, or its answers collapsed: the run finished, and its result is not worth using as it is."""


@dataclass(frozen=True)
class Reading:
    """A mean loss over rows and its standard error.

    Examples:
        >>> r = Reading.of([1.0, 2.0, 3.0])
        >>> r.mean, round(r.se, 4), r.rows
        (2.0, 0.5774, 3)
    """

    mean: float
    se: float
    rows: int

    @classmethod
    def of(cls, losses: Sequence[float]) -> Reading:
        from leadline.stats import mean_se

        if len(losses) > 1 and all(math.isfinite(x) for x in losses):
            m, se = mean_se(losses)
        else:
            m, se = (math.fsum(losses) / len(losses) if losses else math.nan), math.inf
        return cls(m, se, len(losses))


@dataclass
class RunCost:
    """Where the run's steps and reads went."""

    kept_steps: int = 0  # the opening's steps the run kept
    overhead_steps: int = 0  # steps taken and not kept (the race's losers)
    run_steps: int = 0  # the run's planned length
    held_out_reads: int = 0  # the opening's reads
    check_reads: int = 0  # the guard's reads
    check_rows: int = 0  # the held-out rows each check reads
    check_seconds: float = 0.0  # the guard's reads and copies
    steps_not_run: int = 0  # steps the guard's stop saved
    budget_share: float = 0.0

    @property
    def overhead_share(self) -> float:
        return self.overhead_steps / self.run_steps if self.run_steps else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "overhead_share": self.overhead_share,
                "budget_held": self.overhead_steps <= self.budget_share * self.run_steps + 1e-9}


@dataclass
class RunResult:
    """The run: its length and shape, the rate, the guard's checks, the verdicts, the cost.

    ``outcome``: ``"improved"``, ``"no_better_than_start"`` (the start's weights kept, no adapter
    written) or ``"collapsed"`` (the kept model answers one answer for most held-out rows).
    """

    steps: int
    micro_batch: int
    grad_accum: int
    lr: float
    train_rows: int
    seed: int
    optimizer: str = "schedule_free_adamw"
    curve: list[dict[str, Any]] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    cost: RunCost = field(default_factory=RunCost)
    held_out_before: Reading | None = None
    held_out_after: Reading | None = None
    test_before: Reading | None = None
    test_after: Reading | None = None
    test_source: str | None = None  # "eval rows" (the user's file) or "test share"
    outcome: str = "improved"
    kept_step: int | None = None
    trained: bool = True
    data_notes: list[str] = field(default_factory=list)  # what leadline changed in the rows: cut, dropped, mixed
    seconds: dict[str, float] = field(default_factory=dict)
    passes: int | None = None  # the passes a run whose length was not given took (leadline.run.length)
    extra_pass_steps: int = 0  # the steps of its passes after the first
    answers: Any = None  # a classifier's answers before and after (leadline.run.answers.Answers); None: free text

    @property
    def improved(self) -> bool:
        return self.outcome == "improved"

    @property
    def rollbacks(self) -> int:
        return sum(1 for c in self.checks if c["action"] in ("rollback", "stop"))

    @property
    def steps_run(self) -> int:
        return self.steps - self.cost.steps_not_run

    def lines(self, plan: Plan) -> list[str]:
        """What the terminal shows of the run after the plan: the rate and where it came from, the
        run's length, the decision's overhead, the guard and each rollback, the losses before and
        after, a classifier's accuracy and answers before and after, and where the run did not
        improve, the one sentence that says so and what to try."""
        from leadline.rate.guard import outcome_sentence

        cost, ran, out = self.cost, self.steps_run, []
        out.append(textwrap.fill(f"the rate: {plan['lr'].source}", width=99, subsequent_indent="  "))
        out.append(f"lr {plan['lr'].value:.3g}, schedule-free AdamW, {self.steps} steps of "
                   f"{self.micro_batch * self.grad_accum} rows"
                   + (f" planned, {ran} run (the guard stopped it at its best check)" if ran < self.steps else "")
                   + (f" over {self.passes} passes" if self.passes and self.passes > 1 else ""))
        out.append(f"the decision's overhead: {cost.overhead_steps} steps not kept ({cost.overhead_share:.0%} of the "
                   f"run), {cost.held_out_reads} held-out reads")
        out.append(textwrap.fill(f"the guard: {plan['guard'].source}", width=99, subsequent_indent="  "))
        for c in self.checks:
            if c["action"] in ("rollback", "stop", "restore"):
                out.append(f"  step {c['step']}: held-out loss {c['loss']:.4g} ({c.get('why', 'scheduled')}), "
                           f"significantly worse than step {c['to_step']}'s: put back"
                           + (f", the rate now {c['lr']:.3g}" if c["action"] == "rollback" else ""))
        b, a = self.held_out_before, self.held_out_after
        if b is not None and a is not None:
            out.append(f"held-out loss {b.mean:.4f} ± {b.se:.4f} before, {a.mean:.4f} ± {a.se:.4f} after on {b.rows} "
                       "rows (the rows the decisions read)")
        if self.test_after is not None and self.test_before is not None:
            t0, t1 = self.test_before, self.test_after
            out.append(f"{self.test_source} loss {t0.mean:.4f} ± {t0.se:.4f} before, {t1.mean:.4f} ± {t1.se:.4f} "
                       f"after on {t1.rows} rows no decision read")
        if self.answers is not None:  # a classifier's rows: its accuracy and the answers' spread, beside the loss
            out.extend(self.answers.lines())
        if not self.improved:
            out.append(textwrap.fill(outcome_sentence(self.outcome, b.mean if b else 0.0, a.mean if a else 0.0),
                                     width=99))
        return out

    def as_dict(self) -> dict[str, Any]:
        """``run.json``."""
        out: dict[str, Any] = {k: getattr(self, k) for k in (
            "steps", "micro_batch", "grad_accum", "lr", "train_rows", "seed", "optimizer", "curve", "checks",
            "outcome", "kept_step", "trained", "test_source", "data_notes", "passes", "extra_pass_steps")}
        out["cost"] = self.cost.as_dict()
        out["rules"] = rules()
        for name in ("held_out_before", "held_out_after"):
            r = getattr(self, name)
            out[name] = asdict(r) if r is not None else None
        if self.test_after is not None:  # the names earlier leadline versions wrote
            out["test_loss_after"] = asdict(self.test_after)
            out["test_rows"] = self.test_after.rows
        if self.test_before is not None:
            out["test_loss_before"] = asdict(self.test_before)
        out["answers"] = self.answers.as_dict() if self.answers is not None else None
        out.update({k: round(v, 3) for k, v in self.seconds.items()})
        return out


def write(plan: Plan, result: RunResult | None, model: torch.nn.Module, out_dir: str | os.PathLike[str] | None) -> None:
    """Into ``out_dir`` (nothing where None): ``plan.json``, and with a result the adapter or the
    weights (none where the run ended no better than its start) and ``run.json``, each written whole."""
    if out_dir is None:
        return
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if result is not None:
        if result.outcome == "no_better_than_start":
            write_atomic(out / "run.json", json.dumps(result.as_dict(), indent=1, default=str))
        else:
            from leadline.run.card import write_card

            save_run(model, out, result.as_dict())
            write_card(out, plan, result.as_dict(), model)  # README.md: the base, the data, the values, the readings
    plan.to_json(out / "plan.json")


class Rules(TypedDict):
    """The rules a run's result depends on (``run.json``'s ``rules``)."""

    give_back: float  # the guard's share of the fall a rollback needs (leadline.rate.guard.GIVE_BACK)
    end: str  # what the end keeps (leadline.rate.guard.END_RULE)
    pass_rule: str  # what a pass's end is read against (leadline.run.length.PASS_RULE)
    max_passes: int  # the most passes a run of no given length takes


def rules() -> Rules:
    """The run's rules that a result depends on, by name (``run.json``'s ``rules``): a record of another
    version's rules tells a board that its run was not this version's."""
    from leadline.rate.guard import END_RULE, GIVE_BACK
    from leadline.run.length import MAX_PASSES, PASS_RULE

    return {"give_back": GIVE_BACK, "end": END_RULE, "pass_rule": PASS_RULE, "max_passes": MAX_PASSES}
