"""A GGUF file as a user has one: read as the plain float model it is once dequantized, trained
in full or through LoRA, and saved as a folder transformers loads (tests/tiny_gguf.py writes a
2-layer Llama with Q8_0 blocks, offline)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from helpers import make_model, make_tokenizer
from leadline.errors import InputError
from leadline.hf import derive_for, load_model, load_tokenizer
from leadline.hf.deriving import FULL_NOTE, derive_parts
from leadline.train import recipe_plan, train_with_plan

pytest.importorskip("gguf")

# short rows, so a derive on the tiny model takes seconds
ROWS = [{"text": f"{a} {b} sat on the {c}"} for a in ("the", "a") for b in ("cat", "dog", "fox")
        for c in ("mat", "net", "card", "dog")]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    from tiny_gguf import save_gguf

    return save_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rows") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask_027():
    old = os.umask(0o027)  # not the usual 022, so a mode that ignores the umask shows
    try:
        yield 0o640
    finally:
        os.umask(old)


def test_a_gguf_loads_as_the_plain_float_model_it_is(gguf_file):
    import torch

    model = load_model(gguf_file, device="cpu")
    assert not hasattr(model.config, "quantization_config") and not getattr(model, "is_quantized", False)
    assert getattr(model, "hf_quantizer", None) is None
    assert model.name_or_path == model.config.name_or_path == str(gguf_file)  # as given, not its folder
    assert all(p.dtype == torch.float32 for p in model.parameters())
    tok = load_tokenizer(gguf_file)
    assert tok("the quick brown fox").input_ids == make_tokenizer()("the quick brown fox").input_ids
    ids = torch.tensor([tok("science games net sound")["input_ids"]])
    with torch.no_grad():  # the same weights, to Q8_0's rounding: the file is the tiny model, rows in llama.cpp's order
        want = make_model(vocab_size=len(tok))(input_ids=ids).logits
        assert torch.allclose(model(input_ids=ids).logits, want, atol=0.02)


def test_the_gguf_mark_is_dropped_where_transformers_leaves_it(gguf_file, tmp_path, monkeypatch):
    """A transformers without ``GgufConfig(dequantize=True)`` marks the dequantized model
    quantized and refuses to save it; load_model takes the mark off."""
    import leadline.hf.loading as loading

    monkeypatch.setenv("LEADLINE_CACHE", str(tmp_path / "cache"))  # converted here, with the mark left on
    monkeypatch.setattr(loading, "_gguf_kwargs", lambda gguf: {"gguf_file": gguf} if gguf else {})
    model = load_model(gguf_file, device="cpu")
    assert getattr(model.config, "quantization_config", None) is None and not getattr(model, "is_quantized", False)
    model.save_pretrained(tmp_path / "saved")  # refused while the GGUF quantizer is on the model
    assert (tmp_path / "saved" / "model.safetensors").exists()


def test_a_gguf_read_by_transformers_alone_is_refused_with_the_loader_to_use(gguf_file):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    if getattr(model.config, "quantization_config", None) is None:
        pytest.skip("this transformers leaves a GGUF unmarked")
    with pytest.raises(InputError, match=r"load it with leadline\.hf\.load_model\(path\), which drops the mark"):
        derive_for(model, make_tokenizer(), ROWS, progress=False)


def test_a_full_fine_tune_of_a_gguf_trains_and_saves_a_folder_transformers_loads(gguf_file, tmp_path, umask_027):
    import torch
    from transformers import AutoModelForCausalLM

    model, tok = load_model(gguf_file, device="cpu"), load_tokenizer(gguf_file)
    before = [p.detach().clone() for p in model.parameters()]
    # the rate phases alone at a given step (the CLI test below runs a whole derive): the same checks, seconds
    plan = derive_parts(model, tok, ROWS, measure=("rate",), batch=(2, 1), total_steps=4, progress=False)
    assert plan.model["trained_as"] == "weights" and plan.model["trained_parameters"] == plan.model["parameters"]
    assert FULL_NOTE in plan.notes and plan["precision"].value["quantization"] is None
    result = train_with_plan(model, tok, ROWS, plan, out_dir=tmp_path / "run")
    assert result["steps"] == 4
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # every weight could move
    saved = {p.name: _mode(p) for p in (tmp_path / "run").iterdir()}
    assert {"config.json", "model.safetensors", "run.json"} <= set(saved)
    assert set(saved.values()) == {umask_027}  # the weights as readable as the config beside them
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "run")
    assert not hasattr(again.config, "quantization_config")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_a_lora_adapter_over_a_gguf_names_its_base_and_keeps_the_umask(gguf_file, tmp_path, umask_027):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(load_model(gguf_file, device="cpu"),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    train_with_plan(model, load_tokenizer(gguf_file), ROWS, recipe_plan(rows_per_step=4, total_steps=2),
                    out_dir=tmp_path / "run")
    config = json.loads((tmp_path / "run" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(gguf_file)
    assert {_mode(p) for p in (tmp_path / "run").iterdir()} == {umask_027}


def test_full_from_the_shell_trains_a_gguf(gguf_file, rows_file, tmp_path):
    from leadline.cli import main

    out = tmp_path / "run"
    assert main(["run", "--model", str(gguf_file), "--data", str(rows_file), "--full", "--effort", "full",
                 "--steps", "4", "--device", "cpu", "--out", str(out)]) == 0
    assert json.loads((out / "run.json").read_text())["steps"] == 4
    assert (out / "model.safetensors").exists() and not (out / "adapter_config.json").exists()
    assert FULL_NOTE in json.loads((out / "plan.json").read_text())["notes"]
