"""``torchrun --nproc-per-node 2 -m leadline derive``: both ranks derive, rank 0 writes and
prints, the scale-out table comes out once."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from helpers import DATA, save_model_dir


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_derive_under_torchrun_writes_once_and_prints_the_scale_out(tmp_path):
    model = save_model_dir(tmp_path / "model")
    out = tmp_path / "plan.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port()),
           "-m", "leadline", "derive", "--model", str(model), "--data", str(DATA / "prompt_completion.jsonl"),
           "--steps", "12", "--device", "cpu", "--out", str(out), "--scale-out"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail("torchrun -m leadline derive did not finish within 120 s: a collective hung")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(f"wrote {out}") == 1, "only rank 0 writes and prints"
    assert done.stdout.count("scale-out: B_noise") == 1 and "data parallelism pays up to" in done.stdout
    plan = json.loads(out.read_text())
    assert plan["values"]["world_size"]["value"] == 2
    assert plan["machine"]["world"]["world_size"] == 2
    assert plan["values"]["noise_scale_tokens"]["evidence"]["via"] == "ddp_hook"
    assert not list(tmp_path.glob("*.tmp*")), "nothing half-written"
