"""The noise scale read again past the answer's format.

At step 0 every row agrees on the answer's format — the end token, the label's leading space —
and the first gradients all point that way: |G|² is large and B_noise small, a few tokens, and
a batch sized from that (a few rows) is right only until the format is learned: a few steps
later the same probe reads several times more (measured: docs/noise.md, "Past the format").

:func:`noise_past_format` trains from the plan's weights in rounds of w, 2w, 4w, ... optimizer
steps (w = 1/(1 - beta1), Adam's first-moment horizon; doubling, so a noisy step still gets a
round long enough to read a fall) at the plan's batch and ``rate`` (default alpha1/2; derive
passes the lower of alpha1/2 and the anchor, as alpha1/2 can be fast enough to make the
training loss rise from one round to the next; measured: docs/noise.md).
The format is what the loss learns first and fastest, so the burn-in goes on while the training
loss (free: the steps return it) still falls significantly from one round to the next — a
one-sided Welch t-test at 5% on the rounds' per-step losses — and stops at the first round that
does not, at ``max_rounds`` or ``max_steps``, or when its time runs out. Then the probe reads
the noise once, on rows no round trained on, by its own stopping rule (at least ``LATE_DRAWS``
draws when that rule settles sooner). Past the format the mean gradient can be lost in the
noise (|G|² not above zero by one SE, when the draws reach too few tokens): the reading is
then a lower bound, and it counts when the bound itself is above the step-0 reading. A reading
above the step-0 one by more than both standard errors replaces it for the step. Everything is
undone afterwards: weights, optimizer state, rates, gradients and RNG states come back
bit-identical, also when a step raises.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from leadline import stats
from leadline.errors import InputError
from leadline.plan import Value

MAX_ROUNDS = 6
"""Rounds at most (w + 2w + ... + 32w = 630 steps at beta1 0.9); the time budget binds first."""

LATE_DRAWS = 32
"""The fewest draws of the reading past the format when the probe's own rule settles sooner
(unless the rows or the time run out first): its error must be small enough to compare."""

MAX_LATE_DRAWS = 128
"""The most draws of that reading: past the format the mean gradient can stay lost in the noise
for as long as the probe draws, and the reading is then a lower bound however long it runs."""


PastFormatStop = Literal["rounds", "time", "max_steps", "diverged", "settled"]
"""Why the burn-in stopped: its rounds ran out, the next round would pass its share of the time,
its step limit, a non-finite loss, the training loss stopped falling."""


@dataclass
class PastFormat:
    """The noise readings of the burn-in and the one the plan takes.

    Attributes:
        b_noise_tokens / se_tokens: the last reading (None when none resolved).
        grew: the last reading is above the step-0 one by more than both standard errors.
        readings: per round, the steps trained and the probe's result.
        rate: the burn-in's rate (alpha1 / 2).
        stopped_because: the sentence saying why the burn-in stopped (displayed).
        stop: why it stopped, one of :data:`PastFormatStop`.

    Examples:
        A burn-in whose reading did not resolve leaves the step-0 noise scale standing:

        >>> pf = PastFormat(b_noise_tokens=None, se_tokens=None, grew=False, step0_tokens=3.0, step0_se=0.5,
        ...                 rate=1e-4, rows_per_step=8, round_steps=10, stopped_because="max_steps: 30 steps "
        ...                 "trained of the 30 allowed; the reading did not resolve (max_k)", stop="max_steps")
        >>> value = pf.as_values()["noise_scale_past_format_tokens"]
        >>> print(value.value, value.kind)
        None measured
        >>> value.source
        'no reading resolved past the format (max_steps: 30 ...); the step-0 noise scale stands'
    """

    b_noise_tokens: float | None
    se_tokens: float | None
    grew: bool
    step0_tokens: float
    step0_se: float
    rate: float
    rows_per_step: int
    round_steps: int
    stopped_because: str
    readings: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    noise: Any = None
    """The resolved :class:`~leadline.lookahead.noise.NoiseScale` (what the step is computed from)."""
    rounds: list[dict[str, Any]] = field(default_factory=list)
    """Per round: the steps so far, the mean training loss and its SE, the one-sided p of its fall."""
    stop: PastFormatStop = "rounds"

    def evidence(self) -> dict[str, Any]:
        """The ``past_format`` plot's evidence: the step-0 reading, every round and the reading."""
        return {"plot": "past_format", "step0_tokens": self.step0_tokens, "step0_se": self.step0_se, "rate": self.rate,
                "rows_per_step": self.rows_per_step, "round_steps": self.round_steps, "readings": self.readings,
                "stopped_because": self.stopped_because, "grew": self.grew, "rounds": self.rounds}

    def as_values(self) -> dict[str, Value]:
        """The plan's ``noise_scale_past_format_tokens`` (measured; None when no reading resolved)."""
        if self.b_noise_tokens is None:
            src = f"no reading resolved past the format ({self.stopped_because}); the step-0 noise scale stands"
            return {"noise_scale_past_format_tokens": Value(None, "measured", src, evidence=self.evidence(),
                                                            seconds=self.seconds, unit="scored tokens")}
        steps = self.readings[-1]["steps"] if self.readings else 0
        bound = getattr(self.noise, "lower_bound", False)
        src = (f"B_noise read again after {steps} steps of {self.rows_per_step} rows at {self.rate:.3g} "
               f"(rounds of {self.round_steps}, {2 * self.round_steps}, ... steps until the training loss stopped "
               f"falling: {self.stopped_because}), on rows no step trained on: "
               f"{('at least ' + format(self.b_noise_tokens, ',.3g') + ' (|G|² not above zero by one SE: the mean gradient is lost in the noise)') if bound else format(self.b_noise_tokens, ',.3g') + ' ± ' + format(self.se_tokens or 0, ',.2g')} tokens against {self.step0_tokens:,.3g} ± {self.step0_se:,.2g} at step 0"  # noqa: E501
               f" ({'grown: the step is taken from this reading' if self.grew else 'not grown beyond both errors: the step-0 reading stands'})")  # noqa: E501
        return {"noise_scale_past_format_tokens": Value(self.b_noise_tokens, "measured", src, evidence=self.evidence(),
                                                        seconds=self.seconds, unit="scored tokens")}


