"""The report draws each decision the plan records: the opening race (where a challenger ran), the
guard's checks (with the run's training curve where the run's record came along); it says where
the seconds went, phase by phase, and names the model and the data in its header."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from leadline.plan import PhaseTime, Plan, Value
from leadline.report import html as report

FIGURE = re.compile(r"<figure[^>]*>(.*?)</figure>", flags=re.S)


def _race() -> dict[str, Any]:
    """The opening race as the run records it: the default against a higher rate, the lower not run."""
    return {"horizon_steps": 2, "rates": [0.0025, 0.01, 0.000625], "decide_share": 0.2,
            "tests": [{"incumbent": 0.0025, "challenger": 0.01, "incumbent_mean": 1.4428, "challenger_mean": 18.463,
                       "replaces": False, "why": "0.01 did not beat 0.0025"},
                      {"challenger": 0.000625, "ran": False, "replaces": False, "why": "0.000625 not run"}],
            "readings": {"0.0025": {"mean": 1.4428, "collapsed": False}, "0.01": {"mean": 18.463, "collapsed": True}},
            "start": {"mean": 11.26}, "collapse_checked": True}


def _guard() -> dict[str, Any]:
    """The guard's checks: a best, a spike rolled back to the best, the kept check, the final one."""
    checks = [{"step": 2, "loss": 1.44, "se": 0.05, "lr": 0.0025, "action": "start"},
              {"step": 6, "loss": 1.21, "se": 0.04, "lr": 0.0025, "action": "best"},
              {"step": 10, "loss": 1.62, "se": 0.06, "lr": 0.0025, "action": "rollback", "to_step": 6},
              {"step": 14, "loss": 1.12, "se": 0.04, "lr": 0.00125, "action": "best"},
              {"step": 18, "loss": 1.15, "se": 0.04, "lr": 0.00125, "action": "keep"},
              {"step": 20, "loss": 1.14, "se": 0.04, "lr": 0.00125, "action": "final"}]
    return {"plot": "checks", "checks": checks, "held_out_before": {"mean": 11.26, "se": 0.3},
            "held_out_after": {"mean": 1.12, "se": 0.04}, "kept_step": 14, "outcome": "improved", "rows": 40}


def fake_plan() -> Plan:
    """A plan shaped as ``leadline run`` leaves one, with the guard's value beside the race's."""
    p = Plan(model={"trained_as": "factors", "trained_parameters": 4884480, "name": "SmolLM2-135M + LoRA r16"},
             data={"path": "demo-out/train.jsonl", "rows": 400, "sha256": "e2574b800b4dcedea259"},
             machine={"device": "cpu"}, created=0.0)
    p.set("precision", Value({"dtype": "float32", "quantization": None, "compute_dtype": "float32",
                              "checkpointing": False, "adapter": True}, "given", "the model as it trains",
                             evidence={"dtype": "float32", "quantization": None}))
    p.set("micro_batch", Value(16, "derived", "the whole step", unit="rows"))
    p.set("lr", Value(0.0025, "measured", "won the opening race on 40 held-out rows after 2 steps",
                      evidence=_race(), unit="per step"))
    p.set("opening_steps", Value(2, "derived", "each candidate's steps in the opening race", unit="steps"))
    p.set("total_steps", Value(20, "derived", "the run's length", unit="steps"))
    p.set("guard", Value("improved", "measured", "the guard checked the held-out loss 6 times and rolled back once",
                         evidence=_guard()))
    p.phases = [PhaseTime("memory", 0.00003, 0, ("micro_batch",)),
                PhaseTime("rate", 44.9, 4, (), step_seconds=30.0, reads=3, read_seconds=14.2),
                PhaseTime("run", 84.1, 18, (), step_seconds=80.0, reads=2, read_seconds=4.1)]
    p.derive_seconds = 44.9
    return p


