"""Bad input to derive, run, train and fit: one sentence on stderr, exit 2, nothing written;
refused before the model loads wherever the input alone tells (a sentence about the data while
--model names no model shows the data was read first). And flags that mean one thing in every
command: --out a folder, --html a path, --rows-per-step and --micro-batch, --field."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import DATA, save_model_dir
from leadline import Plan, Value
from leadline.cli import build_parser, main
from leadline.errors import InputError
from leadline.plan import Skipped

NO_MODEL = "/nonexistent/leadline/model"  # never loaded: every case below is refused before
GOOD = DATA / "prompt_completion.jsonl"  # 40 rows: 32 to train on after the held-out and test rows


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("m") / "tiny")


def _plan() -> Plan:
    """A plan as derive writes one: 2 rows a step, a rate, 4 steps."""
    p = Plan()
    p.set("micro_batch", Value(2, "measured", "the ramp kept 2 rows", unit="rows"))
    p.set("grad_accum", Value(1, "derived", "one micro-batch a step"))
    p.set("lr", Value(1e-3, "measured", "the look-ahead's best", unit="per step"))
    p.set("total_steps", Value(4, "given", "the caller's", unit="steps"))
    return p


def _refused(capsys, argv: list[str], *needles: str) -> str:
    capsys.readouterr()
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("leadline")]
    assert len(said) == 1, said
    for needle in needles:
        assert needle in said[0], said[0]
    assert "Traceback" not in err
    return said[0]


def _listing(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture()
def files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "malformed.jsonl").write_text('{"text": "fine"}\n{"text": "unterminated')
    (tmp_path / "fields.jsonl").write_text('{"body": "x", "tag": "y"}\n')
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    quick = _plan()  # a plan of the removed quick effort: its rates raced inside the run, no look-ahead
    quick.set("race_rates", Value([5e-4, 1e-3, 2e-3], "derived", "the anchor x 2^j"))
    quick.to_json(tmp_path / "quick.json")
    _plan().to_json(tmp_path / "plan.json")
    no_lr = Plan()
    no_lr.set("micro_batch", Value(2, "measured", "the ramp kept 2 rows", unit="rows"))
    no_lr.skipped.append(Skipped("rate", "not_reached", max_seconds=5.0))
    no_lr.to_json(tmp_path / "no_lr.json")
    return tmp_path


def test_refused_before_the_model_loads_in_one_sentence_and_nothing_written(files, capsys):
    d = files
    m = ["--model", NO_MODEL, "--device", "cpu"]
    derive = ["derive", *m, "--data", str(GOOD), "--out", str(d / "new")]
    run = ["run", *m, "--data", str(GOOD), "--out", str(d / "new")]
    train = ["train", *m, "--data", str(GOOD), "--plan", str(d / "plan.json"), "--out", str(d / "run")]
    before = _listing(d)
    cases = [
        # absurd lengths against the data: 32 training rows
        ([*derive, "--steps", "1000000000000"], "--steps 1000000000000 is more than 1000 passes over the 32 training",
         "pass --steps 32000 or fewer"),
        ([*derive, "--rows-per-step", "1000000"], "--rows-per-step 1000000 is more rows a step than the 32 training",
         "pass --rows-per-step 32 or fewer"),
        ([*derive, "--rows-per-step", "4", "--steps", "9000"], "at 4 rows a step", "pass --steps 8000 or fewer"),
        ([*derive, "--epochs", "5000"], "--epochs 5000 is more than 1000 passes", "pass --epochs 1000"),
        ([*run, "--steps", "1000000000000"], "--steps 1000000000000", "pass --steps 32000 or fewer"),
        ([*run, "--rows-per-step", "1000000"], "--rows-per-step 1000000", "pass --rows-per-step 32 or fewer"),
        ([*train, "--steps", "1000000000000"], "--steps 1000000000000", "at 2 rows a step", "pass --steps 16000"),
        ([*train, "--recipe", "--rows-per-step", "1000"], "--rows-per-step 1000 is more rows a step",
         "pass --rows-per-step 32 or fewer"),
        ([*train, "--recipe", "--batch", "1000"], "--batch 1000 is more rows a step", "pass --batch 32"),  # as typed
        # a bound that is no bound
        ([*derive, "--max-seconds", "inf"], "--max-seconds inf must be a finite number above 0"),
        ([*run, "--max-seconds", "inf"], "--max-seconds inf must be a finite number above 0"),
        # the data's contents, read before the model loads
        (["derive", *m, "--data", str(d / "empty.jsonl"), "--out", str(d / "new")], "empty.jsonl holds no rows"),
        (["run", *m, "--data", str(d / "malformed.jsonl"), "--out", str(d / "new")], "line 2 is not JSON"),
        (["derive", *m, "--data", str(d / "fields.jsonl"), "--out", str(d / "new")], "none of the known fields"),
        (["train", *m, "--data", str(d / "empty.jsonl"), "--plan", str(d / "plan.json"), "--out", str(d / "run")],
         "holds no rows"),
        ([*derive, "--field", "body"], "--field names 'body', and no row of", "its rows have completion, prompt"),
        ([*run, "--field", "bogus=prompt"], "'bogus' is not a role leadline reads"),
        ([*train, "--field", "text=body"], "--field names 'body', and no row of"),
        # the removed quick effort: named, with what to use instead
        ([*derive, "--effort", "quick"], "leadline derive: --effort quick was removed: use race (the default) or full"),
        ([*run, "--effort", "quick"], "leadline run: --effort quick was removed: use race (the default) or full"),
        ([*derive, "--effort", "fast"], "--effort fast is not one of race, full"),
        (["train", *m, "--data", str(GOOD), "--plan", str(d / "quick.json"), "--out", str(d / "run")],
         "quick.json is of the quick effort, which was removed; derive it again with the race effort (the default) "
         "or full"),
        (["train", *m, "--data", str(GOOD), "--plan", str(d / "no_lr.json"), "--out", str(d / "run")],
         "has no lr, so it cannot train", "its derive ran out of time (rate: not reached within max_seconds=5)"),
        # --out is a folder
        (["derive", *m, "--data", str(GOOD), "--out", str(d / "afile")], "is a file, not a folder"),
        (["train", *m, "--data", str(GOOD), "--plan", str(d / "adir"), "--out", str(d / "run")], "is a folder without a",
         "plan.json"),
    ]
    for argv, *needles in cases:
        said = _refused(capsys, argv, *needles)
        assert "does not exist" not in said or "model" not in said  # the model was never reached
    assert _listing(d) == before


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, a folder nothing can be written in")
def test_an_output_that_cannot_be_written_is_refused_before_the_model_loads(files, capsys):
    """/proc takes no new file, even from root (for whom os.access says yes): every output flag is
    refused in one sentence before the model loads, where it used to be a traceback after it."""
    d = files
    m = ["--model", NO_MODEL, "--device", "cpu", "--data", str(GOOD)]
    before = _listing(d)
    for argv in (["run", *m, "--out", "/proc/leadline-x"], ["derive", *m, "--out", "/proc/leadline-x"],
                 ["train", *m, "--plan", str(d / "plan.json"), "--out", "/proc/leadline-x"],
                 ["run", *m, "--out", str(d / "new"), "--html", "/proc/leadline-x.html"],
                 ["derive", *m, "--out", str(d / "new"), "--html", "/proc/leadline-x.html"]):
        flag = "--html" if "--html" in argv else "--out"
        _refused(capsys, argv, f"{flag} /proc/leadline-x", "nothing can be written in /proc",
                 "choose a folder you can write to")
    _refused(capsys, ["report", str(d / "plan.json"), "--html", "/proc/leadline-x.html"],
             "leadline report: --html /proc/leadline-x.html: nothing can be written in /proc")
    assert _listing(d) == before


def test_a_plan_file_leadline_did_not_write_is_never_replaced(files, capsys):
    d = files
    (d / "mine").mkdir()
    (d / "mine" / "plan.json").write_text('{"my": "notes"}\n')
    (d / "notes.json").write_text("not json at all\n")
    m = ["derive", "--model", NO_MODEL, "--device", "cpu", "--data", str(GOOD)]
    before = _listing(d)
    _refused(capsys, [*m, "--out", str(d / "mine")], f"--out {d / 'mine'}: its plan.json is not a plan leadline wrote",
             '"leadline_plan" mark', "move it away or choose another folder")
    _refused(capsys, [*m, "--out", str(d / "notes.json")], f"--out {d / 'notes.json'} is not a plan leadline wrote")
    assert _listing(d) == before
    assert (d / "mine" / "plan.json").read_text() == '{"my": "notes"}\n'


@pytest.mark.parametrize("row", [{"prompt": "2+2=", "completion": 4}, {"prompt": 7, "completion": " four"},
                                 {"text": 3.5}, {"messages": [{"role": "user", "content": 2}]}])
def test_a_field_that_is_not_a_string_is_refused_with_its_file_and_line(files, capsys, row):
    d = files
    data = d / "numbers.jsonl"
    data.write_text(GOOD.read_text().splitlines()[0] + "\n" + json.dumps(row) + "\n")
    before = _listing(d)
    for command in ("run", "derive"):
        said = _refused(capsys, [command, "--model", NO_MODEL, "--data", str(data), "--out", str(d / "new")],
                        f"{data} line 2 has ")
        assert "not a string" in said or "without a 'role' and a text 'content'" in said
        if isinstance(row.get("completion"), int):
            assert 'write "completion": "4"' in said
    assert _listing(d) == before


def _fake_derive(plan: Plan, seen: dict):
    def derive_for(model, tok, data, **kw):
        seen.update(kw)
        return plan
    return derive_for


def test_a_derive_cut_before_the_micro_batch_is_refused_and_writes_nothing(model_dir, tmp_path, capsys, monkeypatch):
    cut = Plan()
    cut.set("lr", Value(1e-3, "constant", "the anchor"))
    cut.skipped.append(Skipped("memory", "not_reached", max_seconds=2.0))
    monkeypatch.setattr("leadline.hf.derive_for", _fake_derive(cut, {}))
    args = ["--model", str(model_dir), "--data", str(GOOD), "--lora-rank", "4", "--device", "cpu",
            "--effort", "full", "--max-seconds", "2"]
    said = _refused(capsys, ["derive", *args, "--out", str(tmp_path / "plan")],
                    "--max-seconds ended the derive before it measured micro_batch",
                    "(memory: not reached within max_seconds=2)", "none was written", "raise --max-seconds")
    assert said.startswith("leadline derive: ")
    _refused(capsys, ["run", *args, "--out", str(tmp_path / "run")], "before it measured micro_batch")
    assert _listing(tmp_path) == []


def test_full_on_a_quantized_base_is_a_sentence_for_the_shell():
    import torch

    from leadline.hf.loading import check_full

    model = torch.nn.Linear(4, 2)
    model.config = SimpleNamespace(quantization_config={"quant_method": "gguf"})
    with pytest.raises(InputError) as e:
        check_full(model, "smol.gguf")
    assert "--full" in str(e.value) and "leave --full out" in str(e.value)
    assert "peft" not in str(e.value) and "SFTTrainer" not in str(e.value)
    check_full(torch.nn.Linear(4, 2), "model")  # an unquantized base: nothing to say


class _SmallRoom:
    def __init__(self, *a, **k) -> None:
        pass

    def room(self) -> int:
        return 2_000_000  # bytes: the tiny model's one row of 512 tokens needs more by the estimate


def _long_data(tmp_path):
    data = tmp_path / "long.jsonl"
    shutil.copy(GOOD, data)
    with data.open("a") as f:
        f.write(json.dumps({"text": "the quick brown fox jumps over the lazy dog. " * 2300}) + "\n")  # ~100k chars
    return data


def test_a_row_past_the_models_positions_is_said_once_and_refused_where_one_row_cannot_fit(model_dir, tmp_path,
                                                                                           capsys, monkeypatch):
    (tmp_path / "in").mkdir()
    data = _long_data(tmp_path / "in")
    plan = _plan()
    plan.set("seq_len", Value(512, "derived", "the model's positions, shorter than the longest row",
                              evidence={"rule": "positions"}))
    monkeypatch.setattr("leadline.hf.derive_for", _fake_derive(plan, {}))
    argv = ["derive", "--model", str(model_dir), "--data", str(data), "--lora-rank", "4", "--device", "cpu",
            "--effort", "full", "--steps", "4"]
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "ok")]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "longer than the model's" in line or "positions" in line]
    assert len(notes) == 1 and "rows are cut to 512 tokens" in notes[0] and "--seq-len N" in notes[0], err
    monkeypatch.setattr("leadline.memory_readings.memory_for", _SmallRoom)
    said = _refused(capsys, [*argv, "--out", str(tmp_path / "no")], "its longest row is", "cut to the model's 512",
                    "pass --seq-len")
    n = int(said.split("pass --seq-len ")[1].split()[0])
    assert 2 <= n < 512
    assert not (tmp_path / "no").exists()
    capsys.readouterr()
    assert main([*argv, "--seq-len", "64", "--out", str(tmp_path / "chosen")]) == 0  # the length chosen: no word


def test_out_is_a_folder_html_a_path_and_the_field_reaches_the_plan(model_dir, tmp_path, capsys, monkeypatch):
    data = tmp_path / "body.jsonl"
    data.write_text("".join(json.dumps({"body": r["prompt"] + r["completion"], "id": i}) + "\n"
                            for i, r in enumerate(map(json.loads, GOOD.read_text().splitlines()))))
    seen: dict = {}
    monkeypatch.setattr("leadline.hf.derive_for", _fake_derive(_plan(), seen))
    base = ["derive", "--model", str(model_dir), "--data", str(data), "--lora-rank", "4", "--device", "cpu",
            "--effort", "full", "--field", "body"]
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "plan"), "--html"]) == 0
    assert seen["fields"] == {"text": "body"}
    assert json.loads((tmp_path / "plan" / "plan.json").read_text())["data"]["fields"] == {"text": "body"}
    assert (tmp_path / "plan" / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert "spelling to be removed" not in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "old.json"), "--html", str(tmp_path / "old.html")]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("leadline")]
    assert len(err) == 1 and f"--out {tmp_path}" in err[0] and "spelling to be removed" in err[0]
    assert (tmp_path / "old.json").exists() and (tmp_path / "old.html").exists()
    from leadline.cli._common import read_plan

    assert read_plan("--plan", str(tmp_path / "plan")).micro_batch == 2  # the folder names its plan
    assert main(["report", str(tmp_path / "plan")]) == 0


def _help(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices[command]


@pytest.mark.parametrize("command", ["derive", "run", "train", "fit", "report", "corpus"])
def test_every_option_states_its_default(command):
    for a in _help(command)._actions:
        if (not a.option_strings or a.help == argparse.SUPPRESS or a.required
                or isinstance(a, (argparse._HelpAction, argparse._StoreTrueAction))):
            continue
        assert "default" in (a.help or "") or "required" in (a.help or ""), (command, a.option_strings)


def test_old_spellings_parse_and_are_hidden():
    parse = build_parser().parse_args
    train = ["train", "--model", "m", "--data", "d", "--plan", "p", "--out", "o"]
    assert parse([*train, "--batch", "8"]).rows_per_step == 8
    assert parse([*train, "--rows-per-step", "8"]).rows_per_step == 8
    assert parse([*train]).rows_per_step is None  # the recipe's 16 applied with --recipe alone (cli/train.py)
    assert parse(["fit", "--seq-len", "8", "--batch", "2"]).micro_batch == 2
    assert parse(["run", "--model", "m", "--data", "d", "--out", "o", "--html", "r.html"]).html == "r.html"
    assert parse(["run", "--model", "m", "--data", "d", "--out", "o", "--html"]).html is True
    for command in ("train", "fit"):
        shown = _help(command).format_help()
        assert "--batch" not in shown and ("--rows-per-step" in shown or "--micro-batch" in shown)
    for command in ("derive", "run", "train", "corpus"):
        assert "--field" in _help(command).format_help()
