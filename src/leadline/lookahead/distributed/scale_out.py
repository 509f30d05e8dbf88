"""How far data parallelism pays: the global batch, steps, tokens and wall time per GPU count.

McCandlish et al. (2018, eq. 2.11): at a batch of B tokens, reaching a given loss takes

    S(B) = S_min (1 + B_noise / B) steps   and   E(B) = E_min (1 + B / B_noise) tokens,
    E_min = S_min B_noise.

On n GPUs that each run micro-batches of m scored tokens in t_micro seconds, a step of B
tokens costs (the cost model B* comes from, with n micro-batches in parallel)

    T(B, n) = (B / (n m)) t_micro + t_step + t_comm(n)

seconds, so the wall time to the loss, S(B) T(B, n), is least at

    B*_n = sqrt(B_noise × n m × (t_step + t_comm(n)) / t_micro),

clamped as the plan clamps its step: never past B_noise (beyond the knee a token buys less
than a step saves), never below one row per GPU. Past the GPU count where one row per GPU is
already B_noise, more GPUs make the step bigger than the noise and buy almost no steps.

S_min comes from the plan: its run of ``total_steps`` at ``tokens_per_step`` reaches some loss;
the same loss at B takes S(B) steps with S_min = total_steps / (1 + B_noise / tokens_per_step).
Without ``total_steps`` every count is in units of S_min.

Where the plan measured a micro-batch's fixed cost (one row timed beside ``rows_fit`` rows: a
micro-batch takes a + c r seconds for r rows), T(B, n) = ceil(r / rows_fit) a + c r + t_step +
t_comm(n) with r = B / (n x tokens a row) rows a GPU, and B*_n is the whole rows a GPU that make
S(B) T(B, n) least, up to B_noise: the cost model the plan's own step was taken with, so the
one-GPU row is the plan's step (noise/step.py). A small model's micro-batch is mostly fixed
cost, and the proportional model above then puts the batch far too low and the wall times far
too short (docs/distributed.md, "Scale-out", has the measured case).

The communication: t_comm(1) = 0; a ring all-reduce moves 2 (n - 1)/n of the gradient per
GPU, so a time measured on W GPUs is scaled by (2(n-1)/n) / (2(W-1)/W). Unmeasured (a plan
derived on one GPU), it is taken as free and every wall time is a lower bound — the table says
so. Adding GPUs "stops paying" at the first count whose efficiency, speed-up / n (the share of
the GPU time that shortens the run), falls below ``min_efficiency`` (one half: past it, the
GPU-hours to the loss more than double).

References:
    McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch Training",
    arXiv:1812.06162 (2018), §2.2, eq. 2.11.
"""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from leadline.errors import InputError
from leadline.plan import Plan, Value

DEFAULT_GPUS = (1, 2, 4, 8, 16, 32, 64)
"""The GPU counts of the table when none are given."""
MIN_EFFICIENCY = 0.5
"""Below this efficiency (speed-up / n) adding GPUs stops paying: the GPU-hours to the loss more than double."""


def ring_factor(n: int) -> float:
    """The share of the gradient a ring all-reduce moves through each GPU: 2 (n - 1) / n.

    Examples:
        >>> ring_factor(1), ring_factor(2), ring_factor(8)
        (0.0, 1.0, 1.75)
    """
    return 2.0 * (n - 1) / n


def comm_seconds(n: int, measured_seconds: float | None, measured_world: int | None) -> float:
    """t_comm(n): 0 on one GPU or unmeasured; else the measured time scaled by the ring factor,
    t_comm(n) = t_W × ring_factor(n) / ring_factor(W).

    Examples:
        0.2 s measured on 2 GPUs is 0.2 × 1.5 / 1 s on 4; unmeasured it is free:

        >>> round(comm_seconds(4, 0.2, 2), 9), comm_seconds(1, 0.2, 2), comm_seconds(4, None, None)
        (0.3, 0.0, 0.0)
    """
    if n <= 1 or measured_seconds is None or measured_world is None or measured_world < 2:
        return 0.0
    return float(measured_seconds) * ring_factor(n) / ring_factor(measured_world)


