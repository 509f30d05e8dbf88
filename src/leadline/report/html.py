"""Render a plan as one self-contained HTML page: no scripts, no external files."""

from __future__ import annotations

import html
import json
import os
import time
from pathlib import Path
from typing import Any

from leadline.plan import Plan, Value, format_number
from leadline.report.plots import matplotlib_available, render_svg

_STYLE = """
body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;width:100%;margin:.5rem 0}
td,th{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top;font-size:.9rem}
th{background:#f3f3f3}.kind{font-family:monospace}.constant{background:#fff4e0}
section{margin:1.5rem 0;border-top:1px solid #ddd}pre{background:#f8f8f8;padding:.5rem;overflow:auto;font-size:.8rem}
"""


def _esc(x: Any) -> str:
    return html.escape(str(x))


def _table(rows: list[dict[str, Any]]) -> str:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    head = "".join(f"<th>{_esc(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{_esc(format_number(r.get(c)) if not isinstance(r.get(c), (dict, list)) else json.dumps(r.get(c)))}</td>" for c in cols) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _evidence_html(ev: Any) -> str:
    """Tables for the lists of records in the evidence, a JSON block for the rest."""
    if ev is None:
        return "<p>No evidence recorded.</p>"
    parts: list[str] = []
    if isinstance(ev, list) and ev and all(isinstance(r, dict) for r in ev):
        return _table(ev)
    if isinstance(ev, dict):
        scalars = {k: v for k, v in ev.items() if not isinstance(v, (list, dict))}
        if scalars:
            parts.append(_table([scalars]))
        for k, v in ev.items():
            if isinstance(v, list) and v and all(isinstance(r, dict) for r in v):
                parts.append(f"<h4>{_esc(k)}</h4>" + _table(v))
            elif isinstance(v, (list, dict)):
                parts.append(f"<h4>{_esc(k)}</h4><pre>{_esc(json.dumps(v, indent=1))}</pre>")
        return "".join(parts)
    return f"<pre>{_esc(json.dumps(ev, indent=1))}</pre>"


def _value_section(name: str, v: Value, can_plot: bool) -> str:
    svg = render_svg(v.evidence)
    plot = svg or ""
    if svg is None and isinstance(v.evidence, dict) and "plot" in v.evidence and not can_plot:
        plot = "<p><em>No plot: matplotlib is not installed (pip install 'leadline[report]').</em></p>"
    return (
        f"<section id='{_esc(name)}'><h3>{_esc(name)} = {_esc(format_number(v.value))}"
        f"{' ' + _esc(v.unit) if v.unit else ''}</h3>"
        f"<p><span class='kind'>[{_esc(v.kind)}]</span> {_esc(v.source)} "
        f"<small>({v.seconds:.3g} s)</small></p>{plot}{_evidence_html(v.evidence)}</section>"
    )


def render_plan(plan: Plan) -> str:
    """The plan as a self-contained HTML page."""
    can_plot = matplotlib_available()
    rows = "".join(
        f"<tr class='{_esc(v.kind)}'><td><a href='#{_esc(n)}'>{_esc(n)}</a></td>"
        f"<td>{_esc(format_number(v.value))}{' ' + _esc(v.unit) if v.unit else ''}</td>"
        f"<td class='kind'>{_esc(v.kind)}</td><td>{_esc(v.source)}</td></tr>"
        for n, v in plan.values.items()
    )
    consts = plan.constants()
    const_html = (
        "<p>Constants (not measured here): " + ", ".join(_esc(c) for c in consts) + "</p>"
        if consts else "<p>No constants: every number was measured, derived or given.</p>"
    )
    meta = {"machine": plan.machine, "model": plan.model, "data": plan.data}
    meta_html = "".join(f"<h4>{k}</h4>{_table([v]) if v else '<p>not recorded</p>'}" for k, v in meta.items())
    held = {k: (len(v) if isinstance(v, list) else v) for k, v in plan.held_out.items()}
    held_html = f"<h4>held-out rows</h4>{_table([held])}" if held else ""
    notes = "".join(f"<li>{_esc(n)}</li>" for n in plan.notes)
    sections = "".join(_value_section(n, v, can_plot) for n, v in plan.values.items())
    created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(plan.created))
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>leadline plan</title>"
        f"<style>{_STYLE}</style></head><body><h1>leadline plan</h1>"
        f"<p>leadline {_esc(plan.version)}, made {created}.</p>"
        f"<table><tr><th>name</th><th>value</th><th>kind</th><th>source</th></tr>{rows}</table>"
        f"{const_html}{'<ul>' + notes + '</ul>' if notes else ''}"
        f"<h2>Where it was measured</h2>{meta_html}{held_html}<h2>Evidence</h2>{sections}</body></html>\n"
    )


def write_html(plan: Plan, path: str | os.PathLike[str]) -> Path:
    """Write the plan's self-contained HTML report (inline SVG plots) to ``path`` atomically;
    returns the path."""
    from leadline._io import write_atomic

    return write_atomic(path, render_plan(plan))
