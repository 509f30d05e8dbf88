"""A Hub id as --model: loaded as from_pretrained loads it (the Hugging Face cache, offline with
HF_HUB_OFFLINE=1), its adapter loadable by AutoPeftModelForCausalLM anywhere; an id neither
cached nor reachable is one sentence before any work. The tiny model is saved into a Hugging Face
cache of the test's own, in the hub's layout (tests/helpers.save_to_hub_cache); nothing downloads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import DATA, save_model_dir, save_to_hub_cache
from leadline import Plan, Value
from leadline.cli import main
from leadline.errors import InputError
from leadline.hf.hub import hub_id_given, is_hub_id, looks_like_path
from leadline.hf.loading import load_model, load_tokenizer, locate_model

SRC = Path(__file__).resolve().parents[1] / "src"
ROWS = DATA / "prompt_completion.jsonl"
COMMIT, V1 = "a" * 40, "b" * 40


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The tiny model as ``org/name`` (main, and ``v1`` at another commit) in a Hugging Face
    cache of the test's own, offline, as huggingface_hub reads HF_HOME and HF_HUB_OFFLINE."""
    from huggingface_hub import constants

    cache = tmp_path / "hf" / "hub"
    save_to_hub_cache(cache, "org/name", COMMIT)
    save_to_hub_cache(cache, "org/name", V1, refs=("v1",))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as PEFT reads it, at save
    return cache


