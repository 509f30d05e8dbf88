"""Render a plan as one self-contained HTML page a person reads: no scripts, no external files.

The page opens with a summary card (the numbers to train with, each with its kind and one line
of why, the constants, what derive spent), then one figure per decision with a caption, then
every value with its whole sentence; the raw evidence sits collapsed under ``<details>``.
"""

from __future__ import annotations

import html
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from leadline.plan import RUN_PHASES, Plan, Value, readable
from leadline.report.answers import answers_html
from leadline.report.plots import matplotlib_available, plot_names, render_svg

# The numbers a run is trained with, in the order a person reads them.
SUMMARY = ("micro_batch", "grad_accum", "tokens_per_step", "lr", "warmup_steps", "total_steps", "ending",
           "seq_len", "weight_decay")
WHY_CHARS = 110

_STYLE = """
body{font-family:system-ui,sans-serif;max-width:64rem;margin:1.2rem auto;padding:0 1rem;color:#222;line-height:1.35;
overflow-wrap:anywhere}
h1{font-size:1.5rem;margin:.2rem 0}h2{font-size:1.2rem;margin:1.4rem 0 .4rem}h3{font-size:1rem;margin:.8rem 0 .2rem}
table{border-collapse:collapse;width:100%;margin:.4rem 0;table-layout:fixed}
td,th{border:1px solid #ccc;padding:.2rem .45rem;text-align:left;vertical-align:top;font-size:.86rem;
overflow-wrap:anywhere}
th{background:#f3f3f3}.kind{font-family:monospace;font-size:.8rem}
tr.constant td{background:#fff4e0}tr.measured .kind{color:#1a7f37}tr.derived .kind{color:#0550ae}
.card{border:2px solid #444;border-radius:6px;padding:.5rem .8rem;margin:.6rem 0}
.card th:nth-child(1){width:9rem}.card th:nth-child(2){width:10rem}.card th:nth-child(3){width:5.5rem}
.meta{color:#555;font-size:.85rem;margin:.1rem 0}
figure{margin:.6rem 0;border-top:1px solid #ddd;padding-top:.4rem;display:flex;flex-wrap:wrap;gap:.2rem 1rem;
align-items:center}figure svg{flex:0 1 38rem}figcaption{flex:1 1 16rem;font-size:.88rem;margin:.2rem 0}
svg{max-width:100%;height:auto}details{margin:.2rem 0}summary{cursor:pointer;color:#0550ae;font-size:.85rem}
pre{background:#f8f8f8;padding:.4rem;overflow:auto;font-size:.75rem;max-height:24rem}
.wide{overflow-x:auto}
"""


def _esc(x: Any) -> str:
    return html.escape(str(x))


def sig(x: object, digits: int = 3) -> str:
    """A number as a person reads it: ``digits`` significant digits, ints with separators
    (below 10^7), floats outside [1e-3, 1e6) in exponent form, ``—`` for a missing one; text as
    it is.

    Examples:
        >>> sig(12345), sig(12_345_678), sig(3.14159), sig(123456.7), sig(0.000457), sig(None)
        ('12,345', '1.23e+07', '3.14', '123,000', '4.57e-04', '—')
        >>> sig([1, 0.5]), sig("cosine"), sig(0.0)
        ('1, 0.5', 'cosine', '0')
    """
    if x is None:
        return "—"
    if isinstance(x, bool) or isinstance(x, str):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}" if abs(x) < 10**7 else f"{x:.{digits}g}"
    if isinstance(x, float):
        if x != x or x in (float("inf"), float("-inf")):
            return str(x)
        if x == 0:
            return "0"
        if 1e-3 <= abs(x) < 1e6:
            s = f"{x:.{digits}g}"
            return f"{float(s):,.0f}" if "e" in s else s
        return f"{x:.{digits - 1}e}"
    if isinstance(x, (list, tuple)):
        return ", ".join(sig(v, digits) for v in x)
    if isinstance(x, dict):
        return readable(x)
    return str(x)