def _above(new: Any, old_b: float, old_se: float) -> bool:
    """``new`` reading is above ``old`` by more than both standard errors; a lower bound (|G|²
    not resolved: the mean gradient is lost in the noise) counts when the bound itself is."""
    b, se = getattr(new, "b_noise_tokens", None), getattr(new, "se_tokens", None)
    if not isinstance(b, (int, float)) or not math.isfinite(b):
        return False
    if getattr(new, "lower_bound", False):
        return b > old_b + old_se
    if not getattr(new, "resolved", False):
        return False
    return b - (se or 0.0) > old_b + old_se


def noise_past_format(params: Sequence[Any], opt: Any, train_step: Callable[[int], Any], grad_fn: Callable[[int], Any],
                      alpha1: float, step0: Any, *, rows_per_step: int, probe_start: int | Callable[[int], int],
                      round_steps: int | None = None,
                      max_rounds: int = MAX_ROUNDS, max_steps: int | None = None, budget_s: float | None = None,
                      check_time: Callable[[], None] | None = None, place: str = "auto",
                      rate: float | None = None) -> PastFormat:
    """Burn in past the format and read the noise scale again (see the module docstring).

    Args:
        params, opt: the trained tensors and the run's optimizer.
        train_step: ``train_step(step)``, the forward+backward of step ``step`` at the plan's batch.
        grad_fn: the probe's ``grad_fn(i)`` (:func:`~leadline.lookahead.noise.measure_noise_scale`).
        alpha1: the first safe step; the burn-in runs at alpha1 / 2.
        step0: the step-0 :class:`~leadline.lookahead.noise.NoiseScale` (or its B_noise).
        rows_per_step: rows an optimizer step trains (for the record).
        probe_start: the first draw index the reading takes, past every row the burn-in trained;
            or a function of the steps trained that gives it.
        round_steps: the first round's steps (default round(1/(1 - beta1)), Adam's first-moment
            horizon); each round after it is twice the one before.
        max_rounds: rounds at most.
        max_steps: steps at most over all rounds (derive: a quarter of the run's rows).
        budget_s: a bound on the whole burn-in; each reading gets what is left over the rounds left.
        check_time: called before each step and reading (derive's max_seconds); may raise.
        place: where the snapshot lives.
        rate: the burn-in's rate (default alpha1 / 2).

    Returns:
        :class:`PastFormat`; ``params`` and ``opt`` (weights, state, rates, ``.grad``) and the RNG
        states are as they were on entry, also when a step raises.

    Examples:
        Two rounds (2 and 4 steps) on a quadratic loss, then a reading of a source whose true
        B_noise is 400 tokens against a step-0 reading of 3 tokens:

        >>> import torch
        >>> from leadline.lookahead.noise.synthetic import KnownNoise
        >>> w = torch.zeros(8, requires_grad=True)
        >>> opt = torch.optim.SGD([w], lr=1e-3)
        >>> def train_step(step):
        ...     loss = ((w - 1.0) ** 2).mean()
        ...     loss.backward()
        ...     return loss.item()
        >>> source = KnownNoise(b_noise_tokens=400, dim=8, tokens=(50, 50), seed=0, dtype=torch.float64)
        >>> pf = noise_past_format([w], opt, train_step, source, alpha1=0.1, step0=3.0, rows_per_step=4,
        ...                        probe_start=1_000, round_steps=2, max_rounds=2)
        >>> pf.rate, [r["steps"] for r in pf.rounds], pf.stop, pf.stopped_because
        (0.05, [2, 6], 'rounds', '2 rounds')
        >>> round(pf.b_noise_tokens), round(pf.se_tokens), pf.noise.k, pf.grew   # at least LATE_DRAWS draws
        (583, 235, 32, True)
        >>> w.tolist() == [0.0] * 8, opt.param_groups[0]["lr"]    # undone
        (True, 0.001)
        >>> noise_past_format([w], opt, train_step, source, alpha1=0.0, step0=3.0, rows_per_step=4, probe_start=0)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: noise_past_format needs alpha1 > 0 (measure_first_step().alpha1), got 0.0
    """
    from leadline.lookahead.rate.measuring import check_params, no_trace
    from leadline.lookahead.rate.warmup import warmup_steps_for
    from leadline.rate.state import group_ratios

    t0 = time.perf_counter()
    b0, se0 = _checked_step0(alpha1, step0)
    params = check_params(params, opt)
    betas = opt.param_groups[0].get("betas") if opt.param_groups else None
    w = int(round_steps) if round_steps is not None else warmup_steps_for(float(betas[0]) if betas else 0.9)
    rate = alpha1 / 2.0 if rate is None else float(rate)
    if not (math.isfinite(rate) and rate > 0):
        raise InputError(f"noise_past_format(rate=...) must be a positive rate, got {rate!r}")
    readings: list[dict[str, Any]] = []
    rounds: list[dict[str, Any]] = []
    last = None

    first_draw = [0]

    def probe(i: int) -> Any:
        return grad_fn(first_draw[0] + i)

    with no_trace(params, opt, place=place):
        ratios = group_ratios(opt)
        opt.state.clear()
        done, stop, stopped = _burn_in(opt, train_step, rate, ratios, w, rounds, max_rounds=max_rounds,
                                       max_steps=max_steps, budget_s=budget_s, check_time=check_time, t0=t0)
        if stop != "diverged":
            if check_time is not None:
                check_time()
            left = None if budget_s is None else max(1.0, budget_s - (time.perf_counter() - t0))
            first_draw[0] = int(probe_start(done)) if callable(probe_start) else int(probe_start)
            ns = _late_reading(probe, left)
            readings.append({"steps": done, "first_draw": first_draw[0], "b_noise_tokens": ns.b_noise_tokens,
                             "se_tokens": ns.se_tokens,
                             "k": ns.k, "resolved": ns.resolved, "stopped_because": ns.stopped_because,
                             "seconds": ns.seconds})
            if ns.b_noise_tokens is not None and (ns.resolved or ns.lower_bound):
                last = ns  # a lower bound still says how large the noise is at least
            else:
                stopped += f"; the reading did not resolve ({ns.stopped_because})"
    b = getattr(last, "b_noise_tokens", None)
    se = getattr(last, "se_tokens", None)
    grew = last is not None and _above(last, float(b0), float(se0))
    return PastFormat(b, se, grew, float(b0), float(se0), rate, int(rows_per_step), w, stopped, readings,
                      time.perf_counter() - t0, last, rounds, stop)


