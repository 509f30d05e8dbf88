"""What wraps derive()'s phases without living inside them: the time budget, progress and the
resume file. A phase is a function that returns its result; the runner puts the result's
``as_values()`` into the plan and hands the result back to the recipe. One process's derive
(:mod:`leadline.lookahead.derive`) and a job's (:mod:`leadline.lookahead.distributed`) both run their phases here."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from leadline.errors import InputError
from leadline.lookahead.budget import OutOfTime
from leadline.plan import TRAINING_NUMBERS, PhaseTime, Plan, Skipped, Value

ProgressFn = Callable[[dict[str, Any]], None]

RESUME_FORMAT = 1


class Measured(Protocol):
    """What a phase returns: a result object that says its values for the plan."""

    def as_values(self) -> Mapping[str, Value]: ...


R = TypeVar("R", bound=Measured)


@dataclass(frozen=True)
class Values:
    """The result of a phase that is arithmetic on numbers already in the plan: its values alone.

    Examples:
        >>> Values({"weight_decay": Value(0.0, "constant", "no decay")}).as_values()["weight_decay"].value
        0.0
    """

    values: Mapping[str, Value]

    def as_values(self) -> Mapping[str, Value]:
        return self.values


@dataclass(frozen=True)
class StepPhase:
    """The step phase's :class:`~leadline.lookahead.noise.StepPlan` (None in a job) and its values."""

    step: Any
    values: Mapping[str, Value]

    def as_values(self) -> Mapping[str, Value]:
        return self.values