def value_text(v: Value) -> str:
    """The value with its unit, singular for 1 ("2 rows", "1 row"), ``not resolved`` for None.

    Examples:
        >>> from leadline.plan import Value
        >>> value_text(Value(2, "derived", "the split", unit="rows")), value_text(Value(1, "derived", "s", unit="rows"))
        ('2 rows', '1 row')
        >>> value_text(Value(None, "derived", "no rate phase finished"))
        'not resolved'
        >>> value_text(Value({"dtype": "float32", "quantization": None, "checkpointing": False}, "given", "the model"))
        'float32, no quantization, gradient checkpointing off'
    """
    if v.value is None:
        return "not resolved"
    if isinstance(v.value, dict):
        return readable(v.value)
    text = sig(v.value)
    if v.unit:
        unit = v.unit
        if v.value == 1 and unit.endswith("s") and unit not in ("s", "tokens per step"):
            unit = unit[:-1]
        text += f" {unit}"
    return text


_PLURAL = re.compile(r"\b1 (rows|steps|tokens|micro-batches|draws|rates|rounds|horizons)\b")


def prose(text: str) -> str:
    """A source sentence for display: "1 rows" read as "1 row".

    Examples:
        >>> prose("fits 1 rows in 1 micro-batches over 2 steps")
        'fits 1 row in 1 micro-batch over 2 steps'
    """
    return _PLURAL.sub(lambda m: "1 " + ("micro-batch" if m.group(1) == "micro-batches" else m.group(1)[:-1]), text)


def short_why(text: str, chars: int = WHY_CHARS) -> str:
    """The first clause of a source sentence, cut at a word boundary to ``chars`` characters.

    The clause ends at ``"; "`` or at a colon before a lower-case word (unless that leaves under
    25 characters); a parenthesis left open is cut away; an ellipsis marks a cut.

    Examples:
        >>> short_why("the largest micro-batch that fits: 8 rows peak at 61% of the room (rungs 1, 2, 4, 8, 16 "
        ...           "tried; 16 ran out of memory)")
        'the largest micro-batch that fits: 8 rows peak at 61% of the room…'
        >>> short_why("a known default for fine-tuning; see docs/rate.md")
        'a known default for fine-tuning…'
    """
    text = prose(text)
    first = re.split(r"; |: (?=[a-z])", text, maxsplit=1)[0]
    if len(first) < 25:  # "none: the rate ..." says nothing before its colon
        first = text
    cut = first if len(first) <= chars else first[: chars - 1].rsplit(" ", 1)[0].rstrip(",;:(")
    if cut.count("(") > cut.count(")"):  # no parenthesis left open
        cut = cut[: cut.rindex("(")].rstrip(" ,;:")
    return cut + ("…" if cut != text else "")


def _cell(x: Any) -> str:
    """A table cell: a number at 3 significant digits, a dict or list in words, cut at 200 characters."""
    text = readable(x) if isinstance(x, (dict, list)) else sig(x)
    return _esc(text[:200] + ("…" if len(text) > 200 else ""))


def _table(rows: list[dict[str, Any]]) -> str:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    head = "".join(f"<th>{_esc(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r.get(c))}</td>" for c in cols) + "</tr>" for r in rows)
    layout = " style='table-layout:auto'" if len(cols) <= 4 else ""
    return f"<div class='wide'><table{layout}><tr>{head}</tr>{body}</table></div>"


def _evidence_html(ev: Any) -> str:
    """The evidence collapsed: its records as tables, the JSON under a second fold."""
    if ev is None:
        return ""
    parts: list[str] = []
    if isinstance(ev, list) and ev and all(isinstance(r, dict) for r in ev):
        parts.append(_table(ev))
    elif isinstance(ev, dict):
        scalars = {k: v for k, v in ev.items() if not isinstance(v, (list, dict)) and k != "plot"}
        if scalars:
            parts.append(_table([{"field": k, "value": v} for k, v in scalars.items()]))
        for k, v in ev.items():
            if isinstance(v, list) and v and all(isinstance(r, dict) for r in v):
                parts.append(f"<h4>{_esc(k)}</h4>" + _table(v))
    parts.append(f"<details><summary>JSON</summary><pre>{_esc(json.dumps(ev, indent=1, default=str))}</pre></details>")
    return f"<details><summary>evidence</summary>{''.join(parts)}</details>"


def _digest(ev: Any) -> str | None:
    return None if ev is None else json.dumps(ev, sort_keys=True, default=str)


