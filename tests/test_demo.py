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


def _lora(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM"))


def test_the_demo_judges_four_arms_by_accuracy_on_the_same_test_rows(tokenizer, tmp_path):
    from leadline.cli.demo import TRAINING_NUMBERS, Cut, DemoRows, header, run_demo

    model = _lora(make_model(vocab_size=len(tokenizer)))
    start = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    lines: list[str] = []
    # rows the tiny tokenizer was trained on, four sections: the tiny model learns them
    rows = read_jsonl(DATA / "prompt_completion.jsonl")
    cut = Cut(train_rows=30, test_rows=None, description_chars=40)
    rec = run_demo(model, tokenizer, DemoRows(rows[:30], rows[30:], cut), tmp_path, say=lines.append, progress=False,
                   model_name="tiny + LoRA r4")

    assert {"plan.json", "report.html", "demo.json", "train.jsonl", "leadline_run", "recipe_run"} <= {
        p.name for p in tmp_path.iterdir()}
    assert json.loads((tmp_path / "demo.json").read_text()) == json.loads(json.dumps(rec, default=str))
    assert json.loads((tmp_path / "plan.json").read_text())["model"]["name"] == "tiny + LoRA r4"
    assert rec["labels"] == [" games", " net", " science", " sound"]
    for name in ("micro_batch", "grad_accum", "total_steps"):
        assert rec["numbers"][name]["kind"] in ("measured", "derived"), (name, rec["numbers"][name])
    plan = json.loads((tmp_path / "plan.json").read_text())["values"]  # a run too short to race keeps the default
    assert plan["lr"]["kind"] == "measured" or "too short to race" in plan["lr"]["source"]
    assert list(rec["numbers"]) == [n for n in TRAINING_NUMBERS if n in rec["numbers"]]
    arms = rec["arms"]
    schedule_free = "schedule_free" in arms
    assert list(arms) == ["untrained", "leadline", "recipe"] + (["schedule_free"] if schedule_free else [])
    # the ten test rows, every one judged by every arm; the header's count is the verdict's
    assert rec["rows"] == 10 and all(a["rows"] == 10 for a in arms.values())
    assert "30 of its 30 training rows and 10 of its 10 test rows" in header("the CPU", cut, rows[:30], rows[30:])
    assert all(a["accuracy"] == a["right"] / 10 for a in arms.values())
    assert arms["leadline"]["steps"] >= 1 and arms["recipe"]["steps"] >= 1
    assert arms["leadline"]["derive_seconds"] > 0 and arms["recipe"]["derive_seconds"] == 0
    lead, recipe = arms["leadline"], arms["recipe"]
    assert rec["leadline_time_over_recipe"] == pytest.approx(
        (lead["derive_seconds"] + lead["train_seconds"]) / recipe["train_seconds"])
    text = "\n".join(lines)
    assert "test accuracy on 10 rows" in text
    for label in ("untrained", "leadline", "recipe"):
        assert any(s.strip().startswith(f"{label} ") and "of 10)" in s for s in lines), label
    assert f"leadline {rec['leadline_time_over_recipe']:.1f}x the recipe's time" in text
    m = rec["mcnemar"]["recipe"]
    assert f"leadline against recipe: {m['b']} rows only leadline got right, {m['c']} only recipe" in text
    if schedule_free:
        assert any(s.strip().startswith("schedule-free ") and "of 10)" in s for s in lines)
        assert "leadline against schedule-free:" in text and "read at its averaged weights" in text
    else:
        assert "schedule-free AdamW: skipped, the package schedulefree is not importable" in text
    # every arm started from the weights given, and the demo leaves them as it found them
    assert all((p.detach() == s).all() for p, s in zip((p for p in model.parameters() if p.requires_grad), start))


def test_classify_answers_the_label_the_model_scores_highest(tokenizer):
    import torch

    from leadline.cli.demo import classify

    class Favours(torch.nn.Module):
        """Logits that favour one token everywhere, and the end of text after it."""

        def __init__(self, token: int):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.zeros(len(tokenizer)))
            with torch.no_grad():
                self.bias[token] = 5.0
                self.bias[tokenizer.eos_token_id] = 4.0

        def forward(self, input_ids, attention_mask=None):
            from types import SimpleNamespace

            return SimpleNamespace(logits=self.bias.expand(*input_ids.shape, -1))

    labels = [" games", " net", " science", " sound"]
    rows = read_jsonl(DATA / "prompt_completion.jsonl")[:5]
    for label in labels:
        token = tokenizer(label, add_special_tokens=False)["input_ids"][-1]
        assert classify(Favours(token), tokenizer, rows, labels, batch=3) == [label] * 5


