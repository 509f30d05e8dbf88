"""The Python blocks of the README and docs/*.md run as written, on the tiny model: docs/hf.md's
Trainer and SFTTrainer ones with only the documented model id, data file and run length swapped for
local ones (and on the CPU, which SFTConfig's bf16 default refuses unless told), docs/hf.md's
blocks after them on their trainer; the README's first Python one verbatim, on the tiny model
written as a GGUF file; the docs' API blocks with the names their page defines around them. A
block that cannot run on one CPU process is skipped with its reason, and every block is one of
those."""

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


def test_the_docs_have_both_snippets():
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
        exec(compile(block, "docs/hf.md (one-liners)", "exec"), scope)
        assert scope["found"].suggestion() >= 1 and scope["rate"].suggestion() > 0
        longer = next(b for b in blocks() if "found.run_micro_batch()" in b)  # hf.md's answers, one by one
        exec(compile(longer, "docs/hf.md (find_batch_size, find_lr)", "exec"), scope)
        assert (tmp_path / "ramp.svg").is_file()
        bare = next(b for b in blocks() if "callbacks=[LeadlineCallback(plan)]" in b)  # the callback alone
        exec(compile(bare, "docs/hf.md (LeadlineCallback(plan))", "exec"), scope)
        assert scope["trainer"].state.global_step == 8 and scope["trainer"] is not trainer


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


# Every Python block of the README and docs/*.md: run by a test here or in test_cli_paths.py, run
# below with the names its page defines around it, or skipped with the reason.

DOCS = [README, *sorted((README.parent / "docs").glob("*.md"))]


def doc_blocks() -> list[tuple[str, int, str]]:
    """(doc, line of the opening fence, code) for each python block of the README and docs/*.md."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for m in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
            found.append((str(path.relative_to(README.parent)), text[:m.start()].count("\n") + 1, m.group(1)))
    return found


COVERED = {
    ("README.md", 'AutoPeftModelForCausalLM.from_pretrained("run/")'):
        "test_cli_paths.py::test_the_readme_loads_an_adapter_on_a_folder_and_on_a_gguf",
    ("README.md", 'load_model("my-model")'): "test_the_python_snippet_runs_as_written_on_a_gguf",
    ("README.md", 'plan.to_json("plan.json")'): "test_the_python_snippet_runs_as_written_on_a_gguf",
    ("docs/hf.md", "SFTTrainer(model=model_id"): "test_snippet_runs_as_written[SFTTrainer]",
    ("docs/hf.md", "probe = Trainer(model=model"): "test_snippet_runs_as_written[Trainer]",
    ("docs/hf.md", "found = find_batch_size(trainer)  # found.suggestion()"): "test_snippet_runs_as_written[SFTTrainer]",
    ("docs/hf.md", "callbacks=[LeadlineCallback(plan)]"): "test_snippet_runs_as_written[SFTTrainer]",
    ("docs/hf.md", "found.run_micro_batch()"): "test_snippet_runs_as_written[SFTTrainer]",
}
"""A block (its doc and a line of it) and the test that runs it."""

SKIP = {
    ("docs/distributed.md", "print(scale_out(plan).table())"):
        "derive_for under torchrun, every rank: tests/test_distributed_cli.py",
    ("docs/distributed.md", "ShardedGradFn(fsdp_model"):
        "an FSDP-sharded model in a job of several processes: tests/test_distributed_job.py",
    ("docs/distributed.md", "FullyShardedDataParallel(model"):
        "an FSDP-sharded model in a job: tests/test_distributed_job.py",
}
"""A block that cannot run on one CPU process in CI, and why."""


def _memory_page(tmp_path) -> dict:
    """The names docs/memory.md's blocks use: a model (2,048 positions), its trained tensors, a
    batch of token ids, the corpus's lengths, the rows a step needs, a step at a LoRA rank."""
    import torch

    from helpers import make_model
    from leadline.memory.model_step import ModelStep

    model = make_model(positions=2048)

    def batch(rows: int, pad_to: int) -> dict:
        ids = torch.randint(1, 384, (rows, pad_to))
        return {"input_ids": ids, "labels": ids}

    def step_at_rank(rank: int) -> ModelStep:
        from peft import LoraConfig, get_peft_model

        return ModelStep(get_peft_model(make_model(positions=2048), LoraConfig(r=rank, target_modules="all-linear")))

    return {"torch": torch, "model": model, "batch": batch, "trained_params": list(model.parameters()),
            "corpus_lengths": [40, 64], "rows_the_step_needs": 4, "step_at_rank": step_at_rank,
            "train": lambda: None}


def _corpus_page(tmp_path) -> dict:
    from helpers import make_model, make_tokenizer

    tokenizer = make_tokenizer()
    return {"tokenizer": tokenizer, "model": make_model(vocab_size=len(tokenizer))}


def _measure_page(tmp_path) -> dict:
    """models/ with one .safetensors file big enough for a sweep of depths 1 and 2; model.gguf."""
    pytest.importorskip("gguf")
    from tiny_gguf import save_gguf

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "model.safetensors").write_bytes(b"\0" * (8 << 20))
    save_gguf(tmp_path / "model.gguf")
    from helpers import disk_refusal

    why = disk_refusal(tmp_path / "models" / "model.safetensors")
    if why:
        pytest.skip(f"the disk sweep cannot run here: {why}")
    return {}


