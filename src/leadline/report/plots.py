"""Plots drawn from a Value's evidence, keyed by the evidence's ``"plot"`` field.

Each phase registers the plot its evidence asks for with :func:`register_plot`; the shapes
of the evidence are documented in docs/evidence.md. Drawing needs matplotlib (the ``report``
and ``hf`` extras); without it the report shows the evidence as tables and says so once.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any


def sig(x: float) -> str:
    """``x`` at 3 significant digits.

    Examples:
        >>> sig(0.000457123), sig(33140.0)
        ('0.000457', '3.31e+04')
    """
    return f"{x:.3g}"


PlotFn = Callable[[dict[str, Any], Any], None]
_PLOTS: dict[str, PlotFn] = {}
_PANELS: dict[str, tuple[int, ...]] = {}


def register_plot(name: str, panels: tuple[int, ...] = (1,)) -> Callable[[PlotFn], PlotFn]:
    """Register ``fn(evidence, ax)`` as the drawing for evidence with ``{"plot": name}``; the
    decorator returns ``fn`` unchanged. ``fn`` draws on the matplotlib axes ``ax``; the value
    the evidence decided is in ``evidence["_chosen"]``. ``panels``: the heights of panels
    stacked over one shared x axis; with more than one, ``ax`` is the list of them, top first.

    Examples:
        >>> @register_plot("demo")
        ... def _demo(ev, ax):
        ...     ax.plot(ev["x"], ev["y"])
        >>> "demo" in plot_names()
        True
        >>> del _PLOTS["demo"]  # leave the registry as it was
    """

    def deco(fn: PlotFn) -> PlotFn:
        _PLOTS[name] = fn
        _PANELS[name] = tuple(panels)
        return fn

    return deco


def plot_names() -> list[str]:
    """The registered plot names, sorted: the ``"plot"`` values the report can draw.

    Examples:
        >>> plot_names()  # doctest: +NORMALIZE_WHITESPACE
        ['checks', 'curve', 'ending', 'first_step', 'lookahead', 'noise_probe', 'opening', 'past_format',
         'ramp', 'schedule']
    """
    return sorted(_PLOTS)


def matplotlib_available() -> bool:
    """True when matplotlib imports (the ``report`` and ``hf`` extras install it).

    Examples:
        >>> import importlib.util
        >>> matplotlib_available() == (importlib.util.find_spec("matplotlib") is not None)
        True
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def render_svg(evidence: object, chosen: object = None) -> str | None:
    """The SVG drawing for ``evidence`` (inline-ready, no XML header), or None if it has none.
    ``chosen``: the value the evidence decided, marked on the drawing where it has a place.
    None too where matplotlib is missing.

    Examples:
        >>> render_svg({"plot": "no_such_plot"}) is None, render_svg([1.0, 2.0]) is None
        (True, True)
    """
    if not isinstance(evidence, dict) or evidence.get("plot") not in _PLOTS or not matplotlib_available():
        return None
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    panels = _PANELS.get(evidence["plot"], (1,))
    if len(panels) == 1:
        fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=96)
        axes = [ax]
    else:
        fig, axes = plt.subplots(len(panels), 1, sharex=True, dpi=96, gridspec_kw={"height_ratios": panels},
                                 figsize=(6.4, 3.2 * sum(panels) / max(panels)))
        axes = list(axes)
    try:
        _PLOTS[evidence["plot"]]({**evidence, "_chosen": chosen}, axes[0] if len(axes) == 1 else axes)
        for ax in axes:
            ax.grid(True, alpha=0.3)
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    finally:
        plt.close(fig)
    svg = buf.getvalue()
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def _rate_axis(ax: Any, rates: list[float]) -> None:
    """A log axis of rates ticked at the rates tried (at most 7 labels), no minor labels."""
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    ax.set_xscale("log")
    rates = sorted({r for r in rates if r and r > 0})
    if rates:
        step = max(1, -(-len(rates) // 7))
        ax.xaxis.set_major_locator(FixedLocator(rates[::step]))
        ax.set_xticklabels([f"{r:.3g}" for r in rates[::step]], fontsize=8)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())


# ---- the plots the phases' evidence asks for ------------------------------------------
@register_plot("ramp")
def _ramp(ev: dict[str, Any], ax: Any) -> None:
    """On a GPU: peak memory per rung against the room, squeezed and failed rungs marked. On the
    CPU (``rule == "throughput"``): rows per second per rung, where the ramp stops when doubling
    stops paying; the chosen rows marked."""
    rungs = ev.get("rungs", [])
    chosen = ev.get("_chosen")
    if ev.get("rule") == "throughput" and any(r.get("rows_per_second") for r in rungs):
        pts = [(r["rows"], r["rows_per_second"]) for r in rungs if r.get("rows_per_second")]
        ax.scatter([x for x, _ in pts], [y for _, y in pts], color="tab:blue", zorder=3, label="a timed rung")
        if isinstance(chosen, (int, float)):
            ax.axvline(chosen, color="tab:green", linestyle="--", label=f"chosen: {chosen:g} rows")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({x for x, _ in pts}), [f"{x:g}" for x in sorted({x for x, _ in pts})])
        ax.set_xlabel("rows per micro-batch")
        ax.set_ylabel("rows per second")
        ax.set_ylim(bottom=0)
        ax.set_title("CPU ramp: throughput per micro-batch size")
        ax.legend(fontsize=8, loc="lower right")
        return
    colors = {"fits": "tab:green", "squeezed": "tab:orange", "oom": "tab:red"}
    for r in rungs:
        peak = r.get("peak_bytes")
        y = (peak or ev.get("budget_bytes") or 0) / 2**30
        ax.scatter([r.get("rows")], [y], color=colors.get(r.get("verdict"), "tab:gray"),
                   marker="o" if peak is not None else "x", zorder=3)
    budget = (ev.get("budget_bytes") or 0) / 2**30
    top = max([(r.get("peak_bytes") or 0) / 2**30 for r in rungs] or [0])
    title = "memory ramp: green fits, orange squeezed in, red OOM"
    if budget and (not top or budget <= 2 * top):
        ax.axhline(budget, color="black", linestyle="--", label=f"room {budget:.3g} GiB")
        ax.legend(fontsize=8, loc="lower right")
    elif budget:  # far above the rungs: a line there would flatten them
        title += f"\n(the room, {budget:.3g} GiB, is far above the plot)"
    if isinstance(chosen, (int, float)):
        ax.axvline(chosen, color="tab:green", linestyle=":", alpha=0.7)
    ax.set_xlabel("rows per micro-batch")
    ax.set_ylabel("peak GiB")
    ax.set_title(title, fontsize=10)


