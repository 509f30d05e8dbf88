"""The run's first steps, kept: the look-ahead's winning branch saved beside the plan.

The look-ahead runs the real optimizer on the run's own rows in the run's order at the plan's
batch (``train_step(t)`` for t < n is the run's step t), never on the held-out or test rows. The
branch of the best grid rate at its last horizon is therefore a valid start of the run: its
trained tensors, the optimizer's state and the RNG states after n steps. Inside
:func:`keep_run_state`, derive() saves it (``state.pt`` and ``state.json`` in a folder, written
to a temporary name and renamed when the caller commits); :func:`load_run_state` reads it back
and :meth:`RunState.why_not` says why a run cannot continue from it (None when it can).

    with keep_run_state("plan.state") as kept:
        plan = derive_for(model, tok, "train.jsonl", effort="full", total_steps=200)
        plan.to_json("plan.json")
        kept.commit()
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leadline._io import write_atomic
from leadline.errors import InputError

STATE_FORMAT = 1

_KEEPER: contextvars.ContextVar[StateKeeper | None] = contextvars.ContextVar("leadline_state_keeper", default=None)


@dataclass
class StateKeeper:
    """Where derive() puts the branch it keeps: ``path`` once committed, a temporary folder
    beside it until then. ``meta`` is what was saved (None: nothing was)."""

    path: Path
    tmp: Path | None = None
    meta: dict[str, Any] | None = None

    def commit(self) -> Path | None:
        """Move the saved state to ``path`` (replacing what was there); the path, or None when
        derive kept nothing."""
        if self.tmp is None or not self.tmp.exists():
            return None
        if self.path.is_dir() and not self.path.is_symlink():
            shutil.rmtree(self.path)
        elif self.path.exists() or self.path.is_symlink():
            self.path.unlink()
        os.replace(self.tmp, self.path)
        self.tmp = None
        return self.path

    def discard(self) -> None:
        if self.tmp is not None and self.tmp.exists():
            shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp = None


@contextlib.contextmanager
def keep_run_state(path: str | os.PathLike[str]) -> Iterator[StateKeeper]:
    """Inside this block derive()'s full-effort rate phase saves the look-ahead's winning branch
    for ``path``; nothing reaches ``path`` before :meth:`StateKeeper.commit`, and an uncommitted
    state is removed on exit (an exception included)."""
    keeper = StateKeeper(Path(path))
    token = _KEEPER.set(keeper)
    try:
        yield keeper
    finally:
        _KEEPER.reset(token)
        keeper.discard()


def keeping() -> StateKeeper | None:
    """The keeper of the enclosing :func:`keep_run_state`, or None."""
    return _KEEPER.get()


def _device_kind(dev: Any) -> str:
    return "cpu" if dev is None or getattr(dev, "type", "cpu") == "cpu" else "param"


def save_branch(keeper: StateKeeper, branch: Any, params: Sequence[Any], facts: Mapping[str, Any]) -> dict[str, Any]:
    """Write ``branch`` (a :class:`~leadline.lookahead.rate.lookahead.Branch`) to a temporary folder beside
    ``keeper.path``; ``facts`` are what a run must match to continue from it (see
    :meth:`RunState.why_not`). ``params`` are the trained tensors at the branch's origin (the
    run's step 0); their digest is kept, not their values. Returns the meta written."""
    import torch

    from leadline.lookahead.digest import tensors_digest

    snap = branch.snapshot
    tensors = {"params": [t.detach().cpu() for t in snap.params],
               "opt_state": [{k: (v.detach().cpu() if torch.is_tensor(v) else v) for k, (v, _) in e.items()}
                             for e in snap.opt_state],
               "opt_place": [{k: _device_kind(dev) for k, (_, dev) in e.items()} for e in snap.opt_state],
               "rng_torch": (snap.rng or {}).get("torch"),
               "rng_cuda": list((snap.rng or {}).get("cuda") or [])}
    meta = {"leadline_state": STATE_FORMAT, "steps": int(branch.steps), "lr": float(branch.lr),
            "warmup_steps": int(branch.warmup_steps), "alpha1": branch.alpha1,
            "tensors": [[list(t.shape), str(t.dtype)] for t in snap.params],
            "origin_sha256": tensors_digest(list(params)), **dict(facts)}
    tmp = keeper.path.parent / f".{keeper.path.name}.tmp-{os.getpid()}"
    keeper.discard()
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    keeper.tmp = tmp
    torch.save(tensors, tmp / "state.pt")
    meta["bytes"] = (tmp / "state.pt").stat().st_size
    write_atomic(tmp / "state.json", json.dumps(meta, indent=1))
    keeper.meta = meta
    return meta


