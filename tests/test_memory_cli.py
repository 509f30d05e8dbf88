"""`leadline fit` on the tiny offline model, on the CPU."""

import json

import pytest

from helpers import save_model_dir
from leadline.cli import main


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("tiny") / "model")


def test_fit_accepts_and_prints_json(model_dir, capsys):
    rc = main(["fit", "--model", str(model_dir), "--full", "--seq-len", "16", "--batch", "2", "--device", "cpu", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["fits"] is True and out["verdict"] == "fits"
    assert out["trained_as"] == "full fine-tune" and out["rows"] == 2 and out["length"] == 16
    assert out["sentence"].startswith("fits: a training step of 2 rows x 16 tokens measured a peak resident set of ")
    assert out["rungs"][-1]["repeats"] == 2


def test_fit_refuses_with_one_sentence(model_dir, capsys):
    rc = main(["fit", "--model", str(model_dir), "--lora-rank", "2", "--seq-len", "16", "--batch", "2",
               "--device", "cpu", "--card-gb", "0.05", "--no-suggest"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 1 and len(lines) == 2
    assert "LoRA rank 2, 2 rows x 16 tokens on cpu" in lines[0]
    assert lines[1].startswith("refused: a training step of 2 rows x 16 tokens would peak near ")
    assert "against 50 MB of RAM room on cpu; what would fit: fewer rows, a shorter length" in lines[1]


def test_fit_bad_input_is_one_sentence_and_exit_2(model_dir, capsys):
    rc = main(["fit", "--model", str(model_dir), "--seq-len", "16", "--batch", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--batch must be a positive number" in err[0]
    with pytest.raises(SystemExit) as e:
        main(["fit", "--model", str(model_dir), "--full", "--lora-rank", "4", "--seq-len", "16", "--batch", "1"])
    assert e.value.code == 2
    rc = main(["fit", "--model", str(model_dir / "missing"), "--seq-len", "16", "--batch", "1"])
    assert rc == 2 and "does not exist" in capsys.readouterr().err


def test_importing_the_memory_package_loads_no_torch():
    import subprocess
    import sys

    code = ("import sys, leadline.memory, leadline.measure.wddm, leadline.cli.fit\n"
            "print('HEAVY', [m for m in ('torch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


def test_fit_with_data_reads_the_length_mix_and_names_a_missing_file(model_dir, tmp_path, capsys):
    rc = main(["fit", "--model", str(model_dir), "--seq-len", "16", "--batch", "1", "--data", str(tmp_path / "nope.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--data" in err[0] and "does not exist" in err[0]
    data = tmp_path / "rows.jsonl"
    data.write_text('{"text": "a b c"}\n{"text": "a b c d e f g h i j k l m n o p q r s t"}\n')
    rc = main(["fit", "--model", str(model_dir), "--full", "--seq-len", "16", "--batch", "2", "--device", "cpu",
               "--data", str(data), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["fits"]  # off CUDA the mix is not run (the RAM has no allocator to fragment)
    assert not [g for g in out["rungs"] if g["phase"] == "mix"]


def test_fit_measures_the_adapters_in_the_models_dtype_when_peft_keeps_them_in_float32(model_dir, capsys):
    rc = main(["fit", "--model", str(model_dir), "--lora-rank", "2", "--seq-len", "16", "--batch", "2", "--device", "cpu",
               "--dtype", "bfloat16", "--card-gb", "0.05", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and not out["fits"]
    alt = [a for a in out["alternatives"] if a["what"] == "adapter_dtype"]
    assert len(alt) == 1 and alt[0]["adapter_dtype"] == "bfloat16" and alt[0]["verdict"]
    assert "autocast_adapter_dtype=False" in alt[0]["text"] and "LoRA adapters in bfloat16" in out["sentence"]
    # a float32 model has no gap: nothing to measure
    rc = main(["fit", "--model", str(model_dir), "--lora-rank", "2", "--seq-len", "16", "--batch", "2", "--device", "cpu",
               "--card-gb", "0.05", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert not [a for a in out["alternatives"] if a["what"] == "adapter_dtype"]


def _saved_bytes(model, ids) -> int:
    import torch

    seen: dict = {}

    def pack(t):
        seen[(t.data_ptr(), t.dtype, tuple(t.shape))] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return sum(seen.values())


def test_float32_adapters_on_a_bfloat16_model_keep_more_for_the_backward_and_cast_back_exactly():
    import torch

    from helpers import make_model
    from leadline.memory.model_step import adapter_dtype_gap, add_lora, cast_adapters

    model = add_lora(make_model(hidden=64).to(torch.bfloat16), 4)
    assert adapter_dtype_gap(model) == (torch.float32, torch.bfloat16)
    ids = torch.randint(0, 384, (2, 64), generator=torch.Generator().manual_seed(0))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    float32_adapters = _saved_bytes(model, ids)
    restore = cast_adapters(model, torch.bfloat16)
    assert adapter_dtype_gap(model) is None
    bf16_adapters = _saved_bytes(model, ids)
    restore()
    assert bf16_adapters < 0.9 * float32_adapters, (bf16_adapters, float32_adapters)
    for n, p in model.named_parameters():
        if n in before:
            assert p.dtype == torch.float32 and torch.equal(p.detach(), before[n]) and p.grad is None
    assert adapter_dtype_gap(add_lora(make_model(), 2)) is None  # a float32 model: no gap


def test_fit_of_a_quantized_base_is_one_sentence_where_it_cannot_run(model_dir, capsys):
    base = ["fit", "--model", str(model_dir), "--seq-len", "8", "--batch", "1", "--device", "cpu"]
    assert main([*base, "--full", "--load-in-4bit"]) == 2
    assert "--load-in-4bit trains through a LoRA adapter, not --full" in capsys.readouterr().err
    assert main([*base, "--load-in-8bit"]) == 2  # no bitsandbytes here, or no CUDA: either is one sentence
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--load-in-8bit" in err