@dataclass(frozen=True)
class ScaleRow:
    """One GPU count: the batch, the steps and tokens to the loss, the time.

    Attributes:
        gpus: n.
        batch_tokens: the global step B in scored tokens (B*_n after its clamps).
        b_star_tokens: B*_n before the clamps.
        clamped_by: "noise scale", "a row per GPU" or None.
        grad_accum: micro-batches a GPU a step, ceil(B / (n m)).
        steps: S(B) = S_min (1 + B_noise / B).
        tokens: E(B) = S(B) B.
        seconds_per_step: T(B, n).
        comm_seconds: t_comm(n), inside ``seconds_per_step``.
        wall_seconds: S(B) T(B, n).
        speedup: wall on one GPU / wall on n.
        efficiency: speedup / n.

    Examples:
        B_noise 1,000 tokens, micro-batches of 100 tokens in 1 s, a 0.1 s update: on 2 GPUs
        B* = sqrt(1,000 × 2 × 100 × 0.1 / 1) = 141 tokens, S = 1 + 1,000/141 = 8.07 S_min.

        >>> r = scale_out_table(1000, 100, 50, 1.0, 0.1, gpus=(1, 2)).row(2)
        >>> round(r.batch_tokens), r.clamped_by, r.grad_accum, round(r.steps, 2), round(r.wall_seconds, 2)
        (141, None, 1, 8.07, 6.51)
        >>> round(r.speedup, 2), round(r.efficiency, 2)     # 12.1 / 6.51 on one GPU against two
        (1.86, 0.93)
    """

    gpus: int
    batch_tokens: float
    b_star_tokens: float
    clamped_by: str | None
    grad_accum: int
    steps: float
    tokens: float
    seconds_per_step: float
    comm_seconds: float
    wall_seconds: float
    speedup: float
    efficiency: float


