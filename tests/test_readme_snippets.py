"""The README's snippets run as written, on the tiny model: the Trainer and SFTTrainer ones
with only the documented model id, data file and run length swapped for local ones (and on the
CPU, which SFTConfig's bf16 default refuses unless told); the first Python one verbatim, on the
tiny model written as a GGUF file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import DATA, save_model_dir

pytest.importorskip("trl")
pytest.importorskip("datasets")

README = Path(__file__).resolve().parents[1] / "README.md"
HF_DOC = README.parent / "docs" / "hf.md"  # the Trainer snippet and the one-liners live there
MODEL_ID = 'model_id = "HuggingFaceTB/SmolLM2-135M-Instruct"'


def blocks() -> list[str]:
    """The python blocks of the README and docs/hf.md."""
    return [b for f in (README, HF_DOC) for b in re.findall(r"```python\n(.*?)```", f.read_text(), flags=re.S)]


def snippets() -> list[str]:
    """The python blocks of the README and docs/hf.md that set the documented model id."""
    return [b for b in blocks() if MODEL_ID in b]


def test_the_readme_has_both_snippets():
    found = snippets()
    assert len(found) == 2
    assert any("SFTTrainer(" in b for b in found) and any("Trainer(" in b and "SFTTrainer" not in b for b in found)


@pytest.mark.parametrize("kind", ["SFTTrainer", "Trainer"])
def test_snippet_runs_as_written(kind, tmp_path, monkeypatch):
    code = next(b for b in snippets() if ("SFTTrainer" in b) == (kind == "SFTTrainer"))
    model_dir = save_model_dir(tmp_path / "model")
    data = DATA / ("prompt_completion.jsonl" if kind == "SFTTrainer" else "text.jsonl")
    swaps = [(MODEL_ID, f"model_id = {str(model_dir)!r}"), ('"train.jsonl"', repr(str(data))),
             ("max_steps=300", "max_steps=8"),
             ('output_dir="out",', 'output_dir="out", use_cpu=True,')]  # SFTConfig's bf16 default needs a GPU off the CPU
    for documented, local in swaps:
        assert documented in code, documented
        code = code.replace(documented, local)
    monkeypatch.chdir(tmp_path)  # output_dir="out" lands here
    scope: dict = {}
    exec(compile(code, f"README.md ({kind} snippet)", "exec"), scope)
    trainer, callback, plan = scope["trainer"], scope["callback"], scope["plan"]
    assert trainer.state.global_step == 8
    assert plan.optimizer == "schedule_free_adamw" and callback.schedule is None  # the default effort: the race
    assert trainer.optimizer.param_groups[0]["train_mode"] is False  # the model holds the averaged weights
    assert trainer.args.learning_rate == plan.lr
    assert plan["loss_policy"].value["trainer"] == kind
    if kind == "SFTTrainer":  # the one-liners' block runs after it, on its trainer
        block = next(b for b in blocks() if "find_batch_size(trainer)" in b)
        exec(compile(block, "README.md (one-liners)", "exec"), scope)
        assert scope["found"].suggestion() >= 1 and scope["rate"].suggestion() > 0


def test_the_python_snippet_runs_as_written_on_a_gguf(tmp_path, monkeypatch):
    """The README's first Python block, verbatim, on the GGUF a newcomer has: ``my-model`` is a
    folder holding one .gguf (tests/tiny_gguf.py), ``train.jsonl`` short rows; the bare model
    trains every weight, and the plan says so. The block after it reads the plan."""
    pytest.importorskip("gguf")
    import json

    import torch

    from leadline.hf.deriving import FULL_NOTE
    from tiny_gguf import save_gguf

    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    first = next(i for i, b in enumerate(blocks) if 'load_model("my-model")' in b)
    (tmp_path / "my-model").mkdir()
    save_gguf(tmp_path / "my-model" / "smol.gguf")
    rows = [f"{a} {b} sat on the {c}" for a in ("the", "a") for b in ("cat", "dog", "fox") for c in ("mat", "net", "card", "dog")]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(blocks[first], "README.md (Python snippet)", "exec"), scope)
    plan, result = scope["plan"], scope["result"]
    assert plan.model["trained_as"] == "weights" and FULL_NOTE in plan.notes
    assert result["steps"] >= 1 and "held_out_after" in result and result["optimizer"] == "schedule_free_adamw"
    untrained = scope["load_model"]("my-model")
    assert any(not torch.equal(a, b) for a, b in zip(untrained.parameters(), scope["model"].parameters()))
    assert (tmp_path / "run" / "model.safetensors").exists()
    exec(compile(blocks[first + 1], "README.md (the plan's block)", "exec"), scope)
    assert (tmp_path / "plan.json").exists()
