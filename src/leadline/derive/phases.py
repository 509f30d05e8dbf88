"""derive()'s phases as calls: each takes what earlier phases put in the plan and returns the
values it adds (the measuring is in the phase modules; these adapt their results to the plan),
and the wrappers that hold a phase's reads and steps to derive's time budget."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from leadline._phases import OutOfTime, PhaseRunner
from leadline.errors import InputError
from leadline.plan import Plan, Value


def _timed(train_step_of: Callable[[int, int], Callable[[int], Any]], ensure: Callable[[float], None],
           estimate: Callable[[int, int], float] | None = None) -> Callable[[int, int], Callable[[int], Any]]:
    """train_step_of whose steps first check that one more step, as long as the last one took,
    fits in derive's time budget: max_seconds bounds a running look-ahead. Before the first
    step, ``estimate(micro_batch, grad_accum)`` (from the memory phase's timings) stands in for
    the step not yet taken."""
    last: dict[tuple[int, int], float] = {}  # per shape: a burn-in step does not time the plan's

    def of(micro_batch: int, grad_accum: int) -> Callable[[int], Any]:
        inner, shape = train_step_of(micro_batch, grad_accum), (micro_batch, grad_accum)

        def step(t: int) -> Any:
            ensure(last[shape] if shape in last else (estimate(micro_batch, grad_accum) if estimate else 0.0))
            t0 = time.perf_counter()
            try:
                return inner(t)
            finally:
                last[shape] = time.perf_counter() - t0

        return step

    return of


def _timed_held(held_out: Callable[[], Sequence[float]], ensure: Callable[[float], None],
                estimate: Callable[[], float] | None = None) -> Callable[[], Sequence[float]]:
    """The held-out reader, checking before each read that one more read, as long as the last
    one took, fits in derive's time budget; ``estimate()`` stands in for the first read."""
    last: list[float | None] = [None]

    def read() -> Sequence[float]:
        ensure(last[0] if last[0] is not None else (estimate() if estimate else 0.0))
        t0 = time.perf_counter()
        try:
            return held_out()
        finally:
            last[0] = time.perf_counter() - t0

    return read


def _seconds_per_row(plan: Plan) -> float | None:
    """One row's forward+backward at the planned length, from the memory phase's t_micro."""
    t, rows = plan.get("t_micro_seconds"), plan.get("rows_fit")
    if not isinstance(t, (int, float)) or not isinstance(rows, (int, float)) or rows < 1:
        return None
    return float(t) / float(rows)


def step_estimate(plan: Plan) -> Callable[[int, int], float]:
    """The seconds a training step of micro_batch x grad_accum rows should take, from the
    memory phase's per-row forward+backward and the optimizer update (0 when not measured)."""
    def est(micro_batch: int, grad_accum: int) -> float:
        per_row, t_step = _seconds_per_row(plan), plan.get("t_step_seconds")
        upd = float(t_step) if isinstance(t_step, (int, float)) else 0.0
        return 0.0 if per_row is None else per_row * micro_batch * grad_accum + upd
    return est


def held_estimate(plan: Plan, held_out: Callable[[], Sequence[float]]) -> Callable[[], float]:
    """The seconds one held-out read should take: its rows (the reader's ``rows``) forward only,
    taken as half a forward+backward (LoRA's backward skips the frozen weights' gradients, so
    half is the cautious share). 0 when the reader does not say its rows or nothing was timed."""
    def est() -> float:
        per_row, n = _seconds_per_row(plan), getattr(held_out, "rows", None)
        return 0.0 if per_row is None or not isinstance(n, int) else 0.5 * per_row * n
    return est


# ---- the phases -------------------------------------------------------------------------
def _corpus(source: Any, tokenizer: Any, seq_len: int | None, quantile: float | None, ctx: dict[str, Any]) -> dict[str, Value]:
    from leadline.corpus import profile_corpus

    prof = profile_corpus(source, tokenizer, seq_len=seq_len, quantile=quantile)
    ctx["profile"] = prof
    return prof.as_values()


def _noise(grad_fn: Any, runner: PhaseRunner, ctx: dict[str, Any], world: Any = None) -> dict[str, Value]:
    from leadline.noise import measure_noise_scale

    left = runner.seconds_left()
    budget = None if left is None else max(1.0, 0.3 * left)
    if world is not None and hasattr(grad_fn, "measure"):  # the noise from DDP's all-reduce
        from leadline.distributed.hook import noise_values

        noise = grad_fn.measure(budget_s=budget)
        ctx["noise"] = noise
        return noise_values(noise, world)
    noise = measure_noise_scale(grad_fn, budget_s=budget)
    ctx["noise"] = noise
    return noise.as_values()


MEMORY_SHARE = 0.3
"""The share of the time left that the memory ramp may take under ``max_seconds`` (the noise
probe's is the same): the first step, the burn-in and the rate come after it."""


def _rows_needed(plan: Plan) -> int | None:
    """The ramp's upper limit: the rows the target step can need (B_noise's upper edge over the
    scored tokens per row), and at least the rows the probe drew — the batch whose gradient it
    has seen, which the first step and the burn-in past the format train at (at step 0 the
    noise reads the format's few tokens, and a one-row burn-in learns the format slowly: on
    debian_sections, 30 one-row steps left the noise at 2.5 tokens)."""
    b = plan.get("noise_scale_tokens")
    per_row = plan.get("scored_tokens_per_row")
    if not isinstance(b, (int, float)) or not isinstance(per_row, (int, float)) or per_row <= 0 or not math.isfinite(b):
        return None
    ev = plan["noise_scale_tokens"].evidence if isinstance(plan["noise_scale_tokens"].evidence, dict) else {}
    se = ev.get("se_tokens", 0)
    upper = b + (se if isinstance(se, (int, float)) and math.isfinite(se) else 0)
    drawn = sum(t for t in ev.get("micro_tokens") or [] if isinstance(t, (int, float)))
    return max(1, math.ceil(upper / per_row), math.floor(drawn / per_row))


def _draw_seconds(noise: Any) -> float:
    """The mean seconds of one noise-probe draw (a forward+backward of its rows), 0 when unknown."""
    k, seconds = getattr(noise, "k", 0) or 0, getattr(noise, "seconds", None)
    return float(seconds) / k if k and isinstance(seconds, (int, float)) else 0.0


def _memory(step_fn: Any, plan: Plan, lengths: Sequence[int] | None, prior: Plan | None, ctx: dict[str, Any],
            world: Any = None, params: Sequence[Any] = (), runner: PhaseRunner | None = None) -> dict[str, Value]:
    from leadline.memory import ramp

    length = plan.get("seq_len")
    if length is None:
        raise InputError("the memory ramp needs the run's length: pass data= (and a tokenizer) or seq_len=")
    max_rows = _rows_needed(plan)
    if world is not None:
        from leadline.distributed.phases import rows_needed_per_rank

        max_rows = rows_needed_per_rank(max_rows, world.world_size)
    # max_seconds: the search stops when one more rung as long as the last would pass
    # MEMORY_SHARE of the time left at its start (or the budget), and keeps what it confirmed:
    # the phases after it need a micro-batch more than a larger one
    if runner is not None and world is None:
        # the least ramp (a warm-up row, then one row three times) is about four one-row steps:
        # two of derive_for's 2-row noise draws; max_seconds must not start a ramp it cannot end
        runner.ensure(2.0 * _draw_seconds(ctx.get("noise")))
    stop = too_long = None
    left = runner.seconds_left() if runner is not None else None
    if runner is not None and left is not None:
        t_start, share = time.perf_counter(), MEMORY_SHARE * left

        def too_long(seconds: float) -> bool:
            return runner.would_overrun(seconds) or time.perf_counter() - t_start + 1.5 * seconds > share

        def stop(rung: Any) -> bool:
            return too_long(rung.seconds)
    start = 1
    if prior is not None and isinstance(prior.get("rows_fit"), int):
        start = max(1, min(prior.get("rows_fit"), max_rows or prior.get("rows_fit")))
    if world is not None and callable(getattr(step_fn, "lockstep_memory", None)):  # a sharded model: one ramp, every rank in step
        ctx["ramp"], values = step_fn.lockstep_memory(int(length), lengths=lengths, max_rows=max_rows, start_rows=start,
                                                          should_stop=stop)
        return values
    if world is not None:  # every rank ramps its own card; the plan takes the least
        from leadline.distributed.phases import world_memory

        ctx["ramp"], values = world_memory(world, lambda: ramp(step_fn, int(length), lengths=lengths, max_rows=max_rows, start_rows=start,
                                                               should_stop=stop),
                                           step_fn, params or step_fn.params())
        return values
    result = ramp(step_fn, int(length), lengths=lengths, max_rows=max_rows, start_rows=start, should_stop=stop, too_long=too_long)
    ctx["ramp"] = result
    values = result.as_values()
    out = {("rows_fit" if n == "micro_batch" else n): v for n, v in values.items()}
    return out


def _step(plan: Plan, ctx: dict[str, Any], world: Any = None, step_fn: Any = None, noise: Any = None) -> dict[str, Value]:
    from leadline.noise import tokens_per_step

    rows_fit = int(plan.get("rows_fit"))
    per_row = float(plan.get("scored_tokens_per_row") or 1.0)
    if noise is None:
        noise = ctx.get("noise", plan.get("noise_scale_tokens"))
    if world is not None:  # the step over the whole world: micro x accum x world size
        from leadline.distributed.phases import world_step

        return world_step(noise, world_size=world.world_size, rows_fit=rows_fit, tokens_per_row=per_row,
                          t_step_seconds=plan.get("t_step_seconds"), t_micro_seconds=plan.get("t_micro_seconds"),
                          t_allreduce_seconds=plan.get("t_allreduce_seconds", 0.0), corpus_scored_tokens=plan.get("scored_tokens"))
    one_row = None
    if step_fn is not None and rows_fit > 1 and plan.get("seq_len"):  # the fixed cost of a micro-batch (noise/step.py)
        one_row = list(step_fn(1, int(plan.get("seq_len")), repeats=3).micro_seconds)
    sp = tokens_per_step(noise, rows_fit=rows_fit, tokens_per_micro_batch=rows_fit * per_row,
                         t_step_seconds=plan.get("t_step_seconds"), t_micro_seconds=plan.get("t_micro_seconds"),
                         corpus_scored_tokens=plan.get("scored_tokens"), t_micro_one_row_seconds=one_row)
    ctx["step"] = sp
    return sp.as_values()


def _past_format(params: list[Any], opt: Any, train_step_of: Callable[[int, int], Any], grad_fn: Any, step_fn: Any,
                 plan: Plan, ctx: dict[str, Any], lengths: Sequence[int] | None, runner: PhaseRunner,
                 named: list[tuple[str, Any]] = (), trained_as: str = "factors") -> dict[str, Value]:
    """Burn in past the answer's format, read the noise again, and when it grew, ramp on to the
    rows it needs and take the step from it (noise/past_format.py)."""
    from types import SimpleNamespace

    from leadline.memory import ramp
    from leadline.noise.past_format import noise_past_format
    from leadline.rate.warmup import warmup_steps_for

    nv = plan["noise_scale_tokens"]
    se0 = nv.evidence.get("se_tokens") if isinstance(nv.evidence, dict) else None
    step0 = ctx.get("noise") or SimpleNamespace(b_noise_tokens=nv.value, se_tokens=se0 or 0.0)
    if not isinstance(getattr(step0, "b_noise_tokens", None), (int, float)):
        return {}
    mb, accum = _burn_in_batch(plan)
    per_row = float(plan.get("scored_tokens_per_row") or 1.0)
    if callable(getattr(grad_fn, "with_rows", None)) and mb * accum > int(getattr(grad_fn, "rows_per_draw", 1) or 1):
        # the late reading draws a training step's rows at a time: past the format B_noise is tens
        # to hundreds of tokens, beyond the reach of the step-0 probe's small draws (docs/noise.md)
        grad_fn = grad_fn.with_rows(mb * accum)
    rows_per_draw = getattr(grad_fn, "rows_per_draw", None)
    if not rows_per_draw:
        micro = getattr(step0, "micro_tokens", None) or []
        rows_per_draw = max(1, round((sum(micro) / len(micro)) / per_row)) if micro else 1
    betas = opt.param_groups[0].get("betas") if opt.param_groups else None
    w = warmup_steps_for(float(betas[0]) if betas else 0.9)
    def probe_start(steps: int) -> int:  # the first draw past every row the burn-in trained
        return math.ceil(steps * mb * accum / rows_per_draw)

    rows = plan.get("rows")
    held = plan.held_out.get("train") if isinstance(plan.held_out.get("train"), list) else None
    train_rows = len(held) if held is not None else (rows if isinstance(rows, int) else None)
    max_steps = None if not train_rows else max(w, train_rows // (4 * mb * accum))  # a quarter of the run's rows
    left = runner.seconds_left()
    alpha1 = float(plan.get("alpha1"))
    rate = alpha1 / 2
    if named:  # never above the anchor: alpha1/2 made the 16-row burn-in's loss rise on debian_sections
        from leadline.rate import anchor_rate

        rate = min(rate, float(anchor_rate(named, trained_as=trained_as).lr))
    pf = noise_past_format(params, opt, train_step_of(mb, accum), grad_fn, alpha1, step0, rate=rate,
                           rows_per_step=mb * accum, probe_start=probe_start, round_steps=w, max_steps=max_steps,
                           budget_s=None if left is None else 0.25 * left, check_time=runner.check_time)
    ctx["past_format"] = pf
    out = pf.as_values()
    v = out["noise_scale_past_format_tokens"]
    out["noise_scale_past_format_tokens"] = Value(v.value, v.kind, f"{v.source}; the reading in draws of {rows_per_draw} rows",
                                                  {**v.evidence, "rows_per_draw": rows_per_draw}, v.seconds, v.unit)
    if not pf.grew or pf.noise is None:
        return out
    need = max(1, math.ceil((pf.b_noise_tokens + (pf.se_tokens or 0.0)) / per_row))
    rows_fit = int(plan.get("rows_fit"))
    ev = plan["rows_fit"].evidence if isinstance(plan["rows_fit"].evidence, dict) else {}
    capped = str(ev.get("stopped_because", "")).startswith("reached the upper limit")
    if need > rows_fit and capped:  # the first ramp stopped at the rows the step-0 noise needed: go on from there
        try:  # each rung must fit in max_seconds; cut, the step is taken at the rows already kept (grad_accum makes up the rest)
            result = ramp(step_fn, int(plan.get("seq_len")), lengths=lengths, max_rows=need, start_rows=rows_fit,
                          on_rung=lambda r: runner.ensure(r.seconds))
        except OutOfTime:
            plan.notes.append(f"past_format: the ramp from {rows_fit} toward {need} rows was cut by max_seconds; the step uses the {rows_fit} rows kept")
            result = None
        if result is not None:
            ctx["ramp"] = result
            for n, v in result.as_values().items():
                out["rows_fit" if n == "micro_batch" else n] = v
                plan.set("rows_fit" if n == "micro_batch" else n, v)
    out.update(_step(plan, ctx, step_fn=step_fn, noise=pf.noise))
    return out


def _anchor(named: list[tuple[str, Any]], trained_as: str, plan: Plan, grad_fn: Any = None) -> dict[str, Value]:
    """The anchor rate; on a sharded model the norms of the whole tensors (``grad_fn.weight_norms``)."""
    from leadline.rate import anchor_rate

    norms = grad_fn.weight_norms(named) if callable(getattr(grad_fn, "weight_norms", None)) else None
    res = anchor_rate(named, trained_as=trained_as, batch_tokens=plan.get("tokens_per_step"),
                      b_noise_tokens=plan.get("noise_scale_tokens"), norms=norms)
    return res.as_values()


def _batch_of(plan: Plan) -> tuple[int, int]:
    return int(plan.get("micro_batch", plan.get("rows_fit", 1)) or 1), int(plan.get("grad_accum", 1) or 1)


def _burn_in_batch(plan: Plan) -> tuple[int, int]:
    """The first step and the burn-in past the format train at the most rows the ramp kept (its
    limit was at least the probe's rows), one micro-batch a step; without a ramp, the plan's batch."""
    if isinstance(plan.get("rows_fit"), int):
        return int(plan.get("rows_fit")), 1
    return _batch_of(plan)


def _first_step(params: list[Any], opt: Any, train_step_of: Callable[[int, int], Any], held_out: Callable[[], Sequence[float]],
                plan: Plan, ctx: dict[str, Any], resolution: float | None = None) -> dict[str, Value]:
    from leadline.rate import measure_first_step

    mb, accum = _burn_in_batch(plan)
    kw = {} if resolution is None else {"resolution": resolution}
    fs = measure_first_step(params, opt, train_step_of(mb, accum), held_out, **kw)
    ctx["first_step"] = fs
    out = fs.as_values()
    a = out["alpha1"]
    out["alpha1"] = Value(a.value, a.kind, f"{a.source}; the first update from a step of {mb * accum} rows", a.evidence, a.seconds, a.unit)
    return out


def _rate(params: list[Any], opt: Any, train_step_of: Callable[[int, int], Any], held_out: Callable[[], Sequence[float]],
          plan: Plan, effort: str, prior: Plan | None, ctx: dict[str, Any],
          check_time: Callable[..., None] | None = None) -> dict[str, Value]:
    from leadline.rate import lookahead_lr

    if not isinstance(plan.get("alpha1"), (int, float)):
        return {}
    alpha1 = float(plan.get("alpha1"))
    if prior is not None and isinstance(prior.get("lr"), (int, float)) and isinstance(prior.get("alpha1"), (int, float)):
        ratio = alpha1 / float(prior.get("alpha1"))
        if 0.5 <= ratio <= 2.0:
            lr = float(prior.get("lr"))
            return {"lr": Value(lr, "measured", f"the prior plan's rate, kept: alpha1 re-measured at {alpha1:.3g}, {ratio:.2f}x the prior's (within 2x)",
                                evidence={"prior_alpha1": prior.get("alpha1"), "alpha1": alpha1, "prior_lr": lr}, unit="per step")}
    mb, accum = _batch_of(plan)
    total = int(plan.get("total_steps") or 100)
    short = _short_run(plan, alpha1, total) if effort == "full" else {}
    la = lookahead_lr(params, opt, train_step_of(mb, accum), held_out, ctx.get("first_step", alpha1),
                      total_steps=total, effort=effort, on_progress=check_time, **short)
    ctx["lookahead"] = la
    out = la.as_values()
    if short:
        lr = out["lr"]
        rates = ", ".join(f"{alpha1 * 2.0 ** j:.3g}" for j in short["grid"])
        out["lr"] = Value(lr.value, lr.kind, f"{lr.source}; a short run: {total} steps, whose budget of {2 * total} look-ahead steps "
                                             f"does not reach the {short['first_horizon']}-step minimum horizon at the default grid, "
                                             f"so the {len(short['grid'])} rates around the anchor ({rates}) ran from that horizon",
                          lr.evidence, lr.seconds, lr.unit)
    if effort == "quick":
        out.update(_quick_rate(plan, alpha1))
    else:
        out.update(_cut_rate(plan, la, total))
    return out


def _short_run(plan: Plan, alpha1: float, total: int) -> dict[str, Any]:
    """A run too short for the default grid to reach the minimum horizon within the look-ahead's
    budget (2 x T steps over all rates) reads fewer rates, around the anchor, from that horizon:
    the rates alpha1 x 2^j nearest the anchor (from half of it up, never above alpha1), as many
    as the budget runs to the minimum horizon (2 to 4). A 37-step plan on the H200 had read the
    default grid at 10 steps and kept 4.8e-3, 10x the anchor. {} where the default reaches it,
    no anchor below alpha1 is known, or fewer than 2 rates fit."""
    from leadline.rate.lookahead import DEFAULT_GRID, default_min_horizon

    anchor, min_h, budget = plan.get("lr_anchor"), default_min_horizon(total), 2 * total
    if len(DEFAULT_GRID) * min_h <= budget or not isinstance(anchor, (int, float)) or not 0 < anchor < alpha1:
        return {}
    k = min(4, budget // min_h)
    if k < 2:
        return {}
    top = min(0, round(math.log2(anchor / alpha1)) - 1 + k - 1)  # never above alpha1
    return {"grid": tuple(range(top - k + 1, top + 1)), "first_horizon": min_h}


def _cut_rate(plan: Plan, la: Any, total: int) -> dict[str, Value]:
    """A look-ahead that stopped before its minimum horizon — cut by max_seconds, or by its step
    budget in a short run — read its answer where a short horizon rewards the rate that learns
    the answer's format fastest (seed E8: LoRA's best at 2 and 4 steps was twice the winner; a
    37-step debian_sections run read 4.8e-3 at 10 steps, 10x the anchor): the rate is then the
    lower of its answer and the anchor, as when it was cut before its first horizon."""
    from leadline.rate.lookahead import default_min_horizon

    anchor, min_h = plan.get("lr_anchor"), default_min_horizon(total)
    if la.horizon_steps >= min(min_h, total):
        return {}
    if not isinstance(anchor, (int, float)) or not math.isfinite(anchor) or anchor <= 0 or anchor >= la.lr:
        return {}
    why = "max_seconds cut the look-ahead" if str(la.stopped_because).startswith("max_seconds") else "its step budget stopped the look-ahead"
    a = plan["lr_anchor"]
    return {"lr": Value(anchor, a.kind, f"the anchor, below the look-ahead's {la.lr:.3g}: {why} at "
                                        f"{la.horizon_steps} steps, before its {min_h}-step minimum horizon, where a short horizon rewards the rate "
                                        f"that learns the answer's format fastest ({la.stopped_because}): {a.source}",
                        {**(a.evidence or {}), "lookahead": la.evidence()}, 0.0, a.unit)}


def _quick_rate(plan: Plan, alpha1: float) -> dict[str, Value]:
    """The quick effort runs no look-ahead: its rate is the anchor where that is below alpha1
    (alpha1 is the best single step, not a rate to hold: docs/rate.md), and race() runs the
    anchor x 2^j from half the anchor up to alpha1 inside the training run."""
    anchor = plan.get("lr_anchor")
    if not isinstance(anchor, (int, float)) or not math.isfinite(anchor) or anchor <= 0 or anchor >= alpha1:
        return {}
    a = plan["lr_anchor"]
    from leadline.rate.race import quick_race_rates

    rates = quick_race_rates(anchor, alpha1)
    return {
        "lr": Value(anchor, a.kind, f"the anchor, {alpha1 / anchor:.3g}x below alpha1 {alpha1:.3g} (quick effort: no look-ahead run; alpha1 is the best single step, not a rate to hold): {a.source}",
                    a.evidence, 0.0, a.unit),
        "race_rates": Value(rates, "derived", f"the anchor x 2^j from half the anchor up to alpha1 {alpha1:.3g}, for race() inside the run (quick effort)"),
    }


def _warmup(plan: Plan, opt: Any) -> dict[str, Value]:
    from leadline.rate import warmup_values

    betas = None
    if opt is not None:
        betas = opt.param_groups[0].get("betas")
    return warmup_values(alpha1=plan.get("alpha1"), lr=plan.get("lr", plan.get("lr_anchor")), betas=betas)


def _length(plan: Plan, epochs: float) -> dict[str, Value]:
    tokens = float(plan.get("scored_tokens"))
    step = float(plan.get("tokens_per_step"))
    held = plan.held_out.get("train") if isinstance(plan.held_out.get("train"), list) else None
    rows_total = plan.get("rows")
    share = (len(held) / rows_total) if held is not None and isinstance(rows_total, int) and rows_total > 0 else 1.0
    steps = max(1, math.ceil(epochs * tokens * share / step))
    return {"total_steps": Value(steps, "derived", f"ceil(epochs {epochs:g} x scored tokens {tokens:,.0f} x train share {share:.2f} / tokens per step {step:,.0f})", unit="steps")}


def _pick_rate(plan: Plan) -> None:
    """Where the look-ahead did not finish, alpha1 (measured) is the rate; where nothing could
    run, the anchor is — a constant, listed as one."""
    alpha1 = plan.get("alpha1")
    anchor = plan.get("lr_anchor")
    has_anchor = isinstance(anchor, (int, float)) and math.isfinite(anchor) and anchor > 0
    if "lr" not in plan and isinstance(alpha1, (int, float)) and math.isfinite(alpha1) and alpha1 > 0:
        if has_anchor and anchor < alpha1:  # alpha1 is the best single step, not a rate to hold (_quick_rate)
            a = plan["lr_anchor"]
            plan.set("lr", Value(a.value, a.kind, f"the anchor, below alpha1 {alpha1:.3g} (the look-ahead did not finish within max_seconds; "
                                 f"alpha1 is the best single step, not a rate to hold): {a.source}", a.evidence, 0.0, a.unit))
            return
        a = plan["alpha1"]
        plan.set("lr", Value(a.value, "measured", f"alpha1, the first safe step (the look-ahead did not finish within max_seconds): {a.source}",
                             a.evidence, 0.0, a.unit))
        return
    if "lr" not in plan and "lr_anchor" in plan:
        a = plan["lr_anchor"]
        plan.set("lr", Value(a.value, a.kind, f"the anchor (nothing could be run for the rate): {a.source}", a.evidence, 0.0, a.unit))
