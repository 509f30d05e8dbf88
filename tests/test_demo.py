"""The demo's whole job on the tiny model: derive, both runs from the same start, the verdict
on test rows no decision used, and what it writes."""

from __future__ import annotations

import json

import pytest

from helpers import DATA, make_model, read_jsonl

pytest.importorskip("peft")


def test_shorten_cuts_the_description_at_a_word_and_keeps_the_question():
    from leadline.cli.demo import shorten

    row = {
        "prompt": "Package description: one two three four five\nDebian section (games, net, science or sound):",
        "completion": " net",
    }
    cut = shorten(row, 12)
    assert cut["prompt"] == "Package description: one two\nDebian section (games, net, science or sound):"
    assert cut["completion"] == " net"
    assert shorten(row, None) == row and shorten(row, 500) == row


def test_the_demo_derives_trains_both_and_reads_the_test_rows(tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model

    from leadline.cli.demo import TRAINING_NUMBERS, Cut, run_demo

    model = get_peft_model(
        make_model(vocab_size=len(tokenizer)),
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM"),
    )
    start = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    lines: list[str] = []
    # rows the tiny tokenizer was trained on: the tiny model learns them
    rows = read_jsonl(DATA / "prompt_completion.jsonl")
    cut = Cut(train_rows=30, test_rows=None, description_chars=40, max_seconds=None, effort="quick")
    rec = run_demo(model, tokenizer, rows[:30], rows[30:], tmp_path, cut, say=lines.append, progress=False,
                   model_name="tiny + LoRA r4")

    assert {"plan.json", "report.html", "demo.json", "plan_run", "recipe_run"} <= {p.name for p in tmp_path.iterdir()}
    assert json.loads((tmp_path / "demo.json").read_text()) == json.loads(json.dumps(rec))
    assert json.loads((tmp_path / "plan.json").read_text())["model"]["name"] == "tiny + LoRA r4"
    # every number that drives training is measured or derived, the rate and ending raced in the run
    for name in ("micro_batch", "grad_accum", "tokens_per_step", "lr", "warmup_steps", "total_steps", "ending"):
        assert rec["numbers"][name]["kind"] in ("measured", "derived"), (name, rec["numbers"][name])
    assert rec["numbers"]["lr"]["kind"] == "measured" and rec["numbers"]["ending"]["kind"] == "measured"
    assert list(rec["numbers"]) == [n for n in TRAINING_NUMBERS if n in rec["numbers"]]
    assert rec["runs"]["plan"]["steps"] >= 2 and rec["runs"]["recipe"]["steps"] >= 1
    t = rec["test"]
    assert (
        t["rows"] == t["plan_minus_recipe"]["n"] and 8 <= t["rows"] <= 10
    )  # rows longer than the plan's length are left out
    assert t["plan_minus_recipe"]["mean"] == pytest.approx(t["plan"][0] - t["recipe"][0], abs=1e-9)
    assert t["plan"][0] != t["before"][0]  # the plan trained
    text = "\n".join(lines)
    assert "trained with the plan" in text and "trained with the default recipe" in text and "plan - recipe" in text
    steps = rec["runs"]["plan"]["steps"], rec["runs"]["recipe"]["steps"]
    assert f", {steps[0]} steps; the recipe at 16 rows a step, {steps[1]} step" in text and "noise scale" in text
    # the demo ends with the plan's trained weights; both runs started from the same ones
    assert any(not (p.detach() == s).all() for p, s in zip((p for p in model.parameters() if p.requires_grad), start))


def test_too_few_rows_is_one_sentence_and_exit_2(tmp_path, capsys):
    from leadline.cli import main

    assert main(["demo", "--rows", "5", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--rows 5" in err[0] and "16" in err[0]
    assert not (tmp_path / "d").exists()


def test_the_quiet_loading_puts_the_bars_and_warnings_back_after_an_error():
    import importlib
    import warnings

    from transformers.utils import logging as hf_logging

    from leadline.cli.demo import _quiet_loading

    gguf = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    bar, filters, enabled = gguf.tqdm, list(warnings.filters), hf_logging.is_progress_bar_enabled()
    with pytest.raises(RuntimeError), _quiet_loading():
        assert gguf.tqdm is not bar and not hf_logging.is_progress_bar_enabled()
        assert list(gguf.tqdm([1, 2])) == [1, 2]
        raise RuntimeError("a load that fails")
    assert gguf.tqdm is bar and warnings.filters == filters and hf_logging.is_progress_bar_enabled() == enabled


def test_the_threads_are_measured_and_put_back_after_an_error(capsys, monkeypatch):
    import torch

    from helpers import FakeClock, install_clock
    from leadline.cli.demo import _faster_threads, thread_rates

    install_clock(monkeypatch, FakeClock(tick=0.01))  # a few products a thread count however busy the machine
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    rates = thread_rates(2, seconds=0.05)
    assert set(rates) == {2, 1} and all(r > 0 for r in rates.values())
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError), _faster_threads(on_gpu=False):
        assert torch.get_num_threads() in (1, 2)
        raise RuntimeError("a demo that fails")
    assert torch.get_num_threads() == 2 and "torch threads:" in capsys.readouterr().out
    torch.set_num_threads(before)