def _checked_step0(alpha1: float, step0: Any) -> tuple[Any, float]:
    """The step-0 noise scale and its SE, after checking alpha1 and it are positive."""
    if not (isinstance(alpha1, (int, float)) and math.isfinite(alpha1) and alpha1 > 0):
        raise InputError(f"noise_past_format needs alpha1 > 0 (measure_first_step().alpha1), got {alpha1!r}")
    b0 = getattr(step0, "b_noise_tokens", step0)
    se0 = getattr(step0, "se_tokens", 0.0) or 0.0
    if not (isinstance(b0, (int, float)) and math.isfinite(b0) and b0 > 0):
        raise InputError(f"noise_past_format needs the step-0 noise scale > 0, got {b0!r}")
    return b0, se0


def _burn_in(opt: Any, train_step: Callable[[int], Any], rate: float, ratios: Any, w: int,
             rounds: list[dict[str, Any]], *, max_rounds: int, max_steps: int | None, budget_s: float | None,
             check_time: Callable[[], None] | None, t0: float) -> tuple[int, PastFormatStop, str]:
    """The burn-in's rounds of w, 2w, 4w, ... steps at ``rate`` until the training loss stops
    falling (or the rounds, the steps or the time run out), each recorded on ``rounds``.
    Returns the steps trained, why it stopped and the sentence for it."""
    done, prev = 0, None
    train_budget = None if budget_s is None else 0.7 * budget_s
    for r in range(max_rounds):
        if (train_budget is not None and r > 0
                and (time.perf_counter() - t0) * (2 ** (r + 1) - 1) / (2 ** r - 1) > train_budget):
            return done, "time", "time: the next round would pass the burn-in's share of the budget"
        n_steps = w * 2 ** r
        if max_steps is not None and done + n_steps > max_steps:
            if done >= max_steps or max_steps - done < w:
                return done, "max_steps", f"max_steps: {done} steps trained of the {max_steps} allowed"
            n_steps = max_steps - done
        losses = _train(opt, train_step, rate, ratios, range(done, done + n_steps), check_time)
        done += n_steps
        if any(not math.isfinite(x) for x in losses):
            rounds.append({"round": r + 1, "steps": done, "mean_loss": None})
            return done, "diverged", f"diverged: a burn-in step's loss was not finite in round {r + 1}"
        m, se = stats.mean_se(losses) if len(losses) >= 2 else (losses[0] if losses else math.nan, math.inf)
        row: dict[str, Any] = {"round": r + 1, "steps": done, "mean_loss": m, "se_loss": se}
        rounds.append(row)
        if prev is not None:
            fall = _falls(prev, (m, se, len(losses)))
            row["falling_p"] = fall
            if fall is None or fall >= 0.05:
                return done, "settled", (f"settled: the training loss stopped falling in round {r + 1} (one-sided p "
                                         f"{fall if fall is not None else float('nan'):.2g})")
        prev = (m, se, len(losses))
    return done, "rounds", f"{max_rounds} rounds"