def _spent(plan: Plan) -> str:
    """What derive spent: its wall time, the training steps it took on the run's rows, and the
    phases that took the most of it; then the run's own steps and seconds, apart from derive's."""
    deciding = [t for t in plan.phases if t.phase not in RUN_PHASES]
    took = [t for t in deciding if t.seconds >= 0.05]
    steps = sum(t.steps for t in deciding)
    run = plan.run_phase()
    if plan.derive_seconds is None and not took and run is None:
        measured = sum(v.seconds for v in plan.values.values())
        return f"the measurements took {sig(measured)} s" if measured else ""
    wall = f"derive took {sig(plan.derive_seconds)} s" if plan.derive_seconds is not None else "derive's phases took"
    if steps:
        wall += f" and {steps:,} training step{'s' if steps != 1 else ''} on the run's rows"
    parts = [f"{t.phase} {sig(t.seconds)} s" + _phase_work(t) for t in sorted(took, key=lambda t: -t.seconds)[:5]]
    text = wall + (": " + ", ".join(parts) if parts else "")
    if run is None:
        return text
    line = plan.run_line(run)
    return f"{text}. {line[0].upper()}{line[1:]}"


def _phase_work(t: Any) -> str:
    """A phase's steps and held-out reads in brackets, where it took more than one step or read."""
    work = [f"{t.steps} steps" if t.steps > 1 else "", f"{t.reads} held-out reads" if t.reads > 1 else ""]
    work = [w for w in work if w]
    return f" ({', '.join(work)})" if work else ""


def _summary_card(plan: Plan) -> str:
    rows = []
    for n in SUMMARY:
        if n not in plan:
            continue
        v = plan[n]
        rows.append(f"<tr class='{_esc(v.kind)}'><td><a "
                    f"href='#{_esc(n)}'>{_esc(n)}</a></td><td>{_esc(value_text(v))}</td>"
                    f"<td class='kind'>{_esc(v.kind)}</td><td>{_esc(short_why(v.source))}</td></tr>")
    consts = plan.constants()
    const = ("constants (not measured here): " + ", ".join(consts) if consts
             else "no constants: every number was measured, derived or given")
    kinds: dict[str, int] = {}
    for v in plan.values.values():
        kinds[v.kind] = kinds.get(v.kind, 0) + 1
    counts = ", ".join(f"{n} {k}" for k, n in kinds.items())
    spent = _spent(plan)
    return ("<div class='card'><h2 style='margin-top:0'>Train with</h2>"
            "<table><tr><th>value</th><th>number</th><th>kind</th><th>why</th></tr>" + "".join(rows) + "</table>"
            f"<p class='meta'>{len(plan.values)} values ({_esc(counts)}); {_esc(const)}.</p>"
            + (f"<p class='meta'>{_esc(spent)}.</p>" if spent else "") + "</div>")


# What each figure shows, in one line; the caption adds what was chosen.
SHOWS = {
    "ramp": "The micro-batch sizes tried: peak memory against the room on a GPU, rows per second on the CPU",
    "noise_probe": "The gradient noise scale B_noise after each draw, with its ±1 SE band",
    "first_step": "The held-out loss along Adam's first update, per step size: the largest safe step is alpha1",
    "past_format": "The burn-in past the rows' format, and the noise scale read again after it",
    "lookahead": "The held-out loss per rate after each horizon of training steps",
    "schedule": "The schedule's held-out checks during the run; red lines are rollbacks",
    "ending": "The run's last steps rerun from copies: the rate held against falling to zero over each length raced",
    "opening": "The opening race: each rate's held-out loss after the same opening steps (and before any, where read)",
    "checks": "The guard's held-out checks during the run, each ±1 SE, and the rate below; red: rolled back",
    "curve": "The run's training loss at each step, on that step's own rows",
}


def _drawn(name: str, ev: Any) -> dict[str, Any] | None:
    """The evidence as a drawing asks for it: its own ``plot``, the opening race's readings (where a
    challenger ran), or the ending's rerun."""
    if isinstance(ev, dict) and "plot" in ev:
        return ev if ev["plot"] in plot_names() else None
    if name == "lr" and isinstance(ev, dict) and isinstance(ev.get("readings"), dict) and "rates" in ev:
        return {**ev, "plot": "opening"} if len(ev["readings"]) > 1 else None  # a race the default ran alone: a point
    if name == "ending" and isinstance(ev, dict) and isinstance(ev.get("constant"), dict) \
            and isinstance(ev.get("decay"), dict):
        return {**ev, "plot": "ending"}
    return None


