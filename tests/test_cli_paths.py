"""The paths a user walks from the shell, end to end on the tiny model: derive (the default race)
then train; the adapter loaded back as PEFT users load one; what leadline changes in the rows,
said in every command's output and in the plan."""

from __future__ import annotations

import json

import pytest

from helpers import DATA, save_model_dir
from leadline import Plan
from leadline.cli import main

DATA_FILE = DATA / "prompt_completion.jsonl"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("m") / "tiny")


def _args(model_dir, data=DATA_FILE) -> list[str]:
    return ["--model", str(model_dir), "--data", str(data), "--lora-rank", "4", "--device", "cpu"]


@pytest.fixture(scope="module")
def derived_then_trained(model_dir, tmp_path_factory):
    """The README's two commands as written: `derive --out plan/`, then `train --plan plan/ --out run2/`."""
    d = tmp_path_factory.mktemp("paths")
    derived = main(["derive", *_args(model_dir), "--steps", "4", "--out", str(d / "plan")])
    return d, derived


def test_derive_then_train_on_the_default_plan_prints_the_loss_before_and_after(derived_then_trained, model_dir,
                                                                                   capsys):
    d, derived = derived_then_trained
    assert derived == 0 and (d / "plan" / "plan.json").is_file()
    capsys.readouterr()
    rc = main(["train", *_args(model_dir), "--plan", str(d / "plan"), "--out", str(d / "run2")])
    said = capsys.readouterr().out
    assert rc == 0
    res = json.loads((d / "run2" / "run.json").read_text())
    before, after = res["held_out_before"], res["held_out_after"]  # no test split: the rows the decisions read
    assert res["steps"] == 4 and len(res["curve"]) == 4
    line = next(s for s in said.splitlines() if s.startswith("held-out loss on"))
    assert f"{before['mean']:.4f} ± {before['se']:.4f} before" in line
    assert f"{after['mean']:.4f} ± {after['se']:.4f} after" in line
    assert before["mean"] != after["mean"]  # four steps at the plan's rate moved the adapter
    assert (d / "run2" / "adapter_config.json").is_file() and (d / "run2" / "plan.json").is_file()
    assert said.strip().splitlines()[-1] == f"saved to {d / 'run2'}"


