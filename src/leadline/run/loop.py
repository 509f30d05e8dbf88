"""The run's one loop: optimizer steps, each rate set where a schedule sets it, the guard's watch
after each.

Every run trains through :func:`guarded_steps`: ``leadline run`` (schedule-free AdamW at its
decided rate under :class:`leadline.rate.watch.Watch`), a look-ahead plan through
:func:`leadline.train.train_with_plan` (the LookaheadSchedule's ``before`` setting each step's
rate and taking its checks, its Watch catching a non-finite loss) and the recipe (its warmup and
linear decay as ``before``, no guard: a non-finite loss ends the loop, and the caller says why), and the
opening race's candidates (:mod:`leadline.run.opening`, no guard either). The checks,
copies and rollbacks are the Watch's (:mod:`leadline.rate.watch`), one implementation for every
loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from leadline.rate.watch import Watch


@dataclass
class Looped:
    """What the loop did: the steps taken, the curve, where the guard stopped it, and the step whose
    loss was not finite where no guard was there to roll it back (that step not taken)."""

    steps: int = 0
    curve: list[dict[str, Any]] = field(default_factory=list)
    stopped_at: int | None = None
    diverged_at: int | None = None


def guarded_steps(opt: torch.optim.Optimizer, step: Callable[[int], float], todo: range, *,
                  watch: Watch | None = None,
                  before: Callable[[int], None] | None = None,
                  on_step: Callable[[dict[str, Any]], object] | None = None, t0: float | None = None) -> Looped:
    """Take the steps ``todo``: ``before(s)`` (a schedule's rate and checks) then ``step(s)`` (the
    forward and backward, returning the loss) and the optimizer's step; the ``watch``
    (:class:`leadline.rate.watch.Watch`) sees each loss and acts at each step's end; without one,
    a non-finite loss ends the loop there (``diverged_at``). Ends with the training weights of the
    last step taken (or of the check the guard stopped at). ``t0``: the clock the curve's seconds
    count from (default: the loop's start).

    Examples:
        A weight trained toward 1 at a rate a schedule halves after step 2, no guard:

        >>> import torch
        >>> w = torch.zeros(1, requires_grad=True)
        >>> opt = torch.optim.SGD([w], lr=0.5)
        >>> def rate(s):
        ...     opt.param_groups[0]["lr"] = 0.5 if s < 2 else 0.25
        >>> def step(s):
        ...     loss = ((w - 1) ** 2).sum(); loss.backward(); return float(loss)
        >>> done = guarded_steps(opt, step, range(4), before=rate)
        >>> done.steps, [r["lr"] for r in done.curve], round(w.item(), 4)
        (4, [0.5, 0.5, 0.25, 0.25], 1.0)
    """
    done, t0 = Looped(), time.monotonic() if t0 is None else t0
    for s in todo:
        if before is not None:
            before(s)
        opt.zero_grad(set_to_none=True)
        loss = step(s)
        if not math.isfinite(loss):
            opt.zero_grad(set_to_none=True)
            if watch is None:
                done.diverged_at = s
                return done
            said = watch.diverged(s)
        else:
            opt.step()
            done.steps += 1
            rec = {"step": s, "loss": loss, "lr": float(opt.param_groups[0]["lr"]), "seconds": time.monotonic() - t0}
            done.curve.append(rec)
            if on_step is not None:
                on_step(rec)
            if watch is None:
                continue
            watch.see(loss)
            said = watch.after_step(s + 1)
        if said is not None and said.action == "stop":
            done.stopped_at = watch.stopped_at
            return done
    return done