@register_plot("noise_probe")
def _noise(ev: dict[str, Any], ax: Any) -> None:
    """B_noise estimate after each draw with its one-SE band."""
    draws = [d for d in ev.get("draws", []) if d.get("estimate") is not None]
    xs = [d.get("tokens", d.get("k")) for d in draws]
    ys = [d["estimate"] for d in draws]
    lo = [d["estimate"] - (d.get("se") or 0) for d in draws]
    hi = [d["estimate"] + (d.get("se") or 0) for d in draws]
    ax.plot(xs, ys, marker="o", label="B_noise")
    ax.fill_between(xs, lo, hi, alpha=0.25, label="±1 SE")
    title = "noise-scale probe: B_noise after each draw"
    if xs and max(xs) > 3 * max(hi):  # the diagonal would flatten the estimate: say it instead
        ax.set_ylim(0, 1.5 * max(hi))
        title += f"\n(the tokens drawn, {sig(min(xs))} to {sig(max(xs))}, are above the plot)"
    elif xs:
        ax.plot(xs, xs, linestyle=":", color="gray", label="tokens the probe reached")
    ax.set_xlabel("scored tokens drawn")
    ax.set_ylabel("B_noise (scored tokens)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right")


@register_plot("first_step")
def _first_step(ev: dict[str, Any], ax: Any) -> None:
    """Held-out loss along Adam's first update, per step size."""
    walk = sorted(ev.get("walk", []), key=lambda w: w["lr"])
    ax.plot([w["lr"] for w in walk], [w["loss"] for w in walk], marker="o")
    if ev.get("base_loss") is not None:
        ax.axhline(ev["base_loss"], color="gray", linestyle="--", label="before the step")
    if ev.get("alpha1") is not None:
        ax.axvline(ev["alpha1"], color="tab:green", label="alpha1")
    ax.set_xscale("log")
    ax.set_xlabel("step size along Adam's first update")
    ax.set_ylabel("held-out loss")
    ax.set_title("first safe step")
    ax.legend(fontsize=8)


