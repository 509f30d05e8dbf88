"""The HTML report a person reads: a summary card first, one figure per decision, evidence
collapsed and not repeated, numbers at 3 significant digits, nothing wider than the page."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from leadline.plan import Plan, Value
from leadline.report import html as report


def _plan() -> Plan:
    step = {"plot": "none", "b_noise_tokens": 40.404573869435545, "rows": [{"rows": 1, "seconds": 0.8912}, {"rows": 2, "seconds": 1.387}]}
    ramp = {"plot": "ramp", "budget_bytes": 24.5 * 2**30,
            "rungs": [{"rows": r, "peak_bytes": 0.5e9 + r * 0.1e9, "verdict": "fits"} for r in (1, 2, 4)]}
    look = {"plot": "lookahead", "chosen_lr": 0.0018, "horizons": [
        {"steps": s, "candidates": [{"lr": lr, "loss": 1.0 / (s * lr), "se": 0.01} for lr in (0.0009, 0.0018, 0.0036)]} for s in (8, 16)]}
    p = Plan(machine={"device": "cpu"}, model={"name": "tiny"}, held_out={"train": list(range(30)), "held_out": [30, 31], "seed": 0})
    p.set("rows_fit", Value(4, "measured", "measured on the cpu: 4 rows at 155 tokens", evidence=ramp, seconds=3.2, unit="rows"))
    p.set("noise_scale_tokens", Value(None, "measured", "the noise scale did not resolve over 1 micro-batches", unit="scored tokens"))
    p.set("tokens_per_step", Value(3.6875, "derived", "the whole rows minimizing the time to a loss", evidence=step, unit="scored tokens"))
    p.set("micro_batch", Value(1, "derived", "the 1 rows that fit, a micro-batch of them 1 time a step", evidence=step, unit="rows"))
    p.set("grad_accum", Value(1, "derived", "ceil(1 rows a step / 1 that fit)", evidence=step))
    p.set("lr", Value(0.0018267, "measured", "won a race of 3 rates inside the run", evidence=look, seconds=12.0, unit="per step"))
    p.set("warmup_steps", Value(10, "derived", "round(1/(1 - beta1))", unit="steps"))
    p.set("weight_decay", Value(0.0, "constant", "0 by argument, not measured here"))
    p.set("t_micro_seconds", Value(1.5397856137065757, "measured", "median of 3 passes", unit="s"))
    return p


def test_the_card_holds_the_training_numbers_with_their_kinds_and_why():
    page = report.render_plan(_plan())
    card = page[page.index("class='card'"):page.index("</div>", page.index("class='card'"))]
    for name in ("micro_batch", "grad_accum", "tokens_per_step", "lr", "warmup_steps", "weight_decay"):
        assert f">{name}<" in card
    assert "1 row<" in card and "1 rows" not in page  # plurals read right, in the sentences too
    assert "3.69 scored tokens" in card and "0.00183 per step" in card
    assert "constants (not measured here): weight_decay" in card
    assert page.index("class='card'") < page.index("<h2>Decisions")


def test_numbers_are_formatted_and_nothing_prints_none():
    page = report.render_plan(_plan())
    assert "1.5397856137065757" not in page.split("<details>")[0] and "1.54 s" in page
    assert "None" not in re.sub(r"<pre>.*?</pre>", "", page, flags=re.S)
    assert "not resolved" in page


def test_evidence_shared_by_values_is_shown_once_and_raw_json_is_folded():
    page = report.render_plan(_plan())
    assert page.count("evidence: the same as <a href='#tokens_per_step'>") == 2  # micro_batch and grad_accum point to it
    assert all(page.rfind("<details>", 0, m.start()) > page.rfind("</details>", 0, m.start()) for m in re.finditer("<pre>", page))


def test_without_matplotlib_the_page_says_so_once(monkeypatch):
    monkeypatch.setattr(report, "matplotlib_available", lambda: False)
    page = report.render_plan(_plan())
    assert page.count("need matplotlib") == 1 and "No plot" not in page


def test_the_ramp_draws_its_budget_line_only_when_it_is_in_range():
    pytest.importorskip("matplotlib")
    from leadline.report.plots import render_svg

    ev = _plan()["rows_fit"].evidence
    far = render_svg(ev)
    assert "above the plot" in far
    near = render_svg({**ev, "budget_bytes": 1.2e9})
    assert "above the plot" not in near


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install chromium)")
def test_in_chromium_the_card_is_on_the_first_screen_and_nothing_overflows(tmp_path):
    probe = ("<script>addEventListener('load',()=>{const c=document.querySelector('.card').getBoundingClientRect();"
             "const d=document.documentElement;let wide=0;document.querySelectorAll('table,svg,pre').forEach(e=>{"
             "const r=e.getBoundingClientRect();if(r.right>d.clientWidth+1)wide++;});"
             "document.body.setAttribute('data-probe',[Math.round(c.bottom),d.scrollWidth,d.clientWidth,wide].join(','));});</script>")
    page = report.render_plan(_plan()).replace("</body>", probe + "</body>")
    path = tmp_path / "report.html"
    path.write_text(page)
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1300,1000",
                          "--virtual-time-budget=5000", "--dump-dom", path.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    bottom, scroll, client, wide = (int(x) for x in re.search(r'data-probe="([\d,]+)"', dom).group(1).split(","))
    assert bottom <= 1000, "the summary card is below the first screen"
    assert scroll <= client and wide == 0, "something is wider than the page"