def _curve() -> list[dict[str, Any]]:
    return [{"step": s, "loss": 2.0 / (1 + s) + 1.0, "lr": 0.0025 if s < 10 else 0.00125, "seconds": s * 4.0}
            for s in range(20)]


def test_every_decision_has_its_figure():
    pytest.importorskip("matplotlib")
    page = report.render_plan(fake_plan(), run={"curve": _curve()})
    figs = FIGURE.findall(page)
    assert len(figs) == 2  # the race, the guard: one each
    assert all(f.startswith("<svg") for f in figs)
    ids = re.findall(r"<figure id='figure-(\w+)'", page)
    assert ids == ["lr", "guard"]
    race, guard = figs
    assert "the opening race" in race and "0.0025: 1.443 kept" in race and "0.01: 18.46 (answers collapsed)" in race
    assert "not run: 0.000625" in race and "before any step: 11.26" in race
    assert "rolled back" in guard and "kept: step 14" in guard and "training loss" in guard
    assert "11.26 ± 0.3 before, 1.12 ± 0.04 after" in guard


def test_without_the_run_record_the_guard_is_drawn_without_the_curve():
    pytest.importorskip("matplotlib")
    figs = FIGURE.findall(report.render_plan(fake_plan()))
    assert len(figs) == 2 and "training loss" not in figs[1]


def test_a_race_the_default_ran_alone_draws_no_race_and_the_removed_pass_rule_no_figure():
    """A rate no challenger raced is a constant, and one point is no race: no figure for it. The
    pass rule of earlier builds is gone: a plan that still records it shows its evidence as a table."""
    pytest.importorskip("matplotlib")
    p = fake_plan()
    alone = {**_race(), "readings": {"0.0025": {"mean": 1.4428, "collapsed": False}},
             "tests": [{"challenger": 0.000625, "ran": False, "replaces": False, "why": "0.000625 not run"}]}
    p.set("lr", Value(0.0025, "constant", "schedule-free's default, checked by the guard; no challenger ran: ...",
                      evidence=alone, unit="per step"))
    p.set("kept_step", Value(20, "measured", "the last pass read lowest", unit="steps",
                             evidence={"plot": "passes", "kept_step": 20, "readings": [{"step": 20, "mean": 1.1}]}))
    page = report.render_plan(p)
    assert re.findall(r"<figure id='figure-(\w+)'", page) == ["guard"]
    assert "the opening race: held-out loss" not in page and "passes: the pass" not in page


def test_a_run_without_a_guard_draws_its_training_curve_apart():
    pytest.importorskip("matplotlib")
    p = fake_plan()
    del p.values["guard"]
    page = report.render_plan(p, run={"curve": _curve()})
    assert len(FIGURE.findall(page)) == 2 and "<figure class='run'>" in page and "20 steps." in page


def test_a_dict_value_reads_in_words_and_no_python_repr_reaches_the_page():
    p = fake_plan()
    page = report.render_plan(p)
    assert "{'" not in page and "None" not in re.sub(r"<pre>.*?</pre>", "", page, flags=re.S)
    words = "float32, no quantization, gradient checkpointing off, a LoRA adapter"
    assert f"<h3>precision = {words} " in page
    assert p.report().splitlines()[0].startswith(f"precision = {words}  [given]")
    assert p.why("precision", width=99).splitlines()[0] == f"precision = {words}  [given]"
    assert "{'" not in p.report() and "{'" not in p.why("precision") and "{'" not in p.report(long=False)


def test_the_run_steps_are_the_runs_and_the_race_seconds_are_the_rates():
    p = fake_plan()
    page = html.unescape(report.render_plan(p))
    card = page[page.index("class='card'"):page.index("</div>", page.index("class='card'"))]
    assert "derive took 44.9 s and 4 training steps on the run's rows: rate 44.9 s (4 steps, 3 held-out reads)" in card
    assert "The run: 18 steps in 84.1 s, 2 held-out reads (4.1 s) after the race's 2 it kept (20 steps of training " \
           "in all)" in card
    assert "22 training steps" not in card  # the run's steps are not derive's
    assert "cost: the rate phase, 44.9 s: 4 steps on the run's rows (30.0 s), 3 held-out reads (14.2 s)" in p.why("lr")
    assert "the run: 18 steps in 84.1 s" in p.report()
    assert "derive: 44.9 s wall, 44.9 s of it in the phases,\n    4 steps" in p.report()