@register_plot("lookahead")
def _lookahead(ev: dict[str, Any], ax: Any) -> None:
    """Held-out loss per rate, one line per horizon."""
    for h in ev.get("horizons", []):
        cands = sorted(h.get("candidates", []), key=lambda c: c["lr"])
        ax.errorbar([c["lr"] for c in cands], [c["loss"] for c in cands],
                    yerr=[c.get("se") or 0 for c in cands], marker="o", capsize=2,
                    label=f"{h.get('steps')} steps")
    if ev.get("chosen_lr") is not None:
        ax.axvline(ev["chosen_lr"], color="black", linestyle="--", label="chosen")
    _rate_axis(ax, [c["lr"] for h in ev.get("horizons", []) for c in h.get("candidates", [])])
    ax.set_xlabel("learning rate")
    ax.set_ylabel("held-out loss")
    ax.set_title("look-ahead: loss per rate per horizon")
    ax.legend(fontsize=8)


@register_plot("schedule")
def _schedule(ev: dict[str, Any], ax: Any) -> None:
    """The schedule's checks (held-out loss per step) with rollbacks marked."""
    checks = ev.get("checks", [])
    ax.plot([c["step"] for c in checks], [c["loss"] for c in checks], marker="o", label="check")
    for c in checks:
        if c.get("action") == "rollback":
            ax.axvline(c["step"], color="tab:red", alpha=0.5)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out loss")
    ax.set_title("schedule: checks (red: rolled back, rate halved)")


@register_plot("past_format")
def _past_format(ev: dict[str, Any], ax: Any) -> None:
    """The burn-in's mean training loss per round, and the noise at step 0 against after it."""
    rounds = [r for r in ev.get("rounds", []) if r.get("mean_loss") is not None]
    xs = [r["steps"] for r in rounds]
    ax.errorbar(xs, [r["mean_loss"] for r in rounds], yerr=[r.get("se_loss") or 0 for r in rounds],
                marker="o", color="tab:blue", label="training loss a round (±1 SE)")
    ax.set_xlabel("burn-in steps")
    ax.set_ylabel("training loss", color="tab:blue")
    nx = ax.twinx()
    nx.errorbar([0], [ev.get("step0_tokens")], yerr=[ev.get("step0_se") or 0], marker="s", color="tab:red",
                label="B_noise")
    for r in ev.get("readings", []):
        if r.get("b_noise_tokens") is not None:
            nx.errorbar([r["steps"]], [r["b_noise_tokens"]], yerr=[r.get("se_tokens") or 0], marker="s",
                        color="tab:red")
    nx.set_ylabel("B_noise (scored tokens)", color="tab:red")
    ax.set_title("past the format: the burn-in's loss (blue), the noise before and after (red)", fontsize=10)


@register_plot("ending")
def _ending(ev: dict[str, Any], ax: Any) -> None:
    """The run's last steps rerun from copies: held-out loss with the rate held against falling
    to zero over each length raced, each ±1 SE; the kept ending in green."""
    decays = ev.get("decays") if isinstance(ev.get("decays"), list) else None
    bars: list[tuple[str, dict[str, Any], bool]] = []
    if isinstance(ev.get("constant"), dict):
        bars.append(("constant", ev["constant"], ev.get("kept") == "constant"))
    if decays:
        for d in sorted(decays, key=lambda d: -d.get("steps", 0)):
            kept = ev.get("kept") == "decay" and d.get("from_step") == ev.get("from_step")
            bars.append((f"decay over {d.get('steps')}", d, kept))
    elif isinstance(ev.get("decay"), dict):
        bars.append(("decay", ev["decay"], ev.get("kept") == "decay"))
    bars = [b for b in bars if b[1].get("loss") is not None]
    ax.bar([b[0] for b in bars], [b[1]["loss"] for b in bars], yerr=[b[1].get("se") or 0 for b in bars],
           color=["tab:green" if b[2] else "tab:gray" for b in bars], capsize=4, width=0.5)
    ax.set_ylabel("held-out loss")
    a, b = ev.get("from_step"), ev.get("to_step")
    if decays and len(decays) > 1:
        ax.set_title(f"ending: the last {' and '.join(str(d.get('steps')) for d in decays)} steps rerun, to step {b}")
        return
    ax.set_title(f"ending: steps {a} to {b} rerun both ways" if a is not None else "ending: the last steps rerun")