def _row_fixed(n: int, b_noise: float, per_row: float, rows_fit: int, a: float, c_row: float, t_step: float,
               comm: float, s_min: float) -> dict[str, Any]:
    """A row of the table under the fixed-cost model (the module docstring)."""
    from leadline.lookahead.noise.step import least_time_rows

    c = t_step + comm
    top = max(1, math.floor(b_noise / (n * per_row)))
    r = least_time_rows(b_noise, n * per_row, rows_fit, a, c_row, c, None)
    target = r * n * per_row
    clamped = "a row per GPU" if r == 1 else "noise scale" if r == top else None
    accum = -(-r // rows_fit)
    sec = accum * a + c_row * r + c
    steps = s_min * (1.0 + b_noise / target)
    return {"gpus": n, "batch_tokens": target, "b_star_tokens": target, "clamped_by": clamped, "grad_accum": accum,
            "steps": steps, "tokens": steps * target, "seconds_per_step": sec, "comm_seconds": comm,
            "wall_seconds": steps * sec}


def _row(n: int, b_noise: float, m: float, per_row: float, t_micro: float, t_step: float, comm: float,
         s_min: float) -> dict[str, Any]:
    c = t_step + comm
    b_star = math.sqrt(b_noise * n * m * c / t_micro)
    target, clamped = b_star, None
    if target > b_noise:
        target, clamped = b_noise, "noise scale"
    if target < n * per_row:
        target, clamped = n * per_row, "a row per GPU"
    sec = target / (n * m) * t_micro + c
    steps = s_min * (1.0 + b_noise / target)
    return {"gpus": n, "batch_tokens": target, "b_star_tokens": b_star, "clamped_by": clamped,
            "grad_accum": max(1, math.ceil(target / (n * m) - 1e-9)), "steps": steps, "tokens": steps * target,
            "seconds_per_step": sec, "comm_seconds": comm, "wall_seconds": steps * sec}


@dataclass
class ScaleOut:
    """The scale-out table and what it rests on. ``table()`` is the text, ``as_values()`` the
    plan's ``scale_out_gpus`` with everything as evidence.

    Attributes:
        rows: one :class:`ScaleRow` a GPU count, in increasing count.
        knee_gpus: B_noise / m, where one micro-batch a GPU is already a step of B_noise.
        pays_up_to: the most GPUs before the first count below ``min_efficiency``.
        stops_paying_at: that first count (None: none up to the last row).
        comm: the all-reduce the table scaled (``measured_seconds``, ``world_size``, ``text``).
        assumptions: the sentences under the table.

    Examples:
        >>> so = scale_out_table(1000, 100, 50, 1.0, 0.1, gpus=(1, 2, 4, 8), comm_seconds_measured=0.4,
        ...                      comm_world_size=2)
        >>> so.pays_up_to, so.stops_paying_at, so.knee_gpus
        (4, 8, 10.0)
        >>> for line in so.table().splitlines()[1:4]:
        ...     print(line)
         GPUs  step tokens  accum     steps       tokens    s/step wall (s x S_min)  speed-up   eff.
            1          100      1        11        1,100       1.1           12.1        1x   100%
            2          316      2     4.162        1,316     2.081          8.662      1.4x    70%
        >>> so.sentence()
        'data parallelism pays up to 4 GPUs (at 8 GPUs the efficiency falls below 50%); one micro-batch a GPU ...'
        >>> v = so.as_values()["scale_out_gpus"]
        >>> v.value, v.kind, v.unit, len(v.evidence["rows"])
        (4, 'derived', 'GPUs', 4)
        >>> so.row(3)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: the scale-out table has no row for 3 GPUs; it has 1, 2, 4, 8
    """

    rows: list[ScaleRow]
    b_noise_tokens: float
    tokens_per_micro_batch: float
    tokens_per_row: float
    t_micro_seconds: float
    t_step_seconds: float
    s_min: float
    absolute: bool
    knee_gpus: float
    pays_up_to: int
    stops_paying_at: int | None
    min_efficiency: float
    comm: dict[str, Any]
    assumptions: list[str] = field(default_factory=list)

    def row(self, gpus: int) -> ScaleRow:
        """The row of ``gpus`` GPUs; a count the table has no row for is refused, naming the rows."""
        for r in self.rows:
            if r.gpus == gpus:
                return r
        raise InputError(f"the scale-out table has no row for {gpus} GPUs; it has "
                         f"{', '.join(str(r.gpus) for r in self.rows)}")

    def sentence(self) -> str:
        """Where adding GPUs stops paying and where the knee lies, in one sentence."""
        stop = (f"at {self.stops_paying_at} GPUs the efficiency falls below {self.min_efficiency:.0%}"
                if self.stops_paying_at is not None else f"no count up to {self.rows[-1].gpus} falls below "
                                                         f"{self.min_efficiency:.0%} efficiency")
        return (f"data parallelism pays up to {self.pays_up_to} GPUs ({stop}); one micro-batch a GPU reaches B_noise "
                f"{_num(self.b_noise_tokens)} tokens at {self.knee_gpus:.3g} GPUs (McCandlish et al. 2018: "
                "S_min(1+B_noise/B), E_min(1+B/B_noise))")

    def table(self) -> str:
        """The table as text: a head line, a row a GPU count, the sentence, the assumptions."""
        unit = "s" if self.absolute else "s x S_min"
        head = (f"scale-out: B_noise {_num(self.b_noise_tokens)} tokens, {_num(self.tokens_per_micro_batch)} tokens a "
                "micro-batch a GPU "
                f"at t_micro {self.t_micro_seconds:.4g} s, t_step {self.t_step_seconds:.4g} s, {self.comm['text']}")
        cols = (f"{'GPUs':>5} {'step tokens':>12} {'accum':>6} {'steps':>9} {'tokens':>12} {'s/step':>9} "
                f"{'wall (' + unit + ')':>14} {'speed-up':>9} {'eff.':>6}")
        lines = [head, cols]
        for r in self.rows:
            mark = {"noise scale": " (B_noise)", "a row per GPU": " (1 row/GPU)"}.get(r.clamped_by or "", "")
            lines.append(f"{r.gpus:>5} {_num(r.batch_tokens):>12} {r.grad_accum:>6} {r.steps:>9.4g} "
                         f"{_num(r.tokens):>12} "
                         f"{r.seconds_per_step:>9.4g} {r.wall_seconds:>14.4g} {r.speedup:>8.3g}x "
                         f"{r.efficiency:>6.0%}{mark}")
        lines.append(self.sentence())
        lines.extend(f"- {a}" for a in self.assumptions)
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        """Everything as JSON data (the evidence of :meth:`as_values`)."""
        d = asdict(self)
        d["rows"] = [asdict(r) for r in self.rows]
        return d

    def as_values(self) -> dict[str, Value]:
        """The plan's ``scale_out_gpus``: :attr:`pays_up_to`, derived, the sentence its source."""
        return {"scale_out_gpus": Value(self.pays_up_to, "derived", self.sentence(), evidence=self.as_dict(),
                                        unit="GPUs")}


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _positive(name: str, v: Any, zero_ok: bool = False) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v >= 0 if zero_ok else v > 0)
    if not ok:
        raise InputError(f"scale-out needs {name} {'>= 0' if zero_ok else '> 0'} and finite, got {v!r}")
    return float(v)


