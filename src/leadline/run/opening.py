"""The opening race's driver: each candidate rate runs the run's first ``h`` steps from one start.

The rule is :mod:`leadline.rate.opening` (pure); this module runs it on the model: it restores the
start for each candidate, steps it with its own schedule-free AdamW, reads the held-out rows at its
averaged weights, and keeps what the winner needs to go on (its weights, optimizer and RNG state).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from leadline.errors import InputError
from leadline.rate.compare import compare
from leadline.rate.opening import ALPHA, ANSWER_ROWS, Reading, answer_set, answers_chosen, collapsed


def optimizer(params: list[Any], lr: float, warmup: int) -> Any:
    try:
        import schedulefree
    except ImportError:
        raise InputError("leadline run trains with schedule-free AdamW; pip install 'leadline[hf]' (it brings "
                         "schedulefree), or pass --effort full") from None
    return schedulefree.AdamWScheduleFree(params, lr=lr, warmup_steps=warmup, weight_decay=0.0)


class Opening:
    """The candidates' runs from one start: each restores the start, runs ``h`` steps with its
    own optimizer, reads the held-out rows at its averaged weights, and keeps what the winner
    needs to go on (its weights in train mode, its optimizer, the RNG state)."""

    def __init__(self, task: Any, params: list[Any], step: Callable[[int], float], h: int, warmup: int) -> None:
        import torch

        from leadline.rate.state import capture_rng

        self.task, self.params, self.step, self.h, self.warmup = task, params, step, h, warmup
        self.start = [p.detach().clone() for p in params]
        self.rng = capture_rng()
        self.kept: dict[float, tuple[list[Any], Any, dict[str, Any]]] = {}
        self.read = task.held_out_losses()
        self.answers = answer_set(task.rows, task.split.train)
        self.asked = list(task.split.held_out)[:ANSWER_ROWS]  # the rows a challenger's answers are chosen on
        self.gold = ([self.answers.index(a) if a in self.answers else -1 for a in
                      (tuple(task.rows[i].input_ids[first_scored(task.rows[i]):]) for i in self.asked)]
                     if self.answers else None)
        self.incumbent: float | None = None  # the first rate run: the default, whose answers are not checked
        self.incumbent_losses: list[float] = []
        self.reads = self.steps = 0
        self.read_seconds = self.step_seconds = 0.0
        self.torch = torch

    def __call__(self, lr: float) -> Reading:
        from leadline.rate.state import capture_rng, restore_rng

        with self.torch.no_grad():
            for p, s in zip(self.params, self.start):
                p.copy_(s)
        restore_rng(self.rng)
        opt = optimizer(self.params, lr, self.warmup)
        self.task.model.train()
        opt.train()
        t = time.perf_counter()
        finite = _take_steps(opt, self.step, range(self.h))
        self.step_seconds += time.perf_counter() - t
        self.steps += self.h
        self.kept[lr] = ([p.detach().clone() for p in self.params], opt, capture_rng())
        if not finite:
            return Reading(lr, [math.inf] * max(1, len(self.task.split.held_out)))
        opt.eval()
        t = time.perf_counter()
        losses = self.read()
        if self.incumbent is None:
            self.incumbent, self.incumbent_losses = lr, losses
        # the answers are read only for a challenger that reads lower than the default: the one that could replace it
        could_win = (self.answers is not None and lr != self.incumbent
                     and compare(losses, self.incumbent_losses, alpha=ALPHA).better)
        choices = (answers_chosen(self.task.model, self.task.rows, self.asked, self.answers, self.task.device,
                                  self.task.pad_id) if could_win else None)
        self.read_seconds += time.perf_counter() - t
        self.reads += 1
        opt.train()
        gone = choices is not None and collapsed(choices, self.gold or [])
        return Reading(lr, losses, choices, gone)

    def rewind(self) -> None:
        """The start put back, bit for bit, with the RNG as it stood there; every copy freed."""
        from leadline.rate.state import restore_rng

        with self.torch.no_grad():
            for p, s in zip(self.params, self.start):
                p.copy_(s)
        restore_rng(self.rng)
        self.kept.clear()
        self.start = []

    def resume(self, lr: float) -> Any:
        """The winner's weights, RNG and optimizer put back; the others' copies freed."""
        from leadline.rate.state import restore_rng

        weights, opt, rng = self.kept[lr]
        with self.torch.no_grad():
            for p, w in zip(self.params, weights):
                p.copy_(w)
        restore_rng(rng)
        self.kept.clear()
        self.start = []
        return opt


def first_scored(row: Any) -> int:
    return next((p for p, lab in enumerate(row.labels) if lab != -100), len(row.labels))


def _take_steps(opt: Any, step: Callable[[int], float], steps: range,
                on_step: Callable[[dict[str, Any]], None] | None = None, t0: float | None = None) -> bool:
    """The optimizer steps ``steps`` through the run's one loop (no guard: the race reads its own);
    False at the first non-finite loss (the step not taken)."""
    from leadline.run.loop import guarded_steps

    return guarded_steps(opt, step, steps, on_step=on_step, t0=t0 or 0.0).diverged_at is None