@register_plot("opening")
def _opening(ev: dict[str, Any], ax: Any) -> None:
    """The opening race: each rate's held-out loss after the race's steps (a red cross where its
    answers collapsed to one), the start's reading before any step as a dashed line, the rates
    the rule did not run on the axis, the kept rate green."""
    readings = {float(k): r for k, r in (ev.get("readings") or {}).items() if isinstance(r, dict)}
    ran = sorted((lr, r["mean"]) for lr, r in readings.items() if _finite(r.get("mean")))
    kept = ev.get("_chosen")
    ax.plot([x for x, _ in ran], [y for _, y in ran], color="tab:gray", linestyle=":", zorder=1)
    top = max((lr for lr, _ in ran), default=None)
    for lr, r in readings.items():
        if not _finite(r.get("mean")):
            continue
        colour = "tab:red" if r.get("collapsed") else "tab:green" if _same(lr, kept) else "tab:blue"
        ax.plot([lr], [r["mean"]], marker="x" if r.get("collapsed") else "o", markersize=10 if _same(lr, kept) else 7,
                color=colour, linestyle="", zorder=3)
        label = f"{lr:.3g}: {r['mean']:.4g}" + (" kept" if _same(lr, kept) else "") + \
            (" (answers collapsed)" if r.get("collapsed") else "")
        right = lr == top and len(ran) > 1  # the highest rate's label on its left, inside the plot
        ax.annotate(label, (lr, r["mean"]), textcoords="offset points", xytext=(-8 if right else 8, 4),
                    ha="right" if right else "left", va="bottom", fontsize=8, color=colour)
    start = ev.get("start")
    start = start.get("mean") if isinstance(start, dict) else start
    if _finite(start):
        ax.axhline(start, color="black", linestyle="--", alpha=0.6, label=f"before any step: {start:.4g}")
    not_run = [float(r) for r in ev.get("rates", []) if not any(_same(float(r), lr) for lr in readings)]
    for k, r in enumerate(not_run):
        ax.axvline(r, color="tab:gray", linestyle=":", label="not run: " + ", ".join(f"{x:.3g}" for x in not_run)
                   if k == 0 else None)
    ax.margins(x=0.12, y=0.12)
    _rate_axis(ax, [float(r) for r in ev.get("rates", [])] + list(readings))
    ax.set_xlabel("learning rate")
    ax.set_ylabel("held-out loss")
    h = ev.get("horizon_steps")
    ax.set_title(f"the opening race: held-out loss after {h} step{'s' if h != 1 else ''} per rate" if h is not None
                 else "the opening race: held-out loss per rate", fontsize=10)
    if start is not None or not_run:
        ax.legend(fontsize=8)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _same(a: Any, b: Any) -> bool:
    """Two rates equal to the 3 significant digits the evidence keys them by."""
    return _finite(a) and _finite(b) and f"{float(a):.3g}" == f"{float(b):.3g}"


_CHECK_COLOURS = {"rollback": "tab:red", "spike": "tab:orange", "stop": "tab:purple", "start": "black"}