@dataclass
class RunState:
    """A saved branch: its meta (``state.json``) and where its tensors are (``state.pt``)."""

    path: Path
    meta: dict[str, Any]
    _tensors: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def steps(self) -> int:
        return int(self.meta["steps"])

    @property
    def lr(self) -> float:
        return float(self.meta["lr"])

    def why_not(self, facts: Mapping[str, Any], *, params: Sequence[Any], plan_lr: float,
                plan_warmup_steps: int, total_steps: int, ending_from: int | None) -> str | None:
        """Why a run with ``facts`` (the same keys derive saved: data, seed, batch, length) on the
        trained tensors ``params`` cannot continue from this state; None when it can.

        The run must read the same rows in the same order at the same rows a step, start from the
        same trained tensors (their digest), train at the branch's own rate (:func:`other_rate`)
        with the warmup the branch ran, and have steps left before its raced ending
        (``ending_from``: the step the ending's copy is taken at; None: no raced ending)."""
        from leadline.lookahead.digest import tensors_digest

        m = self.meta
        for key, what in (("data_sha256", "the data"), ("seed", "the seed (the split and the rows' order)"),
                          ("seq_len", "the length"), ("rows_per_step", "the rows a step"),
                          ("trained_parameters", "the trained parameter count")):
            if m.get(key) != facts.get(key):
                return f"{what} differs from derive's ({facts.get(key)!r} here, {m.get(key)!r} in the state)"
        shapes = [[list(p.shape), str(p.dtype)] for p in params]
        if shapes != m.get("tensors"):
            return "the trained tensors' shapes or dtypes differ from derive's"
        if tensors_digest(list(params)) != m.get("origin_sha256"):
            return "the trained tensors at step 0 differ from derive's (another model, adapter init or seed)"
        if other_rate(self.lr, plan_lr):
            return other_rate(self.lr, plan_lr)
        if int(plan_warmup_steps or 0) != int(m.get("warmup_steps") or 0):
            return (f"the plan warms up over {plan_warmup_steps} steps, the branch over {m.get('warmup_steps')}")
        if self.steps >= total_steps:
            return f"the branch's {self.steps} steps are not fewer than the run's {total_steps}"
        if ending_from is not None and self.steps >= ending_from:
            return (f"the branch's {self.steps} steps reach the raced ending, whose copy is taken at step "
                    f"{ending_from}")
        return None

    def load_into(self, params: Sequence[Any], opt: Any) -> None:
        """Put the branch's trained tensors, optimizer state and RNG states into ``params`` and ``opt``."""
        import torch

        from leadline.rate.state import Snapshot

        t = self._load()
        snap = Snapshot("host")
        snap.device = torch.device("cpu")
        snap.params = list(t["params"])
        snap.opt_state = [{k: (v, (p.device if place.get(k) == "param" else torch.device("cpu"))
                               if torch.is_tensor(v) else None) for k, v in e.items()}
                          for p, e, place in zip(params, t["opt_state"], t["opt_place"])]
        rng = {"torch": t["rng_torch"]} if t.get("rng_torch") is not None else None
        snap.rng = None
        snap.load(params, opt, rng=False)
        if rng is not None:
            torch.set_rng_state(rng["torch"])
        if t.get("rng_cuda") and torch.cuda.is_available():
            with contextlib.suppress(RuntimeError, ValueError):
                torch.cuda.set_rng_state_all(t["rng_cuda"])

    def _load(self) -> dict[str, Any]:
        if self._tensors is None:
            import torch

            try:
                self._tensors = torch.load(self.path / "state.pt", map_location="cpu", weights_only=True)
            except Exception:  # a truncated or foreign file: one sentence
                raise InputError(f"the state {self.path} cannot be read (state.pt); delete it or train with "
                                 "--fresh") from None
        return self._tensors


def other_rate(branch_lr: float, plan_lr: float) -> str | None:
    """Why a branch run at ``branch_lr`` is not the first steps of a run at the plan's ``plan_lr``;
    None when the two are the same rate.

    Only the same rate continues: when the look-ahead refines its estimate between the grid's
    rates (or the trend or the anchor replaces it), the branch's steps are another run's. A run
    that continued from such a branch (its 20 steps at 2.76e-3, then the plan's 2.13e-3) read
    0.950 on debian_sections against 0.964 from a fresh start (McNemar p 0.023; docs/rate.md).

    Examples:
        >>> other_rate(1e-3, 1e-3) is None, other_rate(2.76e-3, 2.13e-3)[:41]
        (True, "the plan's rate 0.00213 is not the branch")
    """
    if math.isclose(branch_lr, plan_lr, rel_tol=1e-9):
        return None
    return (f"the plan's rate {plan_lr:.3g} is not the branch's {branch_lr:.3g} (the look-ahead refined, carried "
            "or replaced its answer): the branch's steps are another run's")


def load_run_state(path: str | os.PathLike[str]) -> RunState:
    """The state :func:`save_branch` wrote to ``path`` (its meta read now, its tensors when loaded)."""
    p = Path(path)
    try:
        meta = json.loads((p / "state.json").read_text(encoding="utf-8"))
        if meta.get("leadline_state") != STATE_FORMAT or not isinstance(meta.get("steps"), int):
            raise ValueError
    except (OSError, ValueError, AttributeError):
        raise InputError(f"{p} is not a state leadline derive wrote (no readable state.json); delete it or train "
                         "with --fresh") from None
    return RunState(p, meta)
