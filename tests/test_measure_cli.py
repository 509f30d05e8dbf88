"""The gpu / disk / quant commands: bad input is one sentence and exit 2; output and --json."""

import json
import subprocess
import sys

import pytest

from leadline.cli import main


def test_import_measure_loads_no_torch():
    code = (
        "import sys, leadline.measure, leadline.measure.disk, leadline.measure.virt, leadline.measure.gpu, leadline.measure.quant\n"
        "from leadline.measure import disk_queue_depth, virtualisation\n"
        "print('HEAVY', [m for m in ('torch', 'numpy', 'gguf', 'safetensors') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


def _one_sentence(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for n in needles:
        assert n in err[0]
    return err[0]


def test_missing_files_are_one_sentence_exit_2(tmp_path, capsys):
    _one_sentence(capsys, ["disk", str(tmp_path / "nope.bin")], "leadline disk:", "does not exist")
    _one_sentence(capsys, ["quant", str(tmp_path / "nope.gguf")], "leadline quant:", "does not exist")
    _one_sentence(capsys, ["gpu", "--plan", str(tmp_path / "nope.json")], "leadline gpu:", "does not exist")
    _one_sentence(capsys, ["disk", str(tmp_path), "--depths", "1,x"], "--depths")
    _one_sentence(capsys, ["quant", str(tmp_path), "--layers", "a,b"], "--layers")


def test_gpu_without_cuda_reports_virtualisation_then_one_sentence(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["gpu", "--json"]) == 2
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    assert out["cuda"] is None and "readings" in out["virtualisation"]
    assert len(cap.err.strip().splitlines()) == 1 and "no CUDA device" in cap.err


def test_quant_prints_the_table_and_json(tmp_path, capsys):
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    save_file(
        {
            "model.layers.0.self_attn.q_proj.weight": torch.randn(64, 64, generator=g),
            "model.layers.0.mlp.up_proj.weight": torch.randn(128, 64, generator=g),
            "model.embed_tokens.weight": torch.randn(10, 64, generator=g),
        },
        str(tmp_path / "m.safetensors"),
    )
    assert main(["quant", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[1].split()[:3] == ["family", "share", "of"]
    assert "q " in text and "uniform" in text
    assert main(["quant", str(tmp_path / "m.safetensors"), "--json", "--layers", "all"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [f["family"] for f in d["families"]] == ["q", "up", "embeddings"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="O_DIRECT is Linux's")
def test_disk_prints_the_sweep_and_the_buffered_arm(tmp_path, capsys):
    from leadline.measure.disk import MEMORY_FILESYSTEMS, filesystem_of

    if filesystem_of(tmp_path) in MEMORY_FILESYSTEMS:
        pytest.skip(f"{tmp_path} is in memory")
    path = tmp_path / "d.bin"
    path.write_bytes(b"\1" * (8 << 20))
    argv = ["disk", str(path), "--depths", "1,2", "--block-mib", "1", "--mib-per-depth", "4", "--buffered"]
    rc = main(argv)
    cap = capsys.readouterr()
    if rc == 2 and "refuses O_DIRECT" in cap.err:
        pytest.skip(cap.err.strip())
    assert rc == 0
    assert "QD1" in cap.out and "buffered MB/s (page cache, not the disk)" in cap.out and "optimum: QD" in cap.out
    assert "leadline disk: O_DIRECT round 1/3 QD1:" in cap.err  # progress
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["bypass"] == "O_DIRECT" and [r["depth"] for r in d["rows"]] == [1, 2] and len(d["buffered_rows"]) == 2