def test_the_adapter_loads_with_auto_peft_from_another_folder(derived_then_trained, monkeypatch, tmp_path):
    """`base_model_name_or_path` names the model folder by its absolute path, so AutoPeft finds the
    base from any working directory (the run was given the folder as a relative path)."""
    import torch
    from peft import AutoPeftModelForCausalLM

    d, _ = derived_then_trained
    model_rel = save_model_dir(d / "relmodel")
    monkeypatch.chdir(d)
    assert main(["train", *_args("relmodel"), "--plan", "plan", "--out", "rel-run"]) == 0
    cfg = json.loads((d / "rel-run" / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == str(model_rel.resolve())
    monkeypatch.chdir(tmp_path)  # elsewhere: a relative base would not be found here
    model = AutoPeftModelForCausalLM.from_pretrained(d / "rel-run")
    ids = torch.tensor([[1, 2, 3]])
    assert model(input_ids=ids).logits.shape == (1, 3, model.config.vocab_size)
    trained = {n: p for n, p in model.named_parameters() if "lora_B" in n}
    assert trained and any(p.abs().sum() > 0 for p in trained.values())  # the trained adapter, not a fresh one


def _mixed_and_long(path, tokenizer_words: int = 3000):
    """Rows of prompt/completion, two of text, and one text row far longer than the rest."""
    rows = [json.loads(s) for s in DATA_FILE.read_text().splitlines() if s.strip()]
    rows += [{"text": "the quick brown fox jumps over the lazy dog"}] * 2
    rows.append({"text": " ".join(["packet"] * tokenizer_words)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_rows_changed_are_said_in_derive_train_and_corpus_and_kept_in_the_plan(model_dir, tmp_path, capsys):
    data = _mixed_and_long(tmp_path / "mixed.jsonl")
    assert main(["derive", *_args(model_dir, data), "--steps", "2", "--out", str(tmp_path / "plan")]) == 0
    err = capsys.readouterr().err
    plan = Plan.from_json(tmp_path / "plan" / "plan.json")
    cut = next(n for n in plan.notes if " is cut to 512, the model's positions" in n)  # the tiny model's positions
    assert cut.startswith(f"1 row of {data} ({data} line 43) has ") and "split or shorten it" in cut
    mixed = next(n for n in plan.notes if "mix formats" in n)
    assert "text 3" in mixed and "prompt/completion 40" in mixed
    assert f"leadline derive: note: {cut}" in err and f"leadline derive: note: {mixed}" in err

    assert main(["train", *_args(model_dir, data), "--plan", str(tmp_path / "plan"),
                 "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert f"leadline train: note: {cut}" in err and f"leadline train: note: {mixed}" in err
    assert json.loads((tmp_path / "run" / "run.json").read_text())["data_notes"] == [cut, mixed]

    assert main(["corpus", str(data), "--tokenizer", str(model_dir), "--seq-len", "512"]) == 0
    err = capsys.readouterr().err  # corpus knows no model: the length is --seq-len's
    assert f"leadline corpus: note: {cut.split(' and is cut')[0]} and is cut to seq_len 512: " in err
    assert f"leadline corpus: note: {mixed}" in err


def test_rows_of_one_format_within_the_length_get_no_note(model_dir, capsys):
    assert main(["corpus", str(DATA_FILE), "--tokenizer", str(model_dir)]) == 0
    assert "note:" not in capsys.readouterr().err


def test_rows_left_with_nothing_to_score_are_said():
    from leadline.corpus import data_notes, profile_corpus

    rows = [{"input_ids": list(range(1, 9))}] * 6 + [{"input_ids": list(range(1, 21)), "labels": [-100] * 18 + [19, 20]}]
    notes = data_notes(profile_corpus(rows, quantile=0.5))
    assert any("1 row of the rows given has nothing left to score at seq_len 8" in n and "left out of training" in n
               for n in notes)
    assert data_notes(profile_corpus(rows[:6])) == []


def _readme_block() -> tuple[str, str]:
    """The README's "Using what the run wrote" block, as its two halves: the folder's line, the GGUF's."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "AutoPeftModelForCausalLM" in b)
    imports, folder, gguf = block.split("\n\n")
    return f"{imports}\n{folder}", f"{imports}\n{gguf}"


def test_the_readme_loads_an_adapter_on_a_folder_and_on_a_gguf(derived_then_trained, model_dir, tmp_path,
                                                                monkeypatch):
    """Both ways the README gives, run as written with only the paths swapped: AutoPeft on a run
    whose base was a folder; the GGUF loaded with gguf_file= and PeftModel on it for a run whose
    base was a .gguf (AutoPeft cannot read one)."""
    pytest.importorskip("gguf")
    import torch

    from tiny_gguf import save_gguf

    d, _ = derived_then_trained
    folder_run = d / "readme-run"
    assert main(["train", *_args(model_dir), "--plan", str(d / "plan"), "--out", str(folder_run)]) == 0
    (tmp_path / "models").mkdir()
    gguf = save_gguf(tmp_path / "models" / "smol.gguf")
    gguf_run = tmp_path / "gguf-run"
    assert main(["run", *_args(gguf), "--steps", "2", "--out", str(gguf_run)]) == 0
    assert json.loads((gguf_run / "adapter_config.json").read_text())["base_model_name_or_path"] == str(gguf)

    first, second = _readme_block()
    monkeypatch.chdir(tmp_path)  # "models/" is here, as the README's line has it
    scope: dict = {}
    exec(compile(first.replace('"run/"', repr(str(folder_run))), "README.md (folder)", "exec"), scope)
    ids = torch.tensor([[5, 6, 7, 8]])
    assert scope["model"](input_ids=ids).logits.shape[:2] == (1, 4)
    exec(compile(second.replace('"run/"', repr(str(gguf_run))), "README.md (gguf)", "exec"), scope)
    model, base = scope["model"], scope["base"]
    with torch.no_grad():
        tuned = model(input_ids=ids).logits
        with model.disable_adapter():
            plain = model(input_ids=ids).logits
    assert not torch.allclose(tuned, plain)  # the trained adapter is on the base
    assert base.config.model_type == "llama"


def test_a_flag_that_would_change_nothing_is_refused_in_one_sentence(derived_then_trained, model_dir, tmp_path,
                                                                     capsys):
    """The default (race) plan trains schedule-free AdamW: no recipe, no look-ahead branch, no
    schedule, no ending; each flag for one of them is one sentence naming it, exit 2, nothing written."""
    d, _ = derived_then_trained
    train = ["train", *_args(model_dir), "--plan", str(d / "plan"), "--out", str(tmp_path / "run")]
    cases = [
        ([*train, "--lr", "1e-3"], "--lr sets the default recipe's run, and without --recipe"),
        ([*train, "--batch", "4"], "--batch sets the default recipe's run"),  # the flag as typed
        ([*train, "--micro-batch", "2"], "--micro-batch sets the default recipe's run"),
        ([*train, "--no-schedule"], "--no-schedule trains without the LookaheadSchedule, and the plan"),
        ([*train, "--fresh"], "--fresh chooses whether the run continues from derive's look-ahead branch"),
        ([*train, "--recipe", "--state", str(d)], "--recipe trains the default recipe from the model's weights"),
        ([*train, "--ending", "to-zero"], "it has no ending to set; leave --ending out"),
        (["derive", *_args(model_dir), "--no-state", "--out", str(tmp_path / "run")],
         "--no-state keeps no look-ahead branch beside the plan, and --effort race keeps none"),
        (["derive", *_args(model_dir), "--scale-out", "--out", str(tmp_path / "run")],
         "--scale-out reads the plan's noise scale, and the race (the default effort) measures none"),
    ]
    for argv, needle in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = [s for s in capsys.readouterr().err.splitlines() if s.startswith("leadline")]
        assert len(err) == 1 and needle in err[0], (argv, err)
        assert not (tmp_path / "run").exists()


def test_fit_requires_the_micro_batch_under_either_spelling(capsys):
    with pytest.raises(SystemExit) as e:
        main(["fit", "--seq-len", "8"])
    assert e.value.code == 2 and "--micro-batch" in capsys.readouterr().err
    from leadline.cli import build_parser

    assert build_parser().parse_args(["fit", "--seq-len", "8", "--batch", "3"]).micro_batch == 3
