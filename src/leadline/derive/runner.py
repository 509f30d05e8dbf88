"""What wraps derive()'s phases without living inside them: the time budget, progress, the
resume file, and the guard that makes derive() leave no trace."""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leadline.errors import InputError
from leadline.plan import Plan, Value

ProgressFn = Callable[[dict[str, Any]], None]

RESUME_FORMAT = 1


class OutOfTime(Exception):
    """Raised inside a phase (from its progress callback) when derive's max_seconds is spent;
    the phase's own guard restores what it touched, and the runner records the cut."""


@dataclass
class PhaseRunner:
    """Runs derive()'s phases in order under one time budget, reports progress, and keeps
    a resume file (the plan so far and the finished phases, written atomically after each).

    A phase is ``fn() -> dict[str, Value]``; its values go into the plan. A phase that the
    budget does not reach is listed in ``plan.notes`` and in :attr:`skipped`.
    """

    plan: Plan
    max_seconds: float | None = None
    on_progress: ProgressFn | None = None
    resume_path: Path | None = None
    fingerprint: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    finished: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
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
            raise InputError(f"resume file {self.resume_path} is not a leadline resume file; delete it or pass another path") from None
        theirs = d.get("fingerprint", {})
        differ = sorted(k for k in set(theirs) | set(self.fingerprint) if theirs.get(k) != self.fingerprint.get(k))
        if differ:
            raise InputError(f"resume file {self.resume_path} is from a different run ({', '.join(differ)} differ); delete it or pass another path")
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

        d = {"leadline_resume": RESUME_FORMAT, "finished": self.finished, "plan": self.plan.to_dict(), "extra": self.extra,
             "fingerprint": self.fingerprint}
        write_atomic(self.resume_path, json.dumps(d, allow_nan=True))

    # ---- budget and progress ------------------------------------------------------------
    def elapsed(self) -> float:
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
        if self.on_progress is not None:
            self.on_progress({"phase": phase, "status": status, "elapsed_s": self.elapsed(), **info})

    def run(self, name: str, fn: Callable[[], Mapping[str, Value] | None], *, needs: Sequence[str] = (),
            always: bool = False) -> bool:
        """Run one phase unless it finished in a resumed derive, the budget is spent, or a
        value it needs is missing. Returns True when the phase's values are in the plan.
        ``always``: arithmetic on numbers already measured, run whatever the budget says."""
        if name in self.restored:
            self.progress(name, "resumed")
            return True
        missing = [n for n in needs if self.plan.get(n) is None]  # a value that did not resolve (None) is missing too
        if missing:
            self.skipped.append(name)
            self.plan.notes.append(f"{name}: not run, it needs {', '.join(missing)}, which no earlier phase produced or resolved")
            self.progress(name, "skipped", reason=f"needs {', '.join(missing)}")
            return False
        left = self.seconds_left()
        if left is not None and left <= 0 and not always:
            self.skipped.append(name)
            self.plan.notes.append(f"{name}: not reached within max_seconds={self.max_seconds:g}")
            self.progress(name, "skipped", reason="max_seconds")
            return False
        self.progress(name, "start")
        t0 = time.monotonic()
        try:
            values = fn() or {}
        except OutOfTime:
            self.skipped.append(name)
            took = time.monotonic() - t0
            self.plan.notes.append(f"{name}: cut by max_seconds={self.max_seconds:g} after {took:.1f} s of it; its state was restored")
            self.progress(name, "skipped", reason="cut by max_seconds")
            return False
        for n, v in values.items():
            self.plan.set(n, v)
        self.finished.append(name)
        self._save()
        self.progress(name, "done", seconds=time.monotonic() - t0,
                      summary="; ".join(f"{n}={v.value}" for n, v in values.items() if not isinstance(v.value, (list, dict))))
        return True

    def done(self) -> None:
        """derive() finished: the resume file is no longer needed."""
        if self.resume_path is not None and self.resume_path.exists():
            self.resume_path.unlink()


# ---- no trace ---------------------------------------------------------------------------
def tensors_digest(tensors: Sequence[Any]) -> str:
    """sha256 over the bytes of ``tensors`` (moved to the CPU): equal digests, equal weights."""
    h = hashlib.sha256()
    for t in tensors:
        a = t.detach()
        if a.dtype.is_floating_point and a.dtype.itemsize == 2:
            a = a.view(__import__("torch").int16)
        h.update(a.contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


@contextlib.contextmanager
def leave_no_trace(params: Sequence[Any] = (), optimizers: Sequence[Any] = ()) -> Iterator[None]:
    """Restore on every exit path what derive() may touch: the trained tensors' values (from a
    copy kept on the CPU), the optimizers' state and hyperparameters, the RNG states of Python,
    NumPy and torch (CPU and CUDA)."""
    torch = sys.modules.get("torch")
    py_state = random.getstate()
    np_mod = sys.modules.get("numpy")
    np_state = np_mod.random.get_state() if np_mod is not None else None
    torch_state = torch.random.get_rng_state() if torch is not None else None
    cuda_states = None
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda_states = torch.cuda.get_rng_state_all()
    copies = [p.detach().to("cpu", copy=True) for p in params]
    groups = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] for opt in optimizers]
    try:
        yield
    finally:
        if copies:
            with torch.no_grad():
                for p, c in zip(params, copies):
                    p.copy_(c.to(p.device))
                    p.grad = None
        for opt, saved in zip(optimizers, groups):
            opt.state.clear()
            for g, s in zip(opt.param_groups, saved):
                g.update(s)
        random.setstate(py_state)
        if np_state is not None:
            np_mod.random.set_state(np_state)
        if torch_state is not None:
            torch.random.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
