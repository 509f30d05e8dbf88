"""benchmarks/determinism_probe.py: its rules D1-D3 on made-up units, and each arm's process as
the script starts it (on the GPU it runs on the device)."""

from __future__ import annotations

import doctest
import subprocess
import sys

import pytest

from helpers import load_benchmark


@pytest.fixture(scope="module")
def dp():
    load_benchmark("scoreboard")
    return load_benchmark("determinism_probe")


def test_the_examples_run(dp):
    result = doctest.testmod(dp)
    assert result.attempted > 0 and result.failed == 0


def _units(shas: dict[str, tuple[str, str]], walls: dict[str, float], exits: int = 0) -> dict:
    return {f"{a}_{k}": {"exit": exits, "sha256": shas[a][k], "wall": walls[a]} for a in shas for k in (0, 1)}


def test_a_deterministic_arm_over_the_cost_bar_or_a_failed_run_is_not_taken(dp):
    shas = {"plain": ("x", "y"), "det_strict": ("z", "z"), "math_sdpa": ("m", "m")}
    d = dp.decide(_units(shas, {"plain": 10.0, "det_strict": 11.5, "math_sdpa": 10.8}), list(shas))
    assert d["plain"]["deterministic"] is False and d["det_strict"]["cost"] == 1.15
    assert d["default"] == "math_sdpa"  # det_strict is deterministic but costs over 1.10x
    d = dp.decide(_units(shas, {"plain": 10.0, "det_strict": 10.1, "math_sdpa": 10.1}, exits=1), list(shas))
    assert d["default"] is None and not d["det_strict"]["deterministic"]  # exit 1: not finished


def test_each_arm_runs_leadline_run_with_its_prelude(dp, tmp_path):
    args = type("A", (), {"model": "m", "data": "d.jsonl", "seed": 0, "steps": 5})()
    for arm in dp.PRELUDE:
        cmd = dp.command(arm, args, tmp_path / arm)
        assert cmd[cmd.index("run"):] == ["run", "--model", "m", "--data", "d.jsonl", "--seed", "0", "--steps", "5",
                                          "--out", str(tmp_path / arm)]
        compile(cmd[2], arm, "exec")  # the prelude and the entry point are Python that parses
    probe = subprocess.run([sys.executable, "-c", dp.PRELUDE["det_strict"] + "print(torch.are_deterministic_algorithms_enabled())"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "True"
    subprocess.run([sys.executable, "-c", dp.PRELUDE["math_sdpa"] + "import torch.nn.functional as F; "
                    "q = torch.ones(1, 1, 2, 4); F.scaled_dot_product_attention(q, q, q)"], check=True)


def test_without_data_it_writes_the_guarded_runs_rows_from_the_data_folder(dp, tmp_path, monkeypatch, tokenizer):
    """--data-dir: the Debian sections rows, each description cut to its first 256 tokens, then the question."""
    import json

    import leadline.hf

    load_benchmark("guarded_run")
    monkeypatch.setattr(leadline.hf, "load_tokenizer", lambda _model: tokenizer)
    rows = [{"text": "word " * (400 if i == 0 else 3), "label": "net"} for i in range(5)]
    for split in ("train", "test"):
        (tmp_path / f"debian_sections_{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = dp.guarded_rows(tmp_path, "m", tmp_path / "train.jsonl")
    written = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(written) == 5
    assert all(r["completion"] == " net" and r["prompt"].endswith("\nSection:") for r in written)
    assert len(written[0]["prompt"]) < len(rows[0]["text"]) and written[1]["prompt"].startswith("word word word")


def test_a_run_that_fails_carries_its_logs_tail_into_the_result(dp, tmp_path, monkeypatch):
    """A unit whose process exits with neither 0 nor 3 keeps the end of its log, so the result says why."""
    import json

    def fake(arm, args, out):
        code = f"import sys; print('the machine ran out of memory'); sys.exit({2 if arm == 'plain' else 0})"
        return [sys.executable, "-c", code]

    monkeypatch.setattr(dp, "command", fake)
    (tmp_path / "rows.jsonl").write_text("")
    out = tmp_path / "result.json"
    assert dp.main(["--data", str(tmp_path / "rows.jsonl"), "--arms", "plain,det_warn", "--work", str(tmp_path / "w"),
                    "--out", str(out)]) == 0
    units = json.loads(out.read_text())["units"]
    assert units["plain_0"]["exit"] == 2 and "ran out of memory" in units["plain_0"]["log_tail"]
    assert "log_tail" not in units["det_warn_0"]