@dataclass
class PhaseRunner:
    """Runs derive()'s phases in order under one time budget, reports progress, and keeps
    a resume file (the plan so far and the finished phases, written atomically after each).

    A phase is ``fn(*args, **kwargs) -> result`` with ``result.as_values()``; its values go
    into the plan. A phase that leaves no values is a :class:`~leadline.plan.Skipped` on
    ``plan.skipped`` (its sentence in ``plan.notes``) and its name in :attr:`skipped`.
    Every phase, run or not, is a :class:`~leadline.plan.PhaseTime` on ``plan.phases``: its
    seconds, the steps ``steps_taken()`` counted during it, and the training numbers
    ``numbers_of(plan)`` says it moved.
    """

    plan: Plan
    max_seconds: float | None = None
    on_progress: ProgressFn | None = None
    resume_path: Path | None = None
    fingerprint: dict[str, Any] = field(default_factory=dict)
    started: float | None = None
    finished: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    steps_taken: Callable[[], int] | None = None
    work_taken: Callable[[], tuple[float, int, float]] | None = None
    """(the steps' seconds, the held-out reads, their seconds) so far: each phase's share of them
    goes on its :class:`~leadline.plan.PhaseTime`."""
    numbers_of: Callable[[Plan], Mapping[str, Any]] | None = None
    expected: Sequence[str] = ()
    announced: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.started is None:
            self.started = time.monotonic()
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise InputError(f"max_seconds must be a positive number of seconds, got {self.max_seconds!r}")
        if self.resume_path is not None:
            self.resume_path = Path(self.resume_path)
            if self.resume_path.exists():
                self._load()

    # ---- resume -------------------------------------------------------------------------
    def _load(self) -> None:
        assert self.resume_path is not None
        try:
            d = json.loads(self.resume_path.read_text(encoding="utf-8"))
            if d.get("leadline_resume") != RESUME_FORMAT:
                raise ValueError
            saved = Plan.from_dict(d["plan"], origin=str(self.resume_path))
        except (OSError, ValueError, KeyError, TypeError):
            raise InputError(f"resume file {self.resume_path} is not a leadline resume file; delete it or pass another "
                             "path") from None
        theirs = d.get("fingerprint", {})
        differ = sorted(k for k in set(theirs) | set(self.fingerprint) if theirs.get(k) != self.fingerprint.get(k))
        if differ:
            raise InputError(f"resume file {self.resume_path} is from a different run ({', '.join(differ)} differ); "
                             "delete it or pass another path")
        for name, v in saved.values.items():
            self.plan.set(name, v)
        self.plan.held_out = saved.held_out or self.plan.held_out
        self.restored = list(d.get("finished", []))
        self.finished = list(self.restored)
        self.extra = dict(d.get("extra", {}))

    def _save(self) -> None:
        if self.resume_path is None:
            return
        from leadline._io import write_atomic

        d = {"leadline_resume": RESUME_FORMAT, "finished": self.finished, "plan": self.plan.to_dict(),
             "extra": self.extra, "fingerprint": self.fingerprint}
        write_atomic(self.resume_path, json.dumps(d, allow_nan=True))

    # ---- budget and progress ------------------------------------------------------------
    def elapsed(self) -> float:
        assert self.started is not None
        return time.monotonic() - self.started

    def seconds_left(self) -> float | None:
        return None if self.max_seconds is None else self.max_seconds - self.elapsed()

    def check_time(self, *_: Any) -> None:
        """Raise :class:`OutOfTime` when the budget is spent (a phase's progress callback),
        keeping 1% of it for what follows a cut (the state restored, the closing phases)."""
        left = self.seconds_left()
        if left is not None and left <= self.reserve():
            raise OutOfTime

    def reserve(self) -> float:
        """The seconds kept back from the phases for the work after a cut: 1% of max_seconds."""
        return 0.01 * (self.max_seconds or 0.0)

    def would_overrun(self, seconds: float) -> bool:
        """True when one more piece of work that took ``seconds`` last time would not fit in
        the budget: half again what it took (reads and steps vary) and 1% of the budget kept for
        what follows a cut (the state restored, the closing phases)."""
        left = self.seconds_left()
        return left is not None and left <= 1.5 * max(0.0, seconds) + self.reserve()

    def ensure(self, seconds: float) -> None:
        """Raise :class:`OutOfTime` unless ``seconds`` (what the next piece of work took last
        time) still fit in the budget: max_seconds bounds derive, not just where it checks."""
        if self.would_overrun(seconds):
            raise OutOfTime

    def progress(self, phase: str, status: str, **info: Any) -> None:
        """Tell ``on_progress`` of a phase; the first event also carries ``phases``, the names of
        the phases derive() will call (:attr:`expected`), so a bar knows its total."""
        if self.on_progress is not None:
            if self.expected and not self.announced:
                info = {"phases": list(self.expected), **info}
                self.announced = True
            self.on_progress({"phase": phase, "status": status, "elapsed_s": self.elapsed(), **info})

    def run(self, name: str, fn: Callable[..., R], /, *args: Any, needs: Sequence[str] = (), always: bool = False,
            **kwargs: Any) -> R | None:
        """Run one phase, ``fn(*args, **kwargs)``, unless it finished in a resumed derive, the
        budget is spent, or a value it needs is missing. Returns the phase's result, its values
        in the plan; None when the phase did not run here (resumed: its values came back from
        the resume file; skipped: see ``plan.skipped``).
        ``always``: arithmetic on numbers already measured, run whatever the budget says."""
        if name in self.restored:
            self.plan.phases.append(PhaseTime(name, 0.0, status="resumed"))
            self.progress(name, "resumed")
            return None
        missing = tuple(n for n in needs if self.plan.get(n) is None)  # a value that did not resolve is missing too
        if missing:
            self._skip(Skipped(name, "needs", needs=missing), reason=f"needs {', '.join(missing)}")
            return None
        left = self.seconds_left()
        if left is not None and left <= 0 and not always:
            self._skip(Skipped(name, "not_reached", max_seconds=self.max_seconds), reason="max_seconds")
            return None
        self.progress(name, "start")
        t0, steps0, work0, before = time.monotonic(), self._steps(), self._work(), self._numbers()
        try:
            result = self._call(name, functools.partial(fn, *args, **kwargs))
        except OutOfTime:
            took = time.monotonic() - t0
            self.plan.phases.append(PhaseTime(name, took, self._steps() - steps0, status="cut",
                                              **self._work_since(work0)))
            self._skip(Skipped(name, "cut", max_seconds=self.max_seconds, seconds=took), reason="cut by max_seconds")
            return None
        values = result.as_values()
        for n, v in values.items():
            self.plan.set(n, v)
        after = self._numbers()
        changed = tuple(n for n in TRAINING_NUMBERS if before.get(n) != after.get(n))
        self.plan.phases.append(PhaseTime(name, time.monotonic() - t0, self._steps() - steps0, changed,
                                          **self._work_since(work0)))
        self.finished.append(name)
        self._save()
        summary = "; ".join(f"{n}={v.value}" for n, v in values.items() if not isinstance(v.value, (list, dict)))
        self.progress(name, "done", seconds=time.monotonic() - t0, summary=summary)
        return result

    def _steps(self) -> int:
        return int(self.steps_taken()) if self.steps_taken is not None else 0

    def _work(self) -> tuple[float, int, float]:
        return self.work_taken() if self.work_taken is not None else (0.0, 0, 0.0)

    def _work_since(self, before: tuple[float, int, float]) -> dict[str, Any]:
        now = self._work()
        return {"step_seconds": now[0] - before[0], "reads": now[1] - before[1], "read_seconds": now[2] - before[2]}

    def _numbers(self) -> Mapping[str, Any]:
        if self.numbers_of is not None:
            return dict(self.numbers_of(self.plan))
        return {n: self.plan.get(n) for n in TRAINING_NUMBERS if n in self.plan}

    def _call(self, name: str, call: Callable[[], R]) -> R:
        """Run the phase (a job's runner runs it as an agreement of every rank)."""
        return call()

    def _skip(self, skipped: Skipped, *, reason: str) -> None:
        if skipped.reason != "cut":  # a cut phase's time is recorded where it was cut
            self.plan.phases.append(PhaseTime(skipped.phase, 0.0, status=skipped.reason))
        self.skipped.append(skipped.phase)
        self.plan.skipped.append(skipped)
        self.plan.notes.append(skipped.sentence())
        self.progress(skipped.phase, "skipped", reason=reason)

    def done(self) -> None:
        """derive() finished: the resume file is no longer needed."""
        if self.resume_path is not None and self.resume_path.exists():
            self.resume_path.unlink()


