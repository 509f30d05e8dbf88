"""Every CLI command against a table of bad inputs: exit 2, one sentence naming the input and
the fix, only flags the command has, no traceback, and nothing new on disk."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from helpers import DATA, save_model_dir
from leadline import Plan, Value
from leadline.cli import build_parser, main


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("m") / "tiny")


def _plan(path, **changes):
    """A plan file as derive writes one, with ``changes`` made to its JSON (a hand-edited plan)."""
    p = Plan()
    p.set("micro_batch", Value(2, "measured", "the ramp kept 2 rows", unit="rows"))
    p.set("grad_accum", Value(1, "derived", "one micro-batch a step"))
    p.set("lr", Value(1e-3, "measured", "the look-ahead's best", unit="per step"))
    p.set("total_steps", Value(4, "given", "the caller's", unit="steps"))
    d = p.to_dict()
    for key, value in changes.items():
        if key == "version":
            d["version"] = value
        else:
            d["values"][key]["value"] = value
    path.write_text(json.dumps(d))
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, model_dir):
    d = tmp_path_factory.mktemp("inputs")
    good = d / "good.jsonl"
    shutil.copy(DATA / "prompt_completion.jsonl", good)
    (d / "empty.jsonl").write_text("")
    (d / "blank.jsonl").write_text("\n  \n\n")
    (d / "malformed.jsonl").write_text('{"text": "fine"}\n{"text": "unterminated')
    (d / "fields.jsonl").write_text('{"body": "x", "tag": "y"}\n')
    (d / "latin1.jsonl").write_bytes('{"text": "caf\xe9"}\n'.encode("latin-1"))
    (d / "adir").mkdir()
    (d / "afile").write_text("x")
    (d / "full").mkdir()
    (d / "full" / "kept.txt").write_text("x")
    plans = {name: _plan(d / f"{name}.json", **changes) for name, changes in {
        "plan": {}, "abc": {"micro_batch": "abc"}, "neg": {"micro_batch": -3}, "v99": {"version": "99.0.0"},
        "lr_text": {"lr": "fast"},
    }.items()}
    quick = Plan.from_json(plans["plan"])  # a plan of the removed quick effort: its rates raced inside the run
    quick.set("race_rates", Value([1e-3, 2e-3], "derived", "the quick effort's grid"))
    quick.to_json(d / "quick.json")
    plans["quick"] = d / "quick.json"
    return d, good, plans


def _cases(model_dir, inputs):
    import torch

    d, good, plans = inputs
    m = ["--model", str(model_dir), "--device", "cpu", "--lora-rank", "4"]
    out = ["--out", str(d / "new" / "p.json")]
    derive = ["derive", *m, "--steps", "4", "--effort", "full", "--max-seconds", "60"]
    train = ["train", *m, "--data", str(good), "--plan", str(plans["plan"]), "--out", str(d / "run")]
    fit = ["fit", "--model", str(model_dir), "--device", "cpu", "--lora-rank", "4"]
    run = ["run", *m, "--steps", "4", "--effort", "full", "--max-seconds", "60"]
    cases = [
        # derive: the data
        ([*derive, "--data", str(d / "missing.jsonl"), "--out", str(d / "p.json")], "--data", "does not exist"),
        ([*derive, "--data", str(d / "adir"), "--out", str(d / "p.json")], "--data", "is a folder"),
        ([*derive, "--data", str(d / "empty.jsonl"), "--out", str(d / "p.json")], "empty.jsonl", "holds no rows"),
        ([*derive, "--data", str(d / "blank.jsonl"), "--out", str(d / "p.json")], "blank.jsonl", "holds no rows"),
        ([*derive, "--data", str(d / "malformed.jsonl"), "--out", str(d / "p.json")], "line 2", "is not JSON (Unterminated string starting at column"),
        ([*derive, "--data", str(d / "fields.jsonl"), "--out", str(d / "p.json")], "line 1", "none of the known fields"),
        ([*derive, "--data", str(d / "latin1.jsonl"), "--out", str(d / "p.json")], "line 1", "not UTF-8"),
        # derive: the outputs, checked before the derive runs
        ([*derive, "--data", str(good), "--out", str(d / "afile")], "--out", "is a file, not a folder"),
        ([*derive, "--data", str(good), *out], "--out", "does not exist"),
        ([*derive, "--data", str(good), "--out", str(d / "p.json"), "--html", str(d / "nodir" / "r.html")], "--html", "does not exist"),
        ([*derive, "--data", str(good), "--out", str(d / "p.json"), "--resume", str(d / "adir")], "--resume", "is a folder"),
        # derive: absurd numbers
        ([*derive, "--data", str(good), "--out", str(d / "p.json"), "--steps", "0"], "--steps 0", ">= 1"),
        (["derive", *m, "--epochs", "-1", "--data", str(good), "--out", str(d / "p.json")], "--epochs -1", "above 0"),
        ([*derive, "--data", str(good), "--out", str(d / "p.json"), "--max-seconds", "0"], "--max-seconds 0", "above 0"),
        ([*derive, "--data", str(good), "--out", str(d / "p.json"), "--rows-per-step", "0"], "--rows-per-step 0",
         ">= 1"),
        ([*derive, "--data", str(good), "--out", str(d / "p.json"), "--seq-len", "1"], "--seq-len 1", "at least 2"),
        ([*derive, "--data", str(good), "--out", str(d / "p.json"), "--quantile", "2"], "--quantile 2", "at most 1"),
        ([*derive, "--data", str(good), "--out", str(d / "p.json"), "--seq-len", "100000"], "seq_len 100000", "positions"),
        (["derive", "--model", str(model_dir), "--device", "cpu", "--lora-rank", "100000", "--steps", "2",
          "--data", str(good), "--out", str(d / "p.json")], "--lora-rank 100000", "larger than the model's width"),
        ([*derive, "--data", str(good), "--out", str(d / "p.json"), "--prior", str(plans["v99"])], "--prior", "newer than this leadline"),
        ([*derive, "--data", str(good), "--out", str(d / "p.json"), "--device", "gpu"], "--device gpu", "cpu, cuda or cuda:N"),
        # train
        (["train", *m, "--data", str(d / "nope.jsonl"), "--plan", str(plans["plan"]), "--out", str(d / "run")], "--data", "does not exist"),
        (["train", *m, "--data", str(d / "adir"), "--plan", str(plans["plan"]), "--out", str(d / "run")], "--data", "is a folder"),
        (["train", *m, "--data", str(good), "--plan", str(plans["plan"]), "--out", str(d / "afile")], "--out", "is a file"),
        (["train", *m, "--data", str(good), "--plan", str(plans["plan"]), "--out", str(d / "full")], "--out", "not empty"),
        (["train", *m, "--data", str(good), "--plan", str(plans["plan"]), "--out", str(d / "no" / "run")], "--out", "does not exist"),
        ([*train, "--recipe", "--batch", "0"], "--batch 0", ">= 1"),
        ([*train, "--recipe", "--batch", "-4"], "--batch -4", ">= 1"),
        ([*train, "--recipe", "--lr", "-1"], "--lr -1", "above 0"),
        ([*train, "--recipe", "--lr", "0"], "--lr 0", "above 0"),
        ([*train, "--recipe", "--warmup-ratio", "2"], "--warmup-ratio 2", "share of the steps"),
        ([*train, "--recipe", "--ending", "to-zero"], "--ending to-zero", "drop one of the two"),
        ([*train, "--no-schedule", "--ending", "to-zero"], "--ending to-zero", "drop one of the two"),
        (["train", *m, "--data", str(good), "--plan", str(plans["quick"]), "--out", str(d / "run")],
         "is of the quick effort, which was removed", "derive it again with the race effort (the default) or full"),
        ([*train, "--ending-share", "1.5"], "--ending-share 1.5", "between 0 and 1"),
        ([*train, "--ending", "to-zero", "--ending-share", "0.5"], "--ending to-zero races none", "drop one"),
        ([*train, "--recipe", "--ending-share", "0.5"], "--ending-share 0.5", "drop one of the two"),
        (["train", *m, "--data", str(good), "--plan", str(plans["abc"]), "--out", str(d / "run")], "micro_batch is 'abc'", "whole number"),
        (["train", *m, "--data", str(good), "--plan", str(plans["neg"]), "--out", str(d / "run")], "micro_batch is -3", "whole number"),
        (["train", *m, "--data", str(good), "--plan", str(plans["lr_text"]), "--out", str(d / "run")], "lr is 'fast'", "rate above 0"),
        (["train", *m, "--data", str(good), "--plan", str(plans["v99"]), "--out", str(d / "run")], "99.0.0", "newer than this leadline"),
        (["train", *m, "--data", str(good), "--plan", str(d / "none.json"), "--out", str(d / "run")], "none.json", "does not exist"),
        (["train", *m, "--data", str(good), "--plan", str(d / "adir"), "--out", str(d / "run")], "--plan", "is a folder"),
        # run: the data, the out folder (checked first), absurd numbers, as derive's and train's
        ([*run, "--data", str(d / "missing.jsonl"), "--out", str(d / "run")], "--data", "does not exist"),
        ([*run, "--data", str(d / "adir"), "--out", str(d / "run")], "--data", "is a folder"),
        ([*run, "--data", str(d / "empty.jsonl"), "--out", str(d / "run")], "empty.jsonl", "holds no rows"),
        ([*run, "--data", str(d / "blank.jsonl"), "--out", str(d / "run")], "blank.jsonl", "holds no rows"),
        ([*run, "--data", str(d / "malformed.jsonl"), "--out", str(d / "run")], "line 2", "is not JSON"),
        ([*run, "--data", str(d / "fields.jsonl"), "--out", str(d / "run")], "line 1", "none of the known fields"),
        ([*run, "--data", str(d / "latin1.jsonl"), "--out", str(d / "run")], "line 1", "not UTF-8"),
        ([*run, "--data", str(good), "--out", str(d / "afile")], "--out", "is a file"),
        ([*run, "--data", str(good), "--out", str(d / "full")], "--out", "not empty"),
        ([*run, "--data", str(good), "--out", str(d / "no" / "run")], "--out", "does not exist"),
        ([*run, "--data", str(good), "--out", str(d / "run"), "--steps", "0"], "--steps 0", ">= 1"),
        (["run", *m, "--epochs", "-1", "--data", str(good), "--out", str(d / "run")], "--epochs -1", "above 0"),
        ([*run, "--data", str(good), "--out", str(d / "run"), "--max-seconds", "0"], "--max-seconds 0", "above 0"),
        ([*run, "--data", str(good), "--out", str(d / "run"), "--rows-per-step", "-3"], "--rows-per-step -3", ">= 1"),
        ([*run, "--data", str(good), "--out", str(d / "run"), "--rows-per-step", "16", "--step-for", "rows"],
         "--rows-per-step fixes the step", "pass one of the two"),
        ([*run, "--data", str(good), "--out", str(d / "run"), "--effort", "race", "--ending", "to-zero"],
         "--ending to-zero", "--effort full"),
        ([*run, "--data", str(good), "--out", str(d / "run"), "--effort", "race", "--ending-share", "0.5"],
         "--ending-share 0.5", "--effort full"),
        ([*run, "--data", str(good), "--out", str(d / "run"), "--effort", "quick"], "--effort quick was removed",
         "use race (the default) or full"),
        ([*run, "--data", str(good), "--out", str(d / "run"), "--seq-len", "1"], "--seq-len 1", "at least 2"),
        ([*run, "--data", str(good), "--out", str(d / "run"), "--quantile", "2"], "--quantile 2", "at most 1"),
        ([*run, "--data", str(good), "--out", str(d / "run"), "--seq-len", "100000"], "seq_len 100000", "positions"),
        (["run", "--model", str(model_dir), "--device", "cpu", "--lora-rank", "100000", "--steps", "2",
          "--data", str(good), "--out", str(d / "run")], "--lora-rank 100000", "larger than the model's width"),
        ([*run, "--data", str(good), "--out", str(d / "run"), "--device", "gpu"], "--device gpu", "cpu, cuda or cuda:N"),
        # fit
        ([*fit, "--seq-len", "1", "--batch", "2"], "--seq-len 1", "at least 2"),
        ([*fit, "--seq-len", "8", "--batch", "0"], "--batch", "positive"),
        ([*fit, "--seq-len", "100000", "--batch", "1"], "--seq-len 100000", "positions"),
        ([*fit, "--seq-len", "64", "--batch", "1000000"], "--batch 1000000", "pass --batch"),
        ([*fit, "--seq-len", "8", "--batch", "1", "--lora-rank", "100000"], "--lora-rank 100000", "larger than the model's width"),
        ([*fit, "--seq-len", "8", "--batch", "1", "--data", str(d / "adir")], "--data", "is a folder"),
        # report
        (["report", str(plans["v99"])], "99.0.0", "newer than this leadline"),
        (["report", str(d / "none.json")], "none.json", "does not exist"),
        (["report", str(plans["plan"]), "--html", str(d / "nodir" / "r.html")], "--html", "does not exist"),
        (["report", str(plans["plan"]), "--html", str(d / "adir")], "--html", "is a folder"),
        # corpus
        (["corpus", str(d / "adir")], "adir", "is a folder"),
        (["corpus", str(d / "missing.jsonl")], "missing.jsonl", "does not exist"),
        (["corpus", str(d / "malformed.jsonl")], "line 2", "is not JSON"),
    ]
    if not torch.cuda.is_available():
        cases += [
            ([*derive, "--data", str(good), "--out", str(d / "p.json"), "--device", "cuda"], "--device cuda", "--device cpu"),
            (["train", *m[:2], "--device", "cuda", "--lora-rank", "4", "--data", str(good), "--plan", str(plans["plan"]),
              "--out", str(d / "run")], "--device cuda", "--device cpu"),
            (["fit", "--model", str(model_dir), "--device", "cuda", "--seq-len", "8", "--batch", "1"], "--device cuda", "--device cpu"),
            ([*run, "--data", str(good), "--out", str(d / "run"), "--device", "cuda"], "--device cuda", "--device cpu"),
        ]
    return cases


def _flags_of(command: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return {s for a in sub.choices[command]._actions for s in a.option_strings}


def _listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_every_bad_input_is_one_sentence_exit_2_and_leaves_nothing(model_dir, inputs, capsys):
    d, _, _ = inputs
    before = _listing(d)
    failures = []
    for argv, names, fix in _cases(model_dir, inputs):
        capsys.readouterr()
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse
            rc = e.code
        except BaseException as e:  # a traceback is a failure of the test, listed with the others
            failures.append(f"{argv[0]} {names}: {type(e).__name__}: {e}")
            continue
        err = capsys.readouterr().err
        said = [line for line in err.splitlines() if line.startswith("leadline")]
        if rc != 2 or len(said) != 1 or names not in said[0] or fix not in said[0] or "Traceback" in err:
            failures.append(f"{argv[0]} {names}: rc {rc}, said {said}")
            continue
        own = re.sub(r"leadline [a-z]+ [^;)`]*", "", re.sub(r"`[^`]*`", "", said[0].partition(": ")[2]))  # not another command's
        unknown = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", own)) - _flags_of(argv[0])
        if unknown:
            failures.append(f"{argv[0]} {names}: names flags {sorted(unknown)} that `leadline {argv[0]}` does not have: {said[0]}")
    assert not failures, "\n".join(failures)
    assert _listing(d) == before  # nothing new on disk, not even a temporary file


def test_a_message_names_only_flags_its_command_has(model_dir, inputs, capsys):
    """The row messages derive shares with corpus name corpus's flags only as corpus's."""
    d, _, _ = inputs
    assert main(["derive", "--model", str(model_dir), "--device", "cpu", "--data", str(d / "fields.jsonl"),
                 "--out", str(d / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "--field" not in err and "fields=" in err
    assert main(["derive", "--model", str(model_dir), "--device", "cpu", "--data", str(d / "malformed.jsonl"),
                 "--out", str(d / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "at at" not in err and "leadline corpus" in err and "--bad-rows report" in err