@register_plot("checks", panels=(3, 1))
def _checks(ev: dict[str, Any], axes: Any) -> None:
    """The guard's checks: the held-out loss at each check with its ±1 SE bar, rollbacks red
    with an arrow back to the step they returned to, the kept check green; the run's training
    loss faint behind them where the run's curve came with the plan; the rate below."""
    top, low = axes
    checks = [c for c in ev.get("checks", []) if _finite(c.get("loss")) and c.get("step") is not None]
    curve = [r for r in ev.get("_curve") or [] if _finite(r.get("loss"))]
    if curve:
        step = max(1, len(curve) // 1500)  # a line of at most ~1500 points: the page stays light
        top.plot([r["step"] for r in curve[::step]], [r["loss"] for r in curve[::step]], color="tab:gray",
                 alpha=0.35, linewidth=0.8, label="training loss (a step's rows)")
    top.errorbar([c["step"] for c in checks], [c["loss"] for c in checks], yerr=[c.get("se") or 0 for c in checks],
                 marker="o", color="tab:blue", capsize=3, label="held-out loss at a check (±1 SE)", zorder=3)
    by_step = {c["step"]: c["loss"] for c in checks}
    for c in checks:
        colour = _CHECK_COLOURS.get(str(c.get("action")))
        if colour is None:
            continue
        top.plot([c["step"]], [c["loss"]], marker="o", markersize=8, color=colour, linestyle="", zorder=4)
        if c.get("action") == "rollback" and c.get("to_step") is not None:
            back = (c["to_step"], by_step.get(c["to_step"], c["loss"]))
            top.annotate("", xy=back, xytext=(c["step"], c["loss"]),
                         arrowprops={"arrowstyle": "->", "color": "tab:red", "alpha": 0.9, "linewidth": 1.5,
                                     "connectionstyle": "arc3,rad=0.35"})
    kept = [c for c in checks if c["step"] == ev.get("kept_step")]
    if kept:
        top.plot([kept[-1]["step"]], [kept[-1]["loss"]], marker="*", markersize=16, color="tab:green", linestyle="",
                 zorder=5, label=f"kept: step {kept[-1]['step']}")
    if any(c.get("action") == "rollback" for c in checks):
        top.plot([], [], color="tab:red", marker="o", linestyle="-", label="rolled back (arrow: to the step)")
    top.set_ylabel("held-out loss")
    top.set_title(_checks_title(ev), fontsize=10)
    top.legend(fontsize=7, loc="upper right")
    rated = [c for c in checks if _finite(c.get("lr"))]
    low.step([c["step"] for c in rated], [c["lr"] for c in rated], where="post", color="tab:purple", marker=".")
    low.set_ylabel("rate", fontsize=8)
    _rate_ticks(low, [c["lr"] for c in rated])
    low.set_xlabel("step")


def _rate_ticks(ax: Any, rates: list[float]) -> None:
    """A log y axis of rates ticked at (at most 4 of) the rates taken, no minor labels."""
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    rates = sorted({r for r in rates if r > 0})
    if not rates:
        return
    ax.set_yscale("log")
    step = max(1, -(-len(rates) // 4))
    ax.yaxis.set_major_locator(FixedLocator(rates[::step]))
    ax.set_yticklabels([f"{r:.3g}" for r in rates[::step]], fontsize=7)
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.margins(y=0.25)


def _checks_title(ev: dict[str, Any]) -> str:
    """The guard's outcome with the held-out loss before and after it, as the title says it."""
    outcome = {"improved": "improved", "no_better_than_start": "no better than the start",
               "collapsed": "collapsed"}.get(str(ev.get("outcome")), str(ev.get("outcome") or ""))
    before, after = ev.get("held_out_before") or {}, ev.get("held_out_after") or {}
    title = f"the guard's checks: {outcome}" if outcome else "the guard's checks"
    if _finite(before.get("mean")) and _finite(after.get("mean")):
        title += (f"\nheld-out {before['mean']:.4g} ± {before.get('se') or 0:.2g} before, "
                  f"{after['mean']:.4g} ± {after.get('se') or 0:.2g} after")
    return title


@register_plot("curve")
def _curve(ev: dict[str, Any], ax: Any) -> None:
    """The run's training loss per step (each step's own rows, so noisy), its rate on a second axis."""
    curve = [r for r in ev.get("curve") or [] if _finite(r.get("loss"))]
    step = max(1, len(curve) // 1500)
    ax.plot([r["step"] for r in curve[::step]], [r["loss"] for r in curve[::step]], color="tab:blue", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss", color="tab:blue")
    rated = [r for r in curve[::step] if _finite(r.get("lr"))]
    if rated:
        rx = ax.twinx()
        rx.plot([r["step"] for r in rated], [r["lr"] for r in rated], color="tab:purple", linewidth=1, alpha=0.7)
        rx.set_ylabel("rate", color="tab:purple")
    ax.set_title("the run: training loss per step (blue), the rate (purple)", fontsize=10)