def _noise_page(tmp_path) -> dict:
    """A model, its micro-batches of the tests' rows, a plan, an optimizer and the loop's numbers."""
    import torch

    from helpers import make_model, make_tokenizer
    from leadline import Plan
    from leadline.corpus import collate, tokenize_rows

    tokenizer = make_tokenizer()
    model = make_model(vocab_size=len(tokenizer))
    rows = list(tokenize_rows(DATA / "text.jsonl", tokenizer))
    micro_batches = [collate(rows[i:i + 2], tokenizer.pad_token_id) for i in range(0, len(rows), 2)]
    params = list(model.parameters())
    stream = iter(micro_batches * 4)
    return {"model": model, "micro_batches": micro_batches, "plan": Plan(), "trained_params": params, "k": 2,
            "steps": 4, "next_micro_batch": lambda: next(stream), "opt": torch.optim.AdamW(params, lr=1e-3),
            "m": 200, "t_micro": 0.02, "t_step": 0.002, "lr": 1e-3}


def _rate_page(tmp_path) -> dict:
    """The regression of tests/test_rate_toys.py: its tensors, Adam, train step and held-out reader."""
    from leadline import Plan
    from test_rate_toys import Regression

    toy = Regression(dim=32)
    return {"params": toy.params, "opt": toy.opt, "train_step": toy.train_step,
            "held_out_losses_per_row": toy.held_out, "T": 64, "plan": Plan()}


RUNS = {
    ("docs/noise.md", "KnownNoise(b_noise_tokens=20_000"): (None, []),
    ("docs/noise.md", "ModelGradFn(model, lambda i: micro_batches[i])"): (_noise_page, []),
    ("docs/noise.md", "NoiseMonitor(trained_params, grad_accum=k)"): (_noise_page, []),
    ("docs/rate.md", "measure_first_step(params, opt"): (_rate_page, []),
    ("docs/corpus.md", "profile_corpus(\"train.jsonl\", tokenizer"): (_corpus_page, [('.to("cuda")', '.to("cpu")')]),
    ("docs/measure.md", "disk_queue_depth(\"models/*.safetensors\""): (_measure_page, [
        ('r = measure_gpu(plan=Plan.from_json("plan.json"), launches_per_step=40_000)\n', ""),  # CUDA only
        ("r.trustworthy, r.verdict, r.findings", "#"),
        ("buffered=True)", "buffered=True, depths=(1, 2), block_bytes=1 << 20, bytes_per_depth=4 << 20, rounds=1)")]),
    ("docs/memory.md", "step = TrainingStep("): (_memory_page, [("length=512", "length=32")]),
    ("docs/memory.md", "result = ramp(step, 2048"): (_memory_page, [("ramp(step, 2048,", "ramp(step, 64,")]),
    ("docs/memory.md", "forbid_spill(\"cuda:0\")"): (_memory_page, [('"cuda:0"', '"cpu"')] * 4),
    ("docs/memory.md", "measure_fit(step, rows=8, length=2048"): (_memory_page, [("length=2048", "length=64")] * 2),
}
"""A block run here on the CPU: the names its page defines around it, and the swaps: a CUDA line
for the CPU's (the page says which), a length or a sweep cut to the tiny model's cost."""


def _key(doc: str, code: str) -> tuple[str, str]:
    keys = [k for k in (*COVERED, *SKIP, *RUNS) if k[0] == doc and k[1] in code]
    assert len(keys) == 1, f"{doc}: a python block matched by {len(keys)} entries, not one:\n{code[:300]}"
    return keys[0]


def test_every_python_block_of_the_docs_is_run_or_skipped_with_its_reason():
    found = [_key(doc, code) for doc, _, code in doc_blocks()]
    assert len(found) == len(set(found)) == len({**COVERED, **SKIP, **RUNS}), "an entry matches no block"


def _block(key: tuple[str, str]) -> tuple[int, str]:
    return next((line, code) for doc, line, code in doc_blocks() if doc == key[0] and key[1] in code)


@pytest.mark.parametrize("key", list(RUNS), ids=[f"{d}:{_block((d, n))[0]}" for d, n in RUNS])
def test_the_docs_python_block_runs(key, tmp_path, monkeypatch):
    page, swaps = RUNS[key]
    line, code = _block(key)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.jsonl").write_text((DATA / "prompt_completion.jsonl").read_text())
    scope = page(tmp_path) if page is not None else {}
    if key[1].startswith(("result = ramp", "measure_fit")):  # the step of the page's first block
        first = _block(("docs/memory.md", "step = TrainingStep("))[1].replace("length=512", "length=32")
        exec(compile(first, f"{key[0]}:{line}", "exec"), scope)
    for documented, local in swaps:
        assert documented in code, documented
        code = code.replace(documented, local, 1)
    exec(compile(code, f"{key[0]}:{line}", "exec"), scope)