def _train(opt: Any, train_step: Callable[[int], Any], rate: float, ratios: Any, steps: range,
           check_time: Callable[[], None] | None) -> list[float]:
    """The optimizer steps ``steps`` at ``rate``; returns their training losses."""
    from leadline.rate.state import set_lr

    losses: list[float] = []
    for t in steps:
        if check_time is not None:
            check_time()
        set_lr(opt, rate, ratios)
        opt.zero_grad(set_to_none=True)
        loss = train_step(t)
        opt.step()
        if loss is not None:
            losses.append(float(loss))
    return losses


def _late_reading(probe: Callable[[int], Any], budget_s: float | None) -> Any:
    """The noise scale read past the burn-in: at least LATE_DRAWS draws before the probe's own
    rule may settle it (it settles fast on the format's few tokens), at most MAX_LATE_DRAWS."""
    from leadline.lookahead.noise.probe import measure_noise_scale

    return measure_noise_scale(probe, max_k=MAX_LATE_DRAWS, budget_s=budget_s, min_k=LATE_DRAWS)


def _falls(before: tuple[float, float, int], after: tuple[float, float, int]) -> float | None:
    """One-sided p that the mean loss fell from ``before`` to ``after`` (Welch's t on
    (mean, SE, n)); None when it cannot be read."""
    (m1, se1, n1), (m2, se2, n2) = before, after
    if n1 < 2 or n2 < 2 or not all(math.isfinite(x) for x in (m1, se1, m2, se2)):
        return None
    v = se1 ** 2 + se2 ** 2
    if v <= 0:
        return 0.0 if m2 < m1 else 1.0
    t = (m1 - m2) / math.sqrt(v)
    df = v ** 2 / ((se1 ** 4) / (n1 - 1) + (se2 ** 4) / (n2 - 1)) if se1 > 0 and se2 > 0 else float(min(n1, n2) - 1)
    return 1.0 - stats.t_cdf(t, df)