def test_a_run_too_short_to_race_gives_its_steps_to_the_run():
    p = fake_plan()
    p.set("opening_steps", Value(0, "derived", "too short to race", unit="steps"))
    p.phases = [PhaseTime("memory", 0.00296, 0), PhaseTime("rate", 0.0, 0), PhaseTime("run", 12.0, 16)]
    p.derive_seconds = 0.00296
    card = html.unescape(report.render_plan(p)).split("class='card'")[1].split("</div>")[0]
    assert "derive took 0.00296 s." in card and "The run: 16 steps in 12.0 s." in card
    assert "training steps on the run's rows" not in card


def test_the_header_names_the_model_and_the_data():
    p = fake_plan()
    head = html.unescape(report.render_plan(p).split("class='card'")[0])
    assert "<b>model</b> SmolLM2-135M + LoRA r16, a LoRA adapter of 4,884,480 trained parameters" in head
    assert "<b>data</b> demo-out/train.jsonl, 400 rows (sha256 e2574b800b4d)" in head
    del p.model["name"]
    p.data["path"] = "/home/someone/data/train.jsonl"
    head = html.unescape(report.render_plan(p).split("class='card'")[0])
    assert "name not recorded, a LoRA adapter" in head and "/home/someone" not in head


def test_leadline_report_draws_the_curve_of_the_run_json_beside_the_plan(tmp_path):
    pytest.importorskip("matplotlib")
    from leadline.cli import main

    fake_plan().to_json(tmp_path / "plan.json")
    (tmp_path / "run.json").write_text(json.dumps({"steps": 20, "curve": _curve()}))
    assert main(["report", str(tmp_path), "--html", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "training loss (a step" in FIGURE.findall(page)[1]


# Counts the figures and their drawings as the browser lays them out, and their size on the page.
_COUNT = """<script>addEventListener('load', () => {
  const figs = [...document.querySelectorAll('figure')];
  const drawn = figs.filter(f => { const s = f.querySelector('svg'); return s && s.getBoundingClientRect().height > 100
    && s.getBoundingClientRect().width > 200; });
  document.body.setAttribute('data-figures', [figs.length, drawn.length].join(','));
});</script>"""


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install chromium)")
def test_in_chromium_each_decision_shows_a_drawn_figure(tmp_path: Path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "report.html"
    path.write_text(report.render_plan(fake_plan(), run={"curve": _curve()}).replace("</body>", _COUNT + "</body>"))
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1300,2000",
            "--virtual-time-budget=5000"]
    dom = subprocess.run([*base, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'data-figures="(\d+),(\d+)"', dom)
    assert found, f"chromium did not run the count: {dom[:300]!r}"
    assert (int(found.group(1)), int(found.group(2))) == (3, 3)  # three figures, each drawn at a readable size
    shot = tmp_path / "report.png"
    subprocess.run([*base, f"--screenshot={shot}", path.as_uri()], capture_output=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 10_000


def test_the_race_seconds_stand_beside_lr_in_the_page_too():
    page = html.unescape(report.render_plan(fake_plan()))
    lr = page[page.index("<section id='lr'>"):page.index("</section>", page.index("<section id='lr'>"))]
    assert "(cost: the rate phase, 44.9 s: 4 steps on the run's rows (30.0 s), 3 held-out reads (14.2 s))" in lr
    total = page[page.index("<section id='total_steps'>"):]
    assert "cost:" not in total[:total.index("</section>")]  # nothing was spent on it: nothing said
