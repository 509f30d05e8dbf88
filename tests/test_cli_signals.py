"""SIGTERM (`timeout`, a scheduler, a container's stop) takes the Ctrl-C path: one sentence, exit
143, and the output folder the command made taken back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import DATA, save_model_dir
from leadline.cli import EXIT_INTERRUPTED, EXIT_TERMINATED, main
from leadline.cli._common import OutFolder

SRC = Path(__file__).resolve().parents[1] / "src"


def _stall_after_writing(out: Path, sig: int):
    """A command's run() that writes into its --out, then is sent ``sig`` and waits for it."""

    def run(args):
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "adapter_model.safetensors").write_bytes(b"half")
        # raised in this (the main) thread: a process-directed kill can land on a thread an earlier test left
        # running, where it leaves the main thread's sleep uninterrupted
        signal.raise_signal(sig)
        time.sleep(30)  # the signal lands before here
        raise AssertionError("the signal did not interrupt the command")

    return run


@pytest.mark.parametrize("sig, code, said", [(signal.SIGTERM, EXIT_TERMINATED, "terminated (SIGTERM)"),
                                             (signal.SIGINT, EXIT_INTERRUPTED, "interrupted")])
def test_a_signal_mid_command_takes_back_the_folder_it_made(tmp_path, monkeypatch, capsys, sig, code, said):
    import leadline.cli.train as train

    out = tmp_path / "new" / "run"  # its parent made by the command too
    monkeypatch.setattr(train, "run", _stall_after_writing(out, sig))
    before = signal.getsignal(signal.SIGTERM)
    rc = main(["train", "--model", "m", "--data", "d", "--plan", "p", "--out", str(out)])
    assert rc == code
    assert capsys.readouterr().err == f"leadline train: {said}; nothing half-written was kept.\n"
    assert not (tmp_path / "new").exists()
    assert signal.getsignal(signal.SIGTERM) is before  # the handler put back


def test_an_empty_folder_given_is_emptied_and_a_full_one_left(tmp_path):
    empty, full = tmp_path / "empty", tmp_path / "full"
    empty.mkdir()
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    kept = [OutFolder.before(empty), OutFolder.before(full)]
    for d in (empty, full):
        (d / "run.json").write_text("{}")
        (d / "plan.state").mkdir()
    for k in kept:
        k.take_back()
    assert empty.is_dir() and not any(empty.iterdir())
    assert {p.name for p in full.iterdir()} == {"notes.txt", "run.json", "plan.state"}


def test_sigterm_to_a_training_run_leaves_no_folder(tmp_path):
    """`leadline run` in its own process, sent SIGTERM once its first step is printed (a marker,
    not a fixed wait: the machine may be busy); it exits 143 with the sentence, no traceback, and
    the --out it made is gone."""
    model = save_model_dir(tmp_path / "tiny")
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "leadline", "run", "--model", str(model), "--data",
           str(DATA / "prompt_completion.jsonl"), "--lora-rank", "4", "--device", "cpu", "--steps", "100",
           "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    watchdog = threading.Timer(600, proc.kill)  # a hung process fails the test instead of the suite
    watchdog.start()
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("step "):  # training has begun: the folder is there, half-written
                assert out.is_dir()
                proc.send_signal(signal.SIGTERM)
                break
        else:
            pytest.fail("the run ended before its first step line:\n" + "".join(seen))
        rest, _ = proc.communicate(timeout=300)
    finally:
        watchdog.cancel()
    said = "".join(seen) + rest
    assert proc.returncode == EXIT_TERMINATED, said
    assert "leadline run: terminated (SIGTERM); nothing half-written was kept." in said
    assert "Traceback" not in said
    assert not out.exists()
