"""The README's Trainer and SFTTrainer snippets run as written, on the tiny model: the test
swaps only the documented model id, data file and run length for local ones (and runs on the
CPU, which SFTConfig's bf16 default refuses unless told)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import DATA, save_model_dir

pytest.importorskip("trl")
pytest.importorskip("datasets")

README = Path(__file__).resolve().parents[1] / "README.md"
MODEL_ID = 'model_id = "HuggingFaceTB/SmolLM2-135M-Instruct"'


def snippets() -> list[str]:
    """The python blocks of the README that set the documented model id."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return [b for b in blocks if MODEL_ID in b]


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
    assert callback.schedule is not None and callback.schedule.finished
    assert trainer.args.learning_rate == plan.lr
    assert plan["loss_policy"].value["trainer"] == kind
    if kind == "SFTTrainer":  # the one-liners' block runs after it, on its trainer
        block = next(b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
                     if "find_batch_size(trainer)" in b)
        exec(compile(block, "README.md (one-liners)", "exec"), scope)
        assert scope["found"].suggestion() >= 1 and scope["rate"].suggestion() > 0