def test_the_schedule_free_arm_is_one_skipped_line_without_its_package(tokenizer, tmp_path, monkeypatch):
    import builtins

    from leadline.cli import demo

    real_import = builtins.__import__

    def no_schedulefree(name, *a, **k):
        if name == "schedulefree":
            raise ImportError("No module named 'schedulefree'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_schedulefree)
    run, why = demo._schedule_free_arm(None, tokenizer, tmp_path / "train.jsonl", None)
    assert run is None and "schedulefree is not importable" in why and "pip install schedulefree" in why


def test_the_cpu_cut_gives_the_recipe_twenty_steps(tokenizer):
    from importlib import resources

    from leadline.cli.demo import CPU_CUT, RECIPE, shorten
    from leadline.run.task import prepare

    def recipe_steps(rows):  # one pass at the recipe's rows a step over every row given, not trained
        task, _ = prepare(make_model(vocab_size=len(tokenizer)), tokenizer, rows, seed=0, held_out=0, test=0)
        return max(1, len(task.order) // RECIPE["rows_per_step"])

    data = resources.files("leadline") / "data" / "debian_sections_demo_train.jsonl"
    rows = [json.loads(s) for s in data.read_text().splitlines() if s.strip()]
    assert len(rows) >= CPU_CUT.train_rows
    train = [shorten(r, CPU_CUT.description_chars) for r in rows[: CPU_CUT.train_rows]]
    assert RECIPE["rows_per_step"] == 16
    assert recipe_steps(train) >= 20
    assert recipe_steps(train[:-20]) < 20  # no row to spare


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


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_cached_judge_gives_the_whole_reads_sums_with_an_adapter_and_labels_of_several_tokens(tokenizer,
                                                                                                   monkeypatch, device):
    """The prompt read once and its labels from the cache: the same log-probabilities as reading
    every prompt + label whole, on prompts of different lengths (padded on the left) and labels of
    one and several tokens, through a LoRA adapter, on the CPU and on a GPU; classify takes that
    route for a transformers model."""
    import torch
    from peft import LoraConfig, get_peft_model

    from leadline.cli import demo

    torch.manual_seed(0)
    model = get_peft_model(make_model(vocab_size=len(tokenizer)),
                           LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)).to(device)
    model.eval()
    rows = read_jsonl(DATA / "prompt_completion.jsonl")[:7]
    labels = [" games", " net", " science fiction and fantasy", " sound"]
    assert {len(tokenizer(lab, add_special_tokens=False)["input_ids"]) for lab in labels} != {1}
    eos = tokenizer.eos_token_id
    seqs = []
    for r in rows:
        start = len(tokenizer(r["prompt"], add_special_tokens=True)["input_ids"])
        seqs += [([*tokenizer(r["prompt"] + lab, add_special_tokens=True)["input_ids"], eos], start)
                 for lab in labels]
    assert len({start for _, start in seqs}) > 1
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    whole = demo._scores_whole(model, seqs, len(labels), pad, 32)
    cached = demo._scores_cached(model, seqs, len(labels), pad, 8)
    assert torch.allclose(torch.tensor(cached), torch.tensor(whole), atol=1e-4)
    called, real = [], demo._scores_cached
    monkeypatch.setattr(demo, "_scores_cached", lambda *a: called.append(1) or real(*a))
    answers = demo.classify(model, tokenizer, rows, labels)
    best = [labels[max(range(4), key=lambda x: whole[4 * i + x])] for i in range(len(rows))]
    assert called and answers == best
