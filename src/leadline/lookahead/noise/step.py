"""Tokens per optimizer step from the noise scale and two measured times, as pure math.

At a batch of B scored tokens, reaching a given loss takes S_min (1 + B_noise/B) steps and
E_min (1 + B/B_noise) tokens (McCandlish et al., 2018, eq. 2.11). On one card that
accumulates, a step of B tokens costs (B/m) t_micro + t_step seconds (m scored tokens per
micro-batch, t_micro one forward+backward, t_step the optimizer update), so the time to the
loss, S_min (1 + B_noise/B)(B t_micro/m + t_step), is least at

    B* = sqrt(B_noise × m × t_step / t_micro).

B* is clamped to [one row, B_noise] (past the knee a token buys less than a step saves, and
a step is never smaller than a row) and to the corpus; then the micro-batch is CUT to the step
when the card fits more rows than the step needs, and grad_accum follows.

That formula assumes a micro-batch costs in proportion to its tokens. A small model on a big
card is bound by kernel launches instead: a micro-batch of a few rows costs about as much as
one of a single row (measured: docs/noise.md, "The fixed cost of a micro-batch"). Given the
forward+backward at ONE row as well,
t(r) = a + c r is fitted through the two shapes (a: the fixed cost of a micro-batch), a step of
r rows costs a + c r + t_step on a card that holds it in one micro-batch, and the step is the
whole number of rows that minimizes (1 + B_noise/B) x that time over [one row, B_noise] — the
same least-time rule, with the fixed cost counted.

The card decides the micro-batch and grad_accum, not the step: a card that holds fewer rows than
the step accumulates (:func:`even_split`) and pays its extra micro-batches' fixed cost, which the
step does not follow (on the same measurements, a card held to fewer rows gets the same step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from leadline import stats
from leadline.errors import InputError
from leadline.plan import Value


def format_tokens(x: float) -> str:
    """A token count as the plan's sentences write it.

    Examples:
        >>> format_tokens(12345.6), format_tokens(33.14)
        ('12,346', '33.1')
    """
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def time_optimal_tokens(b_noise_tokens: float, tokens_per_micro_batch: float, t_step_seconds: float,
                        t_micro_seconds: float) -> float:
    """B* = sqrt(B_noise × m × t_step / t_micro), unclamped, in scored tokens.

    The batch that reaches a loss in the least time when a step of B tokens costs
    (B/m) t_micro + t_step and it takes S_min (1 + B_noise/B) steps (McCandlish et al. 2018,
    eq. 2.11); :func:`tokens_per_step` clamps it.

    Examples:
        >>> time_optimal_tokens(40_000, 2_000, 0.05, 0.2)
        4472.13595499958
        >>> time_optimal_tokens(40_000, 2_000, 0.0, 0.2)     # a free update: 0, before the clamp to one row
        0.0
    """
    for name, v in (("b_noise_tokens", b_noise_tokens), ("tokens_per_micro_batch", tokens_per_micro_batch),
                    ("t_micro_seconds", t_micro_seconds)):
        if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
            raise InputError(f"time_optimal_tokens needs {name} > 0 and finite, got {v!r}")
    if not (isinstance(t_step_seconds, (int, float)) and t_step_seconds >= 0 and math.isfinite(t_step_seconds)):
        raise InputError(f"time_optimal_tokens needs t_step_seconds >= 0 and finite, got {t_step_seconds!r}")
    return math.sqrt(b_noise_tokens * tokens_per_micro_batch * t_step_seconds / t_micro_seconds)


def steps_and_tokens(batch_tokens: float, b_noise_tokens: float, s_min: float = 1.0,
                     e_min: float = 1.0) -> tuple[float, float]:
    """Steps and tokens to a given loss at batch B: (S_min (1 + B_noise/B), E_min (1 + B/B_noise)).

    McCandlish et al. (2018), eq. 2.11; S_min and E_min default to 1 (the answer in multiples
    of the minimum). At B = B_noise both are twice their minimum.

    Examples:
        >>> steps_and_tokens(1_000, 1_000)        # at the noise scale: twice the minimum of each
        (2.0, 2.0)
        >>> steps_and_tokens(250, 1_000)          # a quarter of it: 5x the fewest steps, 1.25x the fewest tokens
        (5.0, 1.25)
        >>> steps_and_tokens(0, 1_000)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: steps_and_tokens needs batch_tokens > 0 and b_noise_tokens > 0, got 0, 1000

    References:
        McCandlish et al. (2018), arXiv:1812.06162, eq. 2.11.
    """
    if not (batch_tokens > 0 and b_noise_tokens > 0):
        raise InputError(f"steps_and_tokens needs batch_tokens > 0 and b_noise_tokens > 0, got {batch_tokens!r}, "
                         f"{b_noise_tokens!r}")
    return s_min * (1.0 + b_noise_tokens / batch_tokens), e_min * (1.0 + batch_tokens / b_noise_tokens)


def _fixed_cost(t_one: float, t_fit: float, rows_fit: int, one_repeats: Sequence[float] = (),
                fit_repeats: Sequence[float] = ()) -> dict[str, Any]:
    """t(r) = a + c r through (1, t_one) and (rows_fit, t_fit); a >= 0 and c > 0 (a line that
    would fall with rows is read as all fixed cost, the least per-row cost kept).

    A fixed cost the repeats cannot tell from zero is zero: with repeats at both shapes, a is
    kept only when it is above zero at 99% one-sided confidence,
    ``(rows_fit mean(t_one) - mean(t_fit)) / (rows_fit - 1) - t(0.99, n1 + n2 - 2) x se > 0``
    (se from the repeats' own variances); otherwise a = 0 and t(r) = r t_fit / rows_fit (the
    simpler model), so a few percent of jitter cannot move the step between the two.

    Examples:
        >>> round(_fixed_cost(0.05, 0.12, 8)["a_seconds"], 6)
        0.04
        >>> _fixed_cost(0.0164, 0.1166, 8, [0.0150, 0.0164, 0.0170], [0.110, 0.1166, 0.125])["a_seconds"]
        0.0
    """
    c = (t_fit - t_one) / (rows_fit - 1)
    c = max(c, 1e-3 * t_fit / rows_fit)
    a = max(0.0, t_fit - c * rows_fit)
    out: dict[str, Any] = {}
    if (a > 0 and len(one_repeats) > 1 and len(fit_repeats) > 1
            and not _surely_positive(one_repeats, fit_repeats, rows_fit)):
        out["a_within_spread_seconds"] = a
        a, c = 0.0, t_fit / rows_fit
    return {"a_seconds": a, "c_seconds_per_row": c, "t_micro_one_row_seconds": t_one, "t_micro_rows_fit_seconds": t_fit,
            **out}


def _surely_positive(one: Sequence[float], fit: Sequence[float], rows_fit: int, confidence: float = 0.99) -> bool:
    """Whether the fixed cost ``(rows_fit t_one - t_fit) / (rows_fit - 1)`` is above zero at
    ``confidence``, one-sided, from the repeats (Welch's standard error, pooled degrees of freedom)."""
    m1, m2 = sum(one) / len(one), sum(fit) / len(fit)
    v1 = sum((x - m1) ** 2 for x in one) / (len(one) - 1)
    v2 = sum((x - m2) ** 2 for x in fit) / (len(fit) - 1)
    a = (rows_fit * m1 - m2) / (rows_fit - 1)
    se = math.sqrt(rows_fit**2 * v1 / len(one) + v2 / len(fit)) / (rows_fit - 1)
    return a - stats.t_quantile(confidence, len(one) + len(fit) - 2) * se > 0


def even_split(rows: int, rows_fit: int) -> tuple[int, int]:
    """(micro_batch, grad_accum) for a step of ``rows`` rows on a card that fits ``rows_fit``.

    The fewest micro-batches, ceil(rows / rows_fit), or one more, where that splits the rows
    exactly; else the nearest even split, round(rows / grad_accum) rows each (the step off by
    less than grad_accum / 2 rows).

    Examples:
        >>> even_split(16, 32), even_split(16, 9), even_split(18, 4), even_split(50, 8)
        ((16, 1), (8, 2), (3, 6), (7, 7))
    """
    if rows < 1 or rows_fit < 1:
        raise InputError(f"even_split needs rows >= 1 and rows_fit >= 1, got {rows!r}, {rows_fit!r}")
    fewest = -(-rows // rows_fit)
    for accum in (fewest, fewest + 1):
        if rows % accum == 0 and rows // accum <= rows_fit:
            return rows // accum, accum
    return min(rows_fit, max(1, round(rows / fewest))), fewest


STEP_FOR = ("time", "rows")
# derive's step when the caller names none: the step for the rows, which beat the least-time step on
# one scoreboard task and lost on none (docs/results.md).
DEFAULT_STEP_FOR = "rows"


def rows_step_rule(time_rows: int, time_tokens: float, b_noise: float, fixed_seconds: float,
                   row_seconds: float) -> dict[str, Any]:
    """The step for the rows: the fewest rows r whose time a row, fixed/r + row_seconds, is at
    most the least-time step's time a row times 1 + B/B_noise.

    The least-time step B reaches a loss after E_min (1 + B/B_noise) rows (McCandlish et al. 2018,
    eq. 2.11): to the loss its rows would reach at a small step it needs 1 + B/B_noise passes, and
    pays that many times its time a row. Spending that time a row on ONE pass buys the smallest
    step it affords, the most progress per row; no preference between time and rows is assumed.
    With fixed seconds a step (the micro-batch's fixed cost and the update) the answer is
    r = ceil(fixed / (budget - row_seconds)), at most ``time_rows``.

    Examples:
        >>> rows_step_rule(35, 3355.0, 6008.0, 0.152, 0.00783)["rows"]
        14
        >>> rows_step_rule(8, 8.0, 1e9, 0.1, 0.01)["rows"]
        8
    """
    per_row_time = fixed_seconds / time_rows + row_seconds
    passes = 1.0 + time_tokens / b_noise
    budget = per_row_time * passes
    rows = next(r for r in range(1, time_rows + 1) if fixed_seconds / r + row_seconds <= budget * (1 + 1e-12))
    return {"rows": rows, "least_time_rows": time_rows, "least_time_seconds_a_row": per_row_time,
            "passes_to_its_loss": passes, "seconds_a_row_allowed": budget, "fixed_seconds": fixed_seconds,
            "row_seconds": row_seconds}


def least_time_rows(b_noise: float, per_row: float, rows_fit: int, a: float, c: float, t_step: float,
                     corpus: float | None) -> int:
    """The whole rows r in [1, B_noise/per_row] (and the corpus) minimizing
    (1 + B_noise/(r per_row)) x (ceil(r/rows_fit) a + c r + t_step); ties to the smaller r.

    With no fixed cost (a = 0) it is the square-root formula's answer rounded to whole rows;
    with a dominant fixed cost it goes to B_noise (or the corpus).

    Examples:
        >>> time_optimal_tokens(40_000, 125, 0.05, 0.2 / 16) / 125     # B* in rows, a = 0
        35.77708763999664
        >>> least_time_rows(40_000, 125, 320, 0.0, 0.2 / 16, 0.05, None)
        36
        >>> least_time_rows(40_000, 125, 320, 5.0, 0.2 / 16, 0.05, None)   # 5 s fixed: B_noise / 125 rows
        320
        >>> least_time_rows(40_000, 125, 320, 5.0, 0.2 / 16, 0.05, 5_000)  # a corpus of 40 rows
        40
    """
    top = max(1, math.floor(b_noise / per_row))
    if corpus is not None:
        top = max(1, min(top, math.floor(corpus / per_row)))
    best, best_t = 1, math.inf
    for r in range(1, top + 1):
        t = (1.0 + b_noise / (r * per_row)) * (-(-r // rows_fit) * a + c * r + t_step)
        if t < best_t * (1 - 1e-12):
            best, best_t = r, t
    return best


def _seconds(name: str, v: float | Sequence[float]) -> tuple[float, list[float]]:
    """A time given as one number or as repeats (their median), and the repeats recorded."""
    xs = [float(v)] if isinstance(v, (int, float)) else [float(x) for x in v]
    if not xs or not all(math.isfinite(x) and x >= 0 for x in xs):
        raise InputError(f"tokens_per_step({name}=...) needs seconds >= 0 (one number or the repeats), got {v!r}")
    return stats.median(xs), xs


@dataclass(frozen=True)
class StepPlan:
    """Tokens per step, the micro-batch cut to it, and grad_accum, with what they came from.

    Attributes:
        tokens_per_step: the target in scored tokens, B* after its clamps.
        b_star_tokens: B* before the clamps.
        clamped_by: "one row", "noise scale", "corpus" or None.
        micro_batch: rows per micro-batch (at most the rows that fit).
        grad_accum: micro-batches per optimizer step.
        rows_per_step: micro_batch × grad_accum.
        cut: True when the micro-batch was cut below what fits.
        inputs: every number it was computed from (the timing repeats included).
        given_rows: the rows a step the caller fixed (None: the least-time step).

    Examples:
        >>> plan = tokens_per_step(40_000, rows_fit=16, tokens_per_micro_batch=2_000, t_step_seconds=0.05,
        ...                        t_micro_seconds=0.2)
        >>> round(plan.tokens_per_step), plan.rows_per_step, plan.micro_batch, plan.grad_accum, plan.cut
        (4472, 36, 12, 3, True)
        >>> values = plan.as_values()
        >>> sorted(values), values["grad_accum"].kind
        (['grad_accum', 'micro_batch', 'tokens_per_step'], 'derived')
        >>> values["grad_accum"].source
        'ceil(36 rows a step (4,472 tokens at 125 a row) / 16 that fit) = 3 micro-batches of 12 rows'
    """

    tokens_per_step: float
    b_star_tokens: float
    clamped_by: str | None
    micro_batch: int
    grad_accum: int
    rows_per_step: int
    cut: bool
    inputs: dict[str, Any]
    given_rows: int | None = None

    @property
    def row_efficiency(self) -> float:
        """1/(1 + B/B_noise): the share of a small step's progress per row that a step of B
        tokens makes (McCandlish et al. 2018: a loss takes E_min(1 + B/B_noise) rows). A run of a
        fixed number of rows reaches less at a lower share; the step minimizes time, not rows.

        Examples:
            >>> StepPlan(3000.0, 3000.0, None, 30, 1, 30, False, {"b_noise_tokens": 6000.0}).row_efficiency
            0.6666666666666666
        """
        b_noise = float(self.inputs.get("b_noise_tokens") or 0.0)
        return 1.0 / (1.0 + self.tokens_per_step / b_noise) if b_noise > 0 else 0.0

    def _step_source(self, clamp: str) -> str:
        i = self.inputs
        f = i.get("fixed_cost")
        if f:
            return (f"the whole rows minimizing (1 + B_noise {format_tokens(i['b_noise_tokens'])}/B) x (micro-batches "
                    f"x {f['a_seconds']:.4g} s fixed"
                    f" + {f['c_seconds_per_row']:.4g} s a row + t_step {i['t_step_seconds']:.4g} s), the fixed cost "
                    "from t_micro"
                    f" {f['t_micro_one_row_seconds']:.4g} s at 1 row and {f['t_micro_rows_fit_seconds']:.4g} s at "
                    f"{i['rows_fit']}"
                    + (f" ({f['a_within_spread_seconds']:.4g} s fixed by the medians, within the repeats' spread of "
                       "zero)"
                       if f.get("a_within_spread_seconds") else "") + ":"
                    f" {format_tokens(self.b_star_tokens)} tokens{clamp} (the least time to a loss, McCandlish et al. "
                    "2018)")
        return (f"B* = sqrt(B_noise {format_tokens(i['b_noise_tokens'])} × "
                f"{format_tokens(i['tokens_per_micro_batch'])} tokens a micro-batch"
                f" × t_step {i['t_step_seconds']:.4g} s / t_micro {i['t_micro_seconds']:.4g} s) = "
                f"{format_tokens(self.b_star_tokens)}{clamp} (the least time to a loss, McCandlish et al. 2018)")

    def as_values(self) -> dict[str, Value]:
        """The plan's ``tokens_per_step``, ``micro_batch`` and ``grad_accum`` (all derived)."""
        i = self.inputs
        clamp = f", clamped to {self.clamped_by}" if self.clamped_by else ""
        ev = {**i, "b_star_tokens": self.b_star_tokens, "clamped_by": self.clamped_by, "cut": self.cut,
              "given_rows": self.given_rows, "row_efficiency": self.row_efficiency}
        use = (f"; a step of {format_tokens(self.tokens_per_step)} tokens uses the rows at 1/(1 + B/B_noise) = "
               f"{self.row_efficiency:.0%} of a small step's efficiency (E_min(1 + B/B_noise) rows to a loss)")
        res = i.get("step_resolution")
        if res:
            spread = (f"{res['rows_p10']} in every resample" if res["rows_p10"] == res["rows_p90"] else
                      f"{res['rows_p10']}-{res['rows_p90']} (10th-90th percentile)")
            use += (f"; one row and the rows that fit timed in turn {res['pairs']} times, the rows a step over the "
                    f"pairs' bootstrap {spread}"
                    + ("" if res["resolved"] else f", wider than {res['spread']:g}x at the most pairs derive takes"))
        rule = i.get("rows_rule")
        if self.given_rows is None and rule:
            step = Value(self.tokens_per_step, "derived",
                         f"for the rows: the fewest rows a step whose time a row, {rule['fixed_seconds']:.4g} s/r + "
                         f"{rule['row_seconds']:.4g} s, is at most the least-time step's ({rule['least_time_rows']} "
                         f"rows, {rule['least_time_seconds_a_row']:.4g} s a row) times the "
                         f"{rule['passes_to_its_loss']:.3g} passes it needs to its rows' loss at a small step: "
                         f"{rule['rows']} rows; the least-time step: {self._step_source(clamp)}{use}", evidence=ev,
                         unit="scored tokens")
        elif self.given_rows is None:
            step = Value(self.tokens_per_step, "derived", self._step_source(clamp) + use, evidence=ev,
                         unit="scored tokens")
        else:
            per_row = i["tokens_per_micro_batch"] / i["rows_fit"]
            step = Value(self.tokens_per_step, "given",
                         f"{self.given_rows} rows a step, given by the caller ({format_tokens(per_row)} scored tokens "
                         f"a row); the measured step would be {round(self.b_star_tokens / per_row)} rows: "
                         f"{self._step_source(clamp)}{use}", evidence=ev, unit="scored tokens")
        return {
            "tokens_per_step": step,
            "micro_batch": Value(
                self.micro_batch, "derived",
                (f"cut from the {i['rows_fit']} rows that fit to the step's {self.rows_per_step}" if self.cut
                 else f"the {i['rows_fit']} rows that fit, a micro-batch of them {self.grad_accum} "
                      f"time{'s' if self.grad_accum > 1 else ''} a step"),
                evidence=ev, unit="rows",
            ),
            "grad_accum": Value(
                self.grad_accum, "derived",
                f"the {self.given_rows} rows a step given, in {self.grad_accum} micro-batch"
                f"{'es' if self.grad_accum > 1 else ''} of {self.micro_batch} rows (the most rows dividing "
                f"{self.given_rows} that the {i['rows_fit']} that fit allow)" if self.given_rows is not None else
                f"ceil({i['rows_wanted']} rows a step ({format_tokens(self.tokens_per_step)} tokens at "
                f"{format_tokens(i['tokens_per_micro_batch'] / i['rows_fit'])} a row)"
                f" / {i['rows_fit']} that fit) = {self.grad_accum} micro-batch{'es' if self.grad_accum > 1 else ''} of "
                f"{self.micro_batch} rows",
                evidence=ev,
            ),
        }


def tokens_per_step(
    noise: Any,
    *,
    rows_fit: int,
    tokens_per_micro_batch: float,
    t_step_seconds: float | Sequence[float],
    t_micro_seconds: float | Sequence[float],
    corpus_scored_tokens: float | None = None,
    t_micro_one_row_seconds: float | Sequence[float] | None = None,
    rows_per_step: int | None = None,
    step_for: str = "time",
) -> StepPlan:
    """The optimizer step in scored tokens, and the micro-batch and grad_accum that make it.

    Args:
        noise: a :class:`~leadline.lookahead.noise.NoiseScale` or B_noise in scored tokens.
        rows_fit: the most rows a micro-batch fits (the ramp's answer) — at which the timings
            and ``tokens_per_micro_batch`` were measured.
        tokens_per_micro_batch: m, the scored tokens of one micro-batch of ``rows_fit`` rows.
        t_step_seconds, t_micro_seconds: the optimizer update and one forward+backward at that
            shape, each one number or its repeats (their median is used).
        corpus_scored_tokens: what the corpus holds; a step is never more.
        t_micro_one_row_seconds: one forward+backward of ONE row at the same length (one
            number or its repeats). With it, the fixed cost of a micro-batch is counted (see
            the module docstring) and the step is the least-time whole number of rows.
        rows_per_step: the rows a step the caller fixes (a batch size the run must keep): the
            step is that, its micro-batch and grad_accum fitted to the card, and the least-time
            step stays in the evidence beside it.
        step_for: ``time`` (the least time to a loss) or ``rows`` (:func:`rows_step`: the most
            progress a row within the time a row the least-time step pays to the same loss).

    Returns:
        :class:`StepPlan`. B* = sqrt(B_noise × m × t_step / t_micro) clamped to
        [m/rows_fit, B_noise] and to the corpus; rows a step = max(1, round(B*/(m/rows_fit)));
        micro_batch and grad_accum from :func:`even_split`. The same inputs give the same plan.

    Examples:
        B* = sqrt(40,000 × 2,000 × 0.05 / 0.2) = 4,472 tokens: 36 rows of 125, in 3 micro-batches of 12.

        >>> plan = tokens_per_step(40_000, rows_fit=16, tokens_per_micro_batch=2_000, t_step_seconds=0.05,
        ...                        t_micro_seconds=[0.19, 0.2, 0.22])      # repeats: their median, 0.2
        >>> round(plan.b_star_tokens), plan.rows_per_step, plan.micro_batch, plan.grad_accum, plan.clamped_by
        (4472, 36, 12, 3, None)

        A slow update asks for more than the noise scale; the step stops at B_noise:

        >>> plan = tokens_per_step(1_000, rows_fit=16, tokens_per_micro_batch=2_000, t_step_seconds=1.0,
        ...                        t_micro_seconds=0.2)
        >>> round(plan.b_star_tokens), plan.tokens_per_step, plan.clamped_by, plan.micro_batch
        (3162, 1000.0, 'noise scale', 8)

        A batch size the run must keep (the least-time step stays in the evidence):

        >>> plan = tokens_per_step(40_000, rows_fit=16, tokens_per_micro_batch=2_000, t_step_seconds=0.05,
        ...                        t_micro_seconds=0.2, rows_per_step=40)
        >>> plan.rows_per_step, plan.micro_batch, plan.grad_accum, plan.as_values()["tokens_per_step"].kind
        (40, 10, 4, 'given')
        >>> tokens_per_step(None, rows_fit=16, tokens_per_micro_batch=2_000, t_step_seconds=0.05,
        ...                 t_micro_seconds=0.2)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: tokens_per_step needs a measured noise scale > 0 in scored tokens, got None; ...

    References:
        McCandlish et al. (2018), arXiv:1812.06162, eq. 2.11 (steps and tokens at batch B).
    """
    b_noise = getattr(noise, "b_noise_tokens", noise)
    if (b_noise is None or isinstance(b_noise, bool) or not isinstance(b_noise, (int, float)) or not b_noise > 0
            or not math.isfinite(b_noise)):
        raise InputError(f"tokens_per_step needs a measured noise scale > 0 in scored tokens, got {b_noise!r}; run "
                         "measure_noise_scale first")
    if isinstance(rows_fit, bool) or not isinstance(rows_fit, int) or rows_fit < 1:
        raise InputError(f"tokens_per_step(rows_fit={rows_fit!r}) needs the whole rows a micro-batch fits, >= 1")
    if not (isinstance(tokens_per_micro_batch,
                       (int, float)) and tokens_per_micro_batch > 0 and math.isfinite(tokens_per_micro_batch)):
        raise InputError(f"tokens_per_step(tokens_per_micro_batch={tokens_per_micro_batch!r}) needs the scored tokens "
                         "of one micro-batch, > 0")
    t_step, step_repeats = _seconds("t_step_seconds", t_step_seconds)
    t_micro, micro_repeats = _seconds("t_micro_seconds", t_micro_seconds)
    if t_micro <= 0:
        raise InputError(f"tokens_per_step needs t_micro_seconds > 0, got the median {t_micro}")
    b_noise, m = float(b_noise), float(tokens_per_micro_batch)
    b_star = time_optimal_tokens(b_noise, m, t_step, t_micro)
    per_row = m / rows_fit
    fixed = None
    if t_micro_one_row_seconds is not None and rows_fit > 1:
        t_one, one_repeats = _seconds("t_micro_one_row_seconds", t_micro_one_row_seconds)
        fixed = _fixed_cost(t_one, t_micro, rows_fit, one_repeats, micro_repeats)
        fixed["t_micro_one_row_repeats"] = one_repeats
        holds_any = max(rows_fit, math.ceil(b_noise / per_row))  # one micro-batch a step: the card does not decide it
        b_star = least_time_rows(b_noise, per_row, holds_any, fixed["a_seconds"], fixed["c_seconds_per_row"], t_step,
                                  corpus_scored_tokens) * per_row
    target, clamped = b_star, None
    if target > b_noise:
        target, clamped = b_noise, "noise scale"
    if corpus_scored_tokens is not None and target > corpus_scored_tokens:
        target, clamped = float(corpus_scored_tokens), "corpus"
    if target < per_row:
        target, clamped = per_row, "one row"
    rows_step = max(1, round(target / per_row))
    if step_for not in STEP_FOR:
        raise InputError(f"step_for must be one of {', '.join(STEP_FOR)}, got {step_for!r}")
    rows_rule = None
    if step_for == "rows" and rows_per_step is None:
        if fixed is not None:
            fixed_part, per_row_part = fixed["a_seconds"] + t_step, fixed["c_seconds_per_row"]
        else:
            fixed_part, per_row_part = t_step, t_micro / rows_fit
        rows_rule = rows_step_rule(rows_step, rows_step * per_row, b_noise, fixed_part, per_row_part)
        if rows_rule["rows"] < rows_step:
            rows_step, target = rows_rule["rows"], rows_rule["rows"] * per_row
            clamped = "one row" if rows_step == 1 and clamped == "one row" else None
    if rows_per_step is not None:
        if isinstance(rows_per_step, bool) or not isinstance(rows_per_step, int) or rows_per_step < 1:
            raise InputError(f"rows_per_step={rows_per_step!r} must be a whole number of rows >= 1; pass e.g. 16")
        rows_step, target, clamped = rows_per_step, rows_per_step * per_row, None
        micro = max(d for d in range(1, min(rows_fit, rows_step) + 1) if rows_step % d == 0)  # exactly the rows given
        grad_accum = rows_step // micro
    else:
        micro, grad_accum = even_split(rows_step, rows_fit)
    inputs = {
        "b_noise_tokens": b_noise,
        "confirmed_tokens": getattr(noise, "confirmed_tokens", None),
        "rows_fit": rows_fit,
        "tokens_per_micro_batch": m,
        "t_step_seconds": t_step,
        "t_micro_seconds": t_micro,
        "t_step_repeats": step_repeats,
        "t_micro_repeats": micro_repeats,
        "corpus_scored_tokens": corpus_scored_tokens,
        "rows_wanted": rows_step,
        "fixed_cost": fixed,
        "step_for": step_for if rows_per_step is None else "given",
        "rows_rule": rows_rule,
    }
    return StepPlan(
        tokens_per_step=target, b_star_tokens=b_star, clamped_by=clamped, micro_batch=micro,
        grad_accum=grad_accum, rows_per_step=micro * grad_accum, cut=micro < rows_fit, inputs=inputs,
        given_rows=rows_per_step,
    )