def _env(hf_home: Path) -> dict[str, str]:
    """The test's environment with HF_HOME moved and HF_HUB_OFFLINE=1, as a user sets them."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    return {**env, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}


def test_an_id_is_told_from_a_path(tmp_path, monkeypatch):
    assert [is_hub_id(s) for s in ("org/name", "gpt2", "Org-1/name_2.v3")] == [True, True, True]
    assert not any(is_hub_id(s) for s in ("a/b/c", "org--x/name", "org/.name", "org/name.git", ""))
    for path in ("./org/name", "../name", "/models/name", "~/name", "name.gguf", "models/x/y", "C:\\m"):
        assert looks_like_path(path) and hub_id_given(path) is None, path
    monkeypatch.chdir(tmp_path)
    assert hub_id_given("org/name") == "org/name"
    save_model_dir(tmp_path / "org" / "name")  # a folder of that name here wins, as in from_pretrained
    assert hub_id_given("org/name") is None and locate_model("org/name").kind == "folder"


def test_a_cached_hub_id_loads_offline_at_its_revision(hub):
    import torch

    source = locate_model("org/name")
    assert (source.kind, source.load_from, source.commit) == ("hub", "org/name", COMMIT)
    assert source.record() == {"name": "org/name", "commit": COMMIT}
    assert locate_model("org/name", revision="v1").record() == {"name": "org/name", "revision": "v1", "commit": V1}
    model, tok = load_model("org/name", device="cpu"), load_tokenizer("org/name")
    assert model.name_or_path == "org/name" and tok.pad_token is not None
    again = load_model("org/name", device="cpu", revision="v1")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_an_id_not_cached_offline_is_one_sentence_naming_the_cache_and_hf_hub_offline(hub):
    with pytest.raises(InputError) as e:
        locate_model("org/missing")
    said = str(e.value)
    assert said.startswith("model org/missing is neither a folder here nor in the Hugging Face cache")
    assert str(hub) in said and "HF_HUB_OFFLINE" in said and said.count(". ") == 0
    with pytest.raises(InputError, match="model org/name at revision v9 is neither"):
        locate_model("org/name", revision="v9")  # a revision the cache does not hold


@pytest.mark.parametrize("command", ["run", "derive", "train", "fit"])
def test_a_missing_id_is_refused_before_any_work(command, hub, tmp_path, capsys, monkeypatch):
    """exit 2, one sentence, no traceback, nothing written, and no model or tokenizer read."""
    import transformers

    def never(*args, **kwargs):
        raise AssertionError("a model or tokenizer was read before the refusal")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", never)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", never)
    (tmp_path / "plan").mkdir()
    plan = Plan()  # a plan train reads: 2 rows a step, a rate, 4 steps
    plan.set("micro_batch", Value(2, "measured", "the ramp kept 2 rows", unit="rows"))
    plan.set("grad_accum", Value(1, "derived", "one micro-batch a step"))
    plan.set("lr", Value(1e-3, "measured", "the race's winner", unit="per step"))
    plan.set("total_steps", Value(4, "given", "the caller's", unit="steps"))
    plan.to_json(tmp_path / "plan" / "plan.json")
    model = ["--model", "org/missing", "--device", "cpu"]
    argv = {"run": ["run", *model, "--data", str(ROWS), "--out", str(tmp_path / "out")],
            "derive": ["derive", *model, "--data", str(ROWS), "--out", str(tmp_path / "out")],
            "train": ["train", *model, "--data", str(ROWS), "--plan", str(tmp_path / "plan"),
                      "--out", str(tmp_path / "out")],
            "fit": ["fit", *model, "--seq-len", "16", "--micro-batch", "2"]}[command]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.strip()]
    assert len(said) == 1 and said[0].startswith(f"leadline {command}: model org/missing is neither"), said
    assert str(hub) in said[0] and "HF_HUB_OFFLINE" in said[0] and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_revision_of_a_local_model_is_refused(tmp_path, capsys):
    model = save_model_dir(tmp_path / "tiny")
    capsys.readouterr()
    assert main(["run", "--model", str(model), "--revision", "v1", "--data", str(ROWS), "--device", "cpu",
                 "--out", str(tmp_path / "out")]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [f"leadline run: revision v1 picks a version of a model on the Hugging Face Hub, and {model} is "
                    "a local folder; leave the revision out"]
    assert not (tmp_path / "out").exists()


def test_a_path_that_does_not_exist_keeps_its_sentence(tmp_path, capsys):
    for given in ("./no/such", str(tmp_path / "nope"), "~/no-such-model", "no-such.gguf"):
        assert main(["run", "--model", given, "--data", str(ROWS), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert "does not exist; pass a Hugging Face folder" in err and "Hugging Face cache" not in err, err


def test_a_run_at_a_revision_records_it_in_the_plan_and_the_adapter(hub, tmp_path):
    out = tmp_path / "run"
    assert main(["run", "--model", "org/name", "--revision", "v1", "--data", str(ROWS), "--lora-rank", "4",
                 "--steps", "2", "--device", "cpu", "--out", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["model"]["name"] == "org/name" and (plan["model"]["revision"], plan["model"]["commit"]) == ("v1", V1)
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["base_model_name_or_path"], config["revision"]) == ("org/name", "v1")


def test_leadline_run_on_a_cached_hub_id_offline_trains_and_auto_peft_loads_the_adapter(tmp_path):
    """As a user runs it: HF_HOME and HF_HUB_OFFLINE=1 in the environment, `leadline run --model
    org/name`, then AutoPeftModelForCausalLM.from_pretrained("run/") from another folder, offline
    (one process for both: the command's own entry point, then PEFT)."""
    hf_home = tmp_path / "hf"
    save_to_hub_cache(hf_home / "hub", "org/name", COMMIT)
    (tmp_path / "elsewhere").mkdir()
    script = f"""
import os, sys, torch
from leadline.cli import main
rc = main(["run", "--model", "org/name", "--data", {str(ROWS)!r}, "--lora-rank", "4", "--steps", "2",
           "--device", "cpu", "--out", "run"])
assert rc == 0, rc
os.chdir("elsewhere")
from peft import AutoPeftModelForCausalLM
model = AutoPeftModelForCausalLM.from_pretrained({str(tmp_path / "run")!r})
print("loaded", model.base_model.model.name_or_path, *model(input_ids=torch.tensor([[1, 2, 3]])).logits.shape[:2])
"""
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_env(hf_home), capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "loaded org/name 1 3"
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["model"]["name"] == "org/name" and plan["model"]["commit"] == COMMIT
    config = json.loads((tmp_path / "run" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "org/name" and not config.get("revision")
    assert "Traceback" not in run.stderr and "warn" not in run.stderr.lower()


def test_leadline_run_on_a_missing_hub_id_offline_is_one_sentence(tmp_path):
    """The same from the shell with an empty cache: exit 2, one sentence naming the id, the cache
    folder and HF_HUB_OFFLINE, no traceback, no --out folder."""
    env = _env(tmp_path / "hf")
    run = subprocess.run([sys.executable, "-m", "leadline", "run", "--model", "org/missing", "--data", str(ROWS),
                          "--device", "cpu", "--out", "run"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 2
    said = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(said) == 1, said
    assert said[0].startswith("leadline run: model org/missing is neither a folder here nor in the Hugging Face "
                              f"cache ({tmp_path / 'hf' / 'hub'}), and HF_HUB_OFFLINE=1 keeps it from being downloaded")
    assert not (tmp_path / "run").exists()
