"""The report's answers section: for a classifier's rows, the accuracy and each answer's share of
the choices before and after the run, beside the loss, read from the run's record (``run.json``'s
``answers``, :mod:`leadline.run.answers`)."""

from __future__ import annotations

import html
from typing import Any


def answers_html(run: dict[str, Any] | None) -> str:
    """The section, or ``""`` where the run has no answers (free text, or no run record).

    Examples:
        >>> run = {"held_out_before": {"mean": 5.94}, "held_out_after": {"mean": 5.67},
        ...        "answers": {"answers": ["games", "net"], "reads": 2, "seconds": 0.3, "held_out": {
        ...            "rows": 10, "own": {"games": 0.6, "net": 0.4},
        ...            "before": {"accuracy": 0.6, "chosen": {"games": 1.0, "net": 0.0}},
        ...            "after": {"accuracy": 0.9, "chosen": {"games": 0.5, "net": 0.5}}}}}
        >>> page = answers_html(run)
        >>> print(page[page.index("<p>"):page.index("</p><div")] + "</p>")
        <p>Held-out rows: accuracy <b>60%</b> before, <b>90%</b> after on 10 rows (loss 5.94 before, 5.67 after).</p>
        >>> page.count("<tr>"), answers_html({"answers": None}), answers_html(None)
        (3, '', '')
    """
    answers = (run or {}).get("answers")
    if not isinstance(answers, dict):
        return ""
    parts = []
    for part, label, loss in (("held_out", "Held-out rows", "held_out"), ("test", answers.get("test_source"), "test")):
        check = answers.get(part)
        if isinstance(check, dict) and check.get("before") and check.get("after"):
            parts.append(_check(str(label or "test rows").capitalize(), check, _losses(run or {}, loss)))
    if not parts:
        return ""
    cost = f"{answers.get('reads', 0)} reads, {answers.get('seconds', 0):.3g} s"
    return ("<h2>Answers</h2><p class='meta'>Each row's choice is the answer with the highest summed "
            "log-probability after its prompt; accuracy is the share of rows whose choice is their own completion "
            f"({cost}).</p>" + "".join(parts))


def _check(label: str, check: dict[str, Any], loss: str) -> str:
    b, a, own = check["before"], check["after"], check.get("own") or {}
    names = sorted(a.get("chosen") or {}, key=lambda n: -own.get(n, 0.0))
    rows = "".join(f"<tr><td>{html.escape(n)}</td><td>{_pct(own.get(n, 0.0))}</td>"
                   f"<td>{_pct(b['chosen'].get(n, 0.0))}</td><td>{_pct(a['chosen'].get(n, 0.0))}</td></tr>"
                   for n in names)
    return (f"<p>{html.escape(label)}: accuracy <b>{_pct(b['accuracy'])}</b> before, <b>{_pct(a['accuracy'])}</b> "
            f"after on {check.get('rows', '?')} rows{loss}.</p>"
            "<div class='wide'><table style='table-layout:auto'><tr><th>answer</th><th>the rows' own</th>"
            f"<th>chosen before</th><th>chosen after</th></tr>{rows}</table></div>")


def _losses(run: dict[str, Any], part: str) -> str:
    b, a = ((run.get("held_out_before"), run.get("held_out_after")) if part == "held_out" else
            (run.get("test_loss_before"), run.get("test_loss_after")))
    if not (isinstance(b, dict) and isinstance(a, dict)):
        return ""
    return f" (loss {b['mean']:.3g} before, {a['mean']:.3g} after)"


def _pct(x: float) -> str:
    return f"{x:.0%}"