def scale_out_table(b_noise_tokens: float, tokens_per_micro_batch: float, tokens_per_row: float, t_micro_seconds: float,
                    t_step_seconds: float, *, gpus: Sequence[int] = DEFAULT_GPUS,
                    comm_seconds_measured: float | None = None,
                    comm_world_size: int | None = None, s_min: float = 1.0, absolute: bool = False,
                    min_efficiency: float = MIN_EFFICIENCY, assumptions: Sequence[str] = (),
                    fixed_cost: dict[str, float] | None = None) -> ScaleOut:
    """The table from the numbers (pure math; see the module for every formula).

    Args:
        b_noise_tokens: B_noise in scored tokens.
        tokens_per_micro_batch: m, the scored tokens of the micro-batch t_micro was measured at.
        tokens_per_row: scored tokens a row (the least step is a row per GPU).
        t_micro_seconds, t_step_seconds: one forward+backward at m; the optimizer update.
        gpus: the counts, whole and >= 1 (one GPU is always computed, for the speed-up).
        comm_seconds_measured / comm_world_size: an all-reduce of the trained gradients timed on
            that many GPUs (None: unmeasured, taken as free).
        s_min: S_min in steps (1: everything in units of S_min); absolute: S_min came from a run.
        min_efficiency: the efficiency below which adding GPUs stops paying.
        fixed_cost: ``{"a_seconds", "c_seconds_per_row"}``, a micro-batch's fixed cost and cost a
            row (the plan's ``tokens_per_step`` evidence ``fixed_cost``): with it the rows a GPU
            are searched under that model, micro-batches of at most m / tokens a row rows.

    Examples:
        B_noise 1,000 tokens, 100 tokens a micro-batch in 1 s, 0.1 s an update, free
        communication: B*_n = sqrt(1,000 × n × 100 × 0.1 / 1), 100 tokens on one GPU, and on 8
        GPUs the least step, a row (50 tokens) a GPU, is above B*_8 = 283:

        >>> so = scale_out_table(1000, 100, 50, 1.0, 0.1, gpus=(1, 2, 4, 8))
        >>> [(r.gpus, round(r.b_star_tokens), round(r.batch_tokens), r.clamped_by) for r in so.rows]
        [(1, 100, 100, None), (2, 141, 141, None), (4, 200, 200, None), (8, 283, 400, 'a row per GPU')]
        >>> [round(r.efficiency, 2) for r in so.rows], so.stops_paying_at, so.comm["text"]
        ([1.0, 0.93, 0.84, 0.72], None, 'communication unmeasured (taken as free)')
        >>> scale_out_table(0, 100, 50, 1.0, 0.1)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: scale-out needs B_noise > 0 and finite, got 0
    """
    b = _positive("B_noise", b_noise_tokens)
    m = _positive("tokens a micro-batch", tokens_per_micro_batch)
    per_row = _positive("tokens a row", tokens_per_row)
    t_micro = _positive("t_micro_seconds", t_micro_seconds)
    t_step = _positive("t_step_seconds", t_step_seconds, zero_ok=True)
    s_min = _positive("S_min", s_min)
    if not 0 < min_efficiency <= 1:
        raise InputError(f"scale-out's min_efficiency must be in (0, 1], got {min_efficiency!r}")
    counts = []
    for n in gpus:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InputError(f"scale_out(gpus=...) needs whole GPU counts >= 1, got {n!r}")
        if n not in counts:
            counts.append(n)
    counts.sort()
    if not counts:
        raise InputError("scale_out(gpus=...) needs at least one GPU count")
    if fixed_cost is not None:
        a = _positive("a micro-batch's fixed cost", fixed_cost.get("a_seconds"), zero_ok=True)
        c_row = _positive("a row's cost", fixed_cost.get("c_seconds_per_row"))
        rows_fit = max(1, round(m / per_row))

        def row_at(n: int, comm: float) -> dict[str, Any]:
            return _row_fixed(n, b, per_row, rows_fit, a, c_row, t_step, comm, s_min)
    else:
        def row_at(n: int, comm: float) -> dict[str, Any]:
            return _row(n, b, m, per_row, t_micro, t_step, comm, s_min)
    one = row_at(1, 0.0)
    rows = []
    for n in counts:
        r = row_at(n, comm_seconds(n, comm_seconds_measured, comm_world_size))
        speedup = one["wall_seconds"] / r["wall_seconds"]
        rows.append(ScaleRow(**r, speedup=speedup, efficiency=speedup / n))
    paying = [r.gpus for r in rows if r.efficiency >= min_efficiency]
    stops = next((r.gpus for r in rows if r.efficiency < min_efficiency), None)
    pays_up_to = max((g for g in paying if stops is None or g < stops), default=1)
    if comm_seconds_measured is None or comm_world_size is None or comm_world_size < 2:
        comm = {"measured_seconds": None, "world_size": None, "text": "communication unmeasured (taken as free)"}
    else:
        comm = {"measured_seconds": float(comm_seconds_measured), "world_size": int(comm_world_size),
                "text": f"all-reduce {float(comm_seconds_measured):.4g} s measured on {comm_world_size} GPUs, scaled "
                        "by the ring's 2(n-1)/n"}
    return ScaleOut(rows=rows, b_noise_tokens=b, tokens_per_micro_batch=m, tokens_per_row=per_row,
                    t_micro_seconds=t_micro, t_step_seconds=t_step, s_min=s_min, absolute=absolute, knee_gpus=b / m,
                    pays_up_to=pays_up_to,
                    stops_paying_at=stops, min_efficiency=min_efficiency, comm=comm, assumptions=list(assumptions))