def _figures(plan: Plan, can_plot: bool, run: dict[str, Any] | None = None) -> str:
    """One figure per decision the plan records, each with a caption; the run's training curve
    (``run["curve"]``) drawn behind the guard's checks, or on its own where no guard checked."""
    figs: list[str] = []
    drawn: set[str] = set()
    curve = run.get("curve") if isinstance(run, dict) and isinstance(run.get("curve"), list) else None
    for n, v in plan.values.items():
        ev = _drawn(n, v.evidence)
        if ev is None:
            continue
        key = _digest(ev)
        if key in drawn:
            continue
        drawn.add(key or n)
        if ev.get("plot") == "checks" and curve:
            ev = {**ev, "_curve": curve}
        figs.append(_figure(ev, n, v, can_plot))
    if curve and not any(v.evidence.get("plot") == "checks" for v in plan.values.values()
                         if isinstance(v.evidence, dict)):
        svg = render_svg({"plot": "curve", "curve": curve}) if can_plot else None
        figs.append(f"<figure class='run'>{svg or ''}<figcaption>{_esc(SHOWS['curve'])}: {len(curve):,} steps."
                    "</figcaption></figure>")
    if not figs:
        return ""
    note = ("" if can_plot else "<p class='meta'>The figures need matplotlib (pip install 'leadline[hf]'); the "
                                "evidence is below as tables.</p>")
    return "<h2>Decisions</h2>" + note + ("".join(figs) if can_plot else "")


def _figure(ev: dict[str, Any], name: str, v: Value, can_plot: bool) -> str:
    """One decision's figure: its drawing and a caption saying what it shows and what was chosen."""
    svg = render_svg(ev, chosen=v.value) if can_plot else None
    shows = SHOWS.get(str(ev.get("plot")), "")
    caption = (f"{_esc(shows)}. " if shows else "") + \
        f"Chosen: <b>{_esc(name)} = {_esc(value_text(v))}</b> ({_esc(v.kind)}), {_esc(short_why(v.source, 140))}"
    return f"<figure id='figure-{_esc(name)}'>{svg or ''}<figcaption>{caption}</figcaption></figure>"


def _values(plan: Plan) -> str:
    shown: dict[str, str] = {}
    out = []
    for n, v in plan.values.items():
        key = _digest(v.evidence)
        if key is not None and key in shown:
            ev = f"<p class='meta'>evidence: the same as <a href='#{_esc(shown[key])}'>{_esc(shown[key])}</a></p>"
        else:
            ev = _evidence_html(v.evidence)
            if key is not None:
                shown[key] = n
        cost = _cost(plan, n)
        out.append(f"<section id='{_esc(n)}'><h3>{_esc(n)} = {_esc(value_text(v))} "
                   f"<span class='kind'>[{_esc(v.kind)}]</span></h3><p>{_esc(prose(v.source))}{cost}</p>{ev}</section>")
    return "<h2>Every value</h2>" + "".join(out)


def _cost(plan: Plan, name: str) -> str:
    """What deciding a value cost, after its sentence: its own seconds, or the phase that decided
    it with that phase's seconds, steps and reads (:meth:`Plan.cost`); nothing where none was spent."""
    text = plan.cost(name)
    return "" if text.startswith("cost: none") else f" <small>({_esc(text)})</small>"


def _where(plan: Plan) -> str:
    parts = []
    for k, d in (("machine", plan.machine), ("model", plan.model), ("data", plan.data)):
        if d:
            parts.append(f"<h3>{k}</h3>" + _table([{"field": f, "value": x} for f, x in d.items()]))
    held = {k: (f"{len(v)} rows" if isinstance(v, list) else v) for k, v in plan.held_out.items()}
    if held:
        parts.append("<h3>rows split off</h3>" + _table([{"part": k, "rows": v} for k, v in held.items()]))
    return "<details><summary>where it was measured (machine, model, data)</summary>" + "".join(parts) + "</details>"


