"""The 8B memory benchmark's stages across calls: a run cut by --deadline is recorded as far as it
got, and --resume runs only what is left (an 8B case does not fit one 10-minute call)."""

from __future__ import annotations

import json

import pytest

from helpers import load_benchmark


@pytest.fixture(scope="module")
def hfm():
    return load_benchmark("hf_models_memory")


def test_a_run_cut_by_the_deadline_is_continued_by_resume_and_only_then_judged(hfm, tmp_path, monkeypatch):
    out = tmp_path / "case.json"
    base = ["--smoke", "--bases", "bf16", "--work", str(tmp_path / "work"), "--out", str(out)]
    assert hfm.main([*base, "--deadline", "0"]) == 0  # the deadline passed before the run: no step taken
    first = json.loads(out.read_text())["cases"][0]
    assert first["run"]["steps_done"] == 0 and first["R2"].startswith("not judged yet: 0 of 5 steps")
    derived: list[int] = []
    monkeypatch.setattr(hfm, "derive_and_ramp", lambda *a, **k: derived.append(1))
    assert hfm.main([*base, "--resume"]) == 0
    case = json.loads(out.read_text())["cases"][0]
    assert derived == [] and case["derive"] == first["derive"] and case["ramp"] == first["ramp"]
    assert case["run"]["steps_done"] == 5 and case["run"]["calls"] == 2 and case["R2"] == "PASS"
    assert len(json.loads(out.read_text())["cases"]) == 1


def test_the_race_effort_records_the_default_runs_micro_batch_in_place_of_the_ramp(hfm, tmp_path):
    """--effort race: derive_for's race decides the micro-batch (off a CUDA card the whole step),
    the ramp does not run, and R1 is left to the card (the CPU reads no memory)."""
    out = tmp_path / "race.json"
    assert hfm.main(["--smoke", "--bases", "bf16", "--effort", "race", "--work", str(tmp_path / "w"),
                     "--out", str(out)]) == 0
    case = json.loads(out.read_text())["cases"][0]
    assert case["derive"]["effort"] == "race" and case["ramp"]["from"] == "the race's halving"
    assert case["ramp"]["micro_batch"] == case["ramp"]["rows_per_step"] == case["derive"]["micro_batch"]
    assert case["R1"].startswith("not judged off CUDA") and case["R2"] == "PASS"
    assert hfm.r1(4, 5, 16) == "PASS" and hfm.r1(2, 5, 16) == "FAIL"