def scale_out(plan: Plan, gpus: Sequence[int] = DEFAULT_GPUS, *, min_efficiency: float = MIN_EFFICIENCY) -> ScaleOut:
    """The scale-out table of a derived plan: from its measured B_noise, micro-batch, t_micro,
    t_step (and, for a plan derived in a job, its measured all-reduce), at each GPU count.

    Args:
        plan: a :class:`~leadline.plan.Plan` with ``noise_scale_tokens``, ``rows_fit``,
            ``scored_tokens_per_row``, ``t_micro_seconds`` and ``t_step_seconds`` (a derive
            with a model and data); ``total_steps`` and ``tokens_per_step`` make the steps and
            times absolute. Where the plan read the noise again past the answer's format
            (``noise_scale_past_format_tokens``), the table uses that reading, as the step did.
        gpus: the GPU counts (default 1, 2, 4, ..., 64).
        min_efficiency: below this efficiency adding GPUs stops paying (default 0.5).

    Returns:
        :class:`ScaleOut`; ``.table()`` prints it, ``.as_values()`` is the plan's entry.

    Raises:
        InputError: the plan lacks a value the table needs, naming it.

    Examples:
        A plan whose run of 110 steps of 100 tokens reaches its loss: S_min = 110 / (1 +
        1,000/100) = 10 steps, so the table is in steps and seconds.

        >>> from leadline.plan import Plan, Value
        >>> plan = Plan()
        >>> for name, number in {"noise_scale_tokens": 1000.0, "rows_fit": 2, "scored_tokens_per_row": 50.0,
        ...                      "t_micro_seconds": 1.0, "t_step_seconds": 0.1, "total_steps": 110,
        ...                      "tokens_per_step": 100.0}.items():
        ...     plan.set(name, Value(number, "measured", "a worked example"))
        >>> so = scale_out(plan, gpus=(1, 2, 4))
        >>> so.s_min, so.absolute, [(r.gpus, round(r.steps, 1), round(r.wall_seconds, 1)) for r in so.rows]
        (10.0, True, [(1, 110.0, 121.0), (2, 80.7, 65.1), (4, 60.0, 36.0)])
        >>> so.assumptions[0]
        'communication unmeasured (a plan derived on one GPU): taken as free, so every wall time beyond one GPU ...'
        >>> scale_out(Plan())
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: the scale-out table needs the plan's noise_scale_tokens, rows_fit, ...
    """
    need = ("noise_scale_tokens", "rows_fit", "scored_tokens_per_row", "t_micro_seconds", "t_step_seconds")
    missing = [n for n in need if not isinstance(plan.get(n), (int, float)) or isinstance(plan.get(n), bool)]
    if missing:
        raise InputError(f"the scale-out table needs the plan's {', '.join(missing)}; derive the plan with a model and "
                         "data (`leadline derive --model ... --data ...`)")
    key = "noise_scale_tokens"
    past = plan.get("noise_scale_past_format_tokens")
    notes = []
    if isinstance(past, (int, float)) and not isinstance(past, bool) and math.isfinite(past) and past > 0:
        key = "noise_scale_past_format_tokens"  # the reading the plan's step was taken from
        notes.append(f"B_noise {_num(float(past))} tokens read past the answer's format (the reading the plan's step "
                     "was taken from), "
                     f"not {_num(float(plan.get('noise_scale_tokens')))} at step 0")
    b = float(plan.get(key))
    per_row = float(plan.get("scored_tokens_per_row"))
    m = int(plan.get("rows_fit")) * per_row
    ev = plan[key].evidence if isinstance(plan[key].evidence, dict) else {}
    if ev.get("lower_bound"):
        notes.append("B_noise is a lower bound (|G|² did not resolve): the knee lies further out and the table is "
                     "pessimistic about many GPUs")
    elif ev.get("upper_bound"):
        notes.append("B_noise is an upper bound (S did not resolve): the knee may lie closer and the table is "
                     "optimistic about many GPUs")
    elif ev and not ev.get("settled", True):
        notes.append("the noise probe did not settle (coarse B_noise): read the knee with its standard error")
    comm_s = plan.get("t_allreduce_seconds")
    comm_w = None
    if isinstance(comm_s, (int, float)):
        cev = plan["t_allreduce_seconds"].evidence if isinstance(plan["t_allreduce_seconds"].evidence, dict) else {}
        comm_w = int(cev.get("world_size") or plan.get("world_size") or 0) or None
        notes.append(f"communication measured on {comm_w} GPUs of one host and scaled by the ring's 2(n-1)/n, counted "
                     "whole per step "
                     "(DDP overlaps it with the backward: an upper bound); across hosts the bandwidth is lower and "
                     "these times optimistic")
    else:
        comm_s = None
        world = plan.get("world_size")
        if isinstance(world, int) and world > 1:
            notes.append(f"communication not timed apart (a plan derived on {world} ranks with the model sharded: its "
                         "all-gathers and "
                         f"reduce-scatters at {world} ranks are inside the measured t_micro, and the other counts "
                         "scale them as compute)")
        else:
            notes.append("communication unmeasured (a plan derived on one GPU): taken as free, so every wall time "
                         "beyond one GPU is a lower bound; "
                         "derive under torchrun to measure the all-reduce")
    fixed = _fixed_cost_of(plan)
    if fixed is not None:
        notes.append(f"a micro-batch costs {fixed['a_seconds']:.4g} s fixed + {fixed['c_seconds_per_row']:.4g} s a row "
                     "(measured at 1 row "
                     f"and at {int(plan.get('rows_fit'))}), the model the plan's step was taken with: the rows a GPU "
                     "are the least-time whole rows")
    else:
        notes.append("a step's compute is taken as proportional to its tokens (t_micro / m per token, the cost model "
                     "B* comes from): "
                     "micro-batches smaller than the measured one run less efficiently than that")
    total, step = plan.get("total_steps"), plan.get("tokens_per_step")
    if isinstance(total, (int, float)) and isinstance(step, (int, float)) and step > 0 and total > 0:
        s_min, absolute = float(total) / (1.0 + b / float(step)), True
        notes.append(f"S_min = total_steps {total:,} / (1 + B_noise / tokens_per_step {_num(float(step))}) = "
                     f"{s_min:.4g}: "
                     "the steps to the loss the plan's run reaches")
    else:
        s_min, absolute = 1.0, False
        notes.append("the plan has no total_steps: steps, tokens and wall times are in units of S_min")
    return scale_out_table(b, m, per_row, float(plan.get("t_micro_seconds")), float(plan.get("t_step_seconds")),
                           gpus=gpus, comm_seconds_measured=comm_s, comm_world_size=comm_w, s_min=s_min,
                           absolute=absolute,
                           min_efficiency=min_efficiency, assumptions=notes, fixed_cost=fixed)


def _fixed_cost_of(plan: Plan) -> dict[str, float] | None:
    """The micro-batch's fixed cost the plan's step was taken with, where it was measured."""
    v = plan.values.get("tokens_per_step") if hasattr(plan, "values") else None
    ev = v.evidence if v is not None and isinstance(v.evidence, dict) else {}
    fixed = ev.get("fixed_cost")
    if isinstance(fixed, dict) and all(isinstance(fixed.get(k), (int, float))
                                       for k in ("a_seconds", "c_seconds_per_row")):
        return {"a_seconds": float(fixed["a_seconds"]), "c_seconds_per_row": float(fixed["c_seconds_per_row"])}
    return None


class _CallableModule(types.ModuleType):
    """This module, callable as :func:`scale_out`: once it is imported, Python sets the module
    as ``leadline.lookahead.distributed``'s attribute ``scale_out``, so ``from leadline.lookahead.distributed import
    scale_out`` gives the module; calling it calls the function."""

    def __call__(self, *args: Any, **kwargs: Any) -> ScaleOut:
        return scale_out(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