def render_plan(plan: Plan, run: dict[str, Any] | None = None) -> str:
    """The plan as a self-contained HTML page: no scripts, no external files (plots inline SVG).
    ``run``: the run's record (``run.json``), whose ``curve`` the report draws where it has one,
    and whose ``answers`` (a classifier's accuracy before and after) it tabulates.

    Examples:
        >>> from leadline.plan import Plan, Value, readable
        >>> plan = Plan(created=0.0)
        >>> plan.set("micro_batch", Value(8, "measured", "the largest micro-batch that fits: 8 rows peak at 61% of "
        ...                               "the room", unit="rows"))
        >>> plan.set("weight_decay", Value(0.0, "constant", "the usual default for fine-tuning"))
        >>> page = render_plan(plan)
        >>> page.startswith("<!DOCTYPE html>"), "<script" in page, page.count("<section")
        (True, False, 2)
        >>> import re
        >>> for line in re.findall(r"<p class='meta'>[^<]*</p>", page):
        ...     print(line)
        <p class='meta'>leadline ..., 1970-01-01 00:00 UTC</p>
        <p class='meta'>2 values (1 measured, 1 constant); constants (not measured here): weight_decay.</p>
    """
    can_plot = matplotlib_available()
    created = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(plan.created))
    device = plan.machine.get("device") or plan.machine.get("device_name") or ""
    notes = "".join(f"<li>{_esc(prose(n))}</li>" for n in plan.notes)
    notes_html = f"<h2>Notes</h2><ul>{notes}</ul>" if notes else ""
    about = "".join(f"<p class='meta about'><b>{k}</b> {_esc(x)}</p>" for k, x in
                    (("model", _model_line(plan.model)), ("data", _data_line(plan.data)), ("machine", device)) if x)
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><meta name='viewport' content='width=device-width'>"
        f"<title>leadline plan</title><style>{_STYLE}</style></head><body><h1>leadline plan</h1>{about}"
        f"<p class='meta'>leadline {_esc(plan.version)}, {created}</p>"
        f"{_summary_card(plan)}{notes_html}{_figures(plan, can_plot, run)}{answers_html(run)}{_values(plan)}"
        f"{_where(plan)}</body></html>\n"
    )


def _shown_path(path: str) -> str:
    """A local path by its last part (the machine's folders are nobody's business), a hub name whole."""
    if path.startswith("/") or path.startswith("\\") or re.match(r"^[A-Za-z]:[\\/]", path):
        return Path(path).name
    return path


def _model_line(model: dict[str, Any]) -> str:
    """The model in one line: its name, how it trains and its trained parameters, where known.

    Examples:
        >>> _model_line({"name": "/models/SmolLM2-135M", "trained_as": "factors", "trained_parameters": 4884480})
        'SmolLM2-135M, a LoRA adapter of 4,884,480 trained parameters'
        >>> _model_line({"trained_as": "weights", "trained_parameters": 1200})
        'name not recorded, every weight trained (1,200 parameters)'
        >>> _model_line({})
        ''
    """
    if not model:
        return ""
    name = _shown_path(str(model.get("name") or "")) or "name not recorded"
    n = model.get("trained_parameters")
    count = f"{n:,}" if isinstance(n, int) else None
    how = {"factors": "a LoRA adapter" + (f" of {count} trained parameters" if count else ""),
           "weights": "every weight trained" + (f" ({count} parameters)" if count else "")}.get(
        str(model.get("trained_as")), f"{count} trained parameters" if count else "")
    return f"{name}, {how}" if how else name


def _data_line(data: dict[str, Any]) -> str:
    """The data in one line: its file (or rows in memory), its rows where counted, its hash's head.

    Examples:
        >>> _data_line({"path": "demo-out/train.jsonl", "rows": None, "sha256": "e2574b800b4dcedea259"})
        'demo-out/train.jsonl (sha256 e2574b800b4d)'
        >>> _data_line({"path": None, "rows": 32, "sha256": "408c2de512d3aa"})
        'rows given in memory, 32 rows (sha256 408c2de512d3)'
    """
    if not data:
        return ""
    path = data.get("path")
    text = _shown_path(str(path)) if path else "rows given in memory"
    if isinstance(data.get("rows"), int):
        text += f", {data['rows']:,} rows"
    if data.get("fields"):
        text += f", fields {readable(data['fields'])}"
    return text + (f" (sha256 {str(data['sha256'])[:12]})" if data.get("sha256") else "")


def write_html(plan: Plan, path: str | os.PathLike[str], run: dict[str, Any] | None = None) -> Path:
    """Write the plan's self-contained HTML report (inline SVG plots) to ``path`` atomically;
    returns the path. ``run``: the run's record (``run.json``), for its training curve.

    Examples:
        >>> import tempfile
        >>> from leadline.plan import Plan
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     path = write_html(Plan(), Path(folder) / "plan.html")
        ...     print(path.name, path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>"))
        plan.html True
    """
    from leadline._io import write_atomic

    return write_atomic(path, render_plan(plan, run))
