import json
import subprocess
import sys
from pathlib import Path

from leadline import Plan, Value
from leadline.cli import COMMANDS, main


def _run(*args):
    return subprocess.run([sys.executable, "-m", "leadline", *args], capture_output=True, text=True)


def test_import_and_help_do_not_load_torch():
    code = (
        "import sys, leadline, leadline.cli\n"
        "try:\n    leadline.cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'numpy', 'matplotlib') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


def test_help_lists_every_command_and_version():
    r = _run("--help")
    assert r.returncode == 0
    for c in COMMANDS:
        assert c in r.stdout
    v = _run("--version")
    assert v.returncode == 0 and v.stdout.startswith("leadline ")


def test_unknown_subcommand_is_one_line_and_exit_2():
    r = _run("frobnicate")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "frobnicate" in r.stderr


def test_report_prints_plan_and_writes_html(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a short path: the last line names it
    p = Plan()
    p.set("micro_batch", Value(2, "measured", "the ramp kept 2 rows", unit="rows"))
    p.set("rows", Value(32, "measured", "rows read from train.jsonl", evidence={"formats": {"text": 32}}))
    path = "plan.json"
    p.to_json(path)
    assert main(["report", path, "--html", str(tmp_path / "r.html")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:5] == ["train with:", "  micro_batch  2 rows  measured", "and the numbers behind them:",
                       "  rows         32      measured",
                       f"leadline report {path} --why NAME prints the sentence and evidence behind a value"]
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert main(["report", path, "--long"]) == 0
    assert "micro_batch = 2 rows  [measured] the ramp kept 2 rows" in capsys.readouterr().out
    assert main(["report", path, "--why", "rows"]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == ["rows = 32  [measured]", "rows read from train.jsonl"]


def test_derive_prints_the_table_first_and_where_the_sentences_are(tmp_path, capsys, monkeypatch):
    """What ``leadline derive`` and ``leadline run`` print once the plan is written."""
    from leadline.cli.derive import write_plan

    monkeypatch.chdir(tmp_path)
    p = Plan()
    p.set("lr", Value(0.000445, "constant", "the anchor, not measured: nothing could be run for the rate; " * 8,
                      unit="per step"))
    p.set("rows", Value(32, "measured", "rows read from train.jsonl"))
    write_plan(p, Path("my plan.json"), None)
    out = capsys.readouterr().out.splitlines()
    assert out[:5] == ["train with:", "  lr    0.000445 per step  constant", "and the numbers behind them:",
                       "  rows  32                 measured",
                       "leadline report 'my plan.json' --why NAME prints the sentence and evidence behind a value"]
    assert all(len(ln) < 100 for ln in out[:4]) and "the anchor" not in "\n".join(out)
    assert Plan.from_json(tmp_path / "my plan.json") == p


def test_report_why_an_unknown_name_is_one_sentence_naming_the_known_ones(tmp_path):
    p = Plan()
    for name in ("micro_batch", "lr", "lr_anchor"):
        p.set(name, Value(1, "measured", "a reading"))
    path = tmp_path / "plan.json"
    p.to_json(path)
    r = _run("report", str(path), "--why", "lrr", "--html", str(tmp_path / "r.html"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and not r.stdout
    assert "--why lrr" in r.stderr and "(did you mean lr?)" in r.stderr
    assert "pass one of: micro_batch, lr, lr_anchor" in r.stderr
    assert not (tmp_path / "r.html").exists()  # nothing written


def test_report_bad_input_one_sentence_nothing_written(tmp_path):
    bad = tmp_path / "not_a_plan.json"
    bad.write_text(json.dumps([1, 2, 3]))
    out = tmp_path / "r.html"
    r = _run("report", str(bad), "--html", str(out))
    assert r.returncode == 2 and "is not a leadline plan" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()
    r = _run("report", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "does not exist" in r.stderr
