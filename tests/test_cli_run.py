"""leadline derive and leadline train from the shell, on the tiny model saved as a folder."""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest

from helpers import DATA, save_model_dir
from leadline import Plan
from leadline.cli import main


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("m") / "tiny")


@pytest.fixture(scope="module")
def derived(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    rc = main(["derive", "--model", str(model_dir), "--data", str(DATA / "prompt_completion.jsonl"), "--lora-rank", "4",
               "--steps", "6", "--effort", "full", "--out", str(out), "--html", str(out.with_suffix(".html")), "--device", "cpu"])
    return rc, out


def test_derive_writes_a_plan_and_report(derived, capsys):
    rc, out = derived
    assert rc == 0
    plan = Plan.from_json(out)
    assert plan.total_steps == 6 and plan.micro_batch >= 1 and "lr" in plan
    assert out.with_suffix(".html").read_text().startswith("<!DOCTYPE html>")


def test_train_with_the_plan_saves_the_adapter_and_the_curve(derived, model_dir, tmp_path):
    _, plan_path = derived
    run = tmp_path / "run"
    rc = main(["train", "--model", str(model_dir), "--data", str(DATA / "prompt_completion.jsonl"), "--lora-rank", "4",
               "--plan", str(plan_path), "--out", str(run), "--device", "cpu"])
    assert rc == 0
    res = json.loads((run / "run.json").read_text())
    assert res["steps"] == 6 and len(res["curve"]) == 6 and res["schedule"]["checks"]
    assert (run / "adapter_config.json").exists()
    assert "test_loss_after" in res


def test_recipe_arm_runs_by_the_same_path(derived, model_dir, tmp_path):
    _, plan_path = derived
    run = tmp_path / "recipe"
    rc = main(["train", "--model", str(model_dir), "--data", str(DATA / "prompt_completion.jsonl"), "--lora-rank", "4",
               "--plan", str(plan_path), "--out", str(run), "--device", "cpu", "--recipe", "--batch", "4", "--steps", "5"])
    assert rc == 0
    curve = json.loads((run / "run.json").read_text())["curve"]
    lrs = [c["lr"] for c in curve]
    assert lrs[0] == pytest.approx(2e-4) and lrs[-1] < lrs[0]  # warmup of one step, then linear decay


def test_the_recipe_on_a_small_card_accumulates_the_micro_batch_it_is_given(derived, model_dir, tmp_path, capsys):
    _, plan_path = derived
    args = ["train", "--model", str(model_dir), "--data", str(DATA / "prompt_completion.jsonl"), "--lora-rank", "4",
            "--plan", str(plan_path), "--device", "cpu", "--recipe", "--batch", "4", "--steps", "2"]
    assert main([*args, "--micro-batch", "3", "--out", str(tmp_path / "bad")]) == 2
    assert "--micro-batch 3 must divide --batch 4" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    assert main([*args, "--micro-batch", "2", "--out", str(tmp_path / "acc")]) == 0
    run = json.loads((tmp_path / "acc" / "run.json").read_text())
    assert (run["micro_batch"], run["grad_accum"], run["steps"]) == (2, 2, 2)


def test_bad_input_is_one_sentence_exit_2(derived, model_dir, tmp_path, capsys):
    _, plan_path = derived
    other = tmp_path / "other.jsonl"
    shutil.copy(DATA / "prompt_completion.jsonl", other)
    with other.open("a") as f:
        f.write(json.dumps({"prompt": "x", "completion": " y"}) + "\n")
    args = ["--model", str(model_dir), "--lora-rank", "4", "--device", "cpu"]
    cases = [
        (["derive", *args, "--data", str(DATA / "prompt_completion.jsonl"), "--steps", "0", "--out", str(tmp_path / "p.json")], "--steps 0"),
        (["derive", *args, "--data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "p.json")], "does not exist"),
        (["derive", "--model", str(tmp_path / "nomodel"), "--data", str(DATA / "text.jsonl"), "--out", str(tmp_path / "p.json")], "does not exist"),
        (["derive", "--model", str(model_dir), "--full", "--fit-rank", "--device", "cpu", "--data", str(DATA / "prompt_completion.jsonl"),
          "--out", str(tmp_path / "p.json")], "--fit-rank measures a LoRA rank"),
        (["train", *args, "--data", str(other), "--plan", str(plan_path), "--out", str(tmp_path / "r")], "other data"),
        (["train", "--model", str(model_dir), "--lora-rank", "8", "--device", "cpu", "--data", str(DATA / "prompt_completion.jsonl"),
          "--plan", str(plan_path), "--out", str(tmp_path / "r2")], "trained parameters"),
        (["train", *args, "--data", str(DATA / "prompt_completion.jsonl"), "--plan", str(plan_path), "--out",
          str(tmp_path / "r3"), "--state", str(tmp_path)], "is not a state leadline derive wrote"),
        (["train", *args, "--data", str(DATA / "prompt_completion.jsonl"), "--plan", str(plan_path), "--out",
          str(tmp_path / "r4"), "--state", str(tmp_path), "--fresh"], "drop one of them"),
    ]
    for argv, needle in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("leadline")]
        assert len(err) == 1 and needle in err[0], err  # one sentence (a loader's progress bar may precede it)
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "r").exists() and not (tmp_path / "r2").exists()
    assert not (tmp_path / "r3").exists() and not (tmp_path / "r4").exists()


def test_derive_keeps_a_step_the_user_fixes(model_dir, tmp_path):
    import json

    out = tmp_path / "plan.json"
    assert main(["derive", "--model", str(model_dir), "--data", str(DATA / "prompt_completion.jsonl"), "--lora-rank",
                 "4", "--steps", "6", "--rows-per-step", "3", "--effort", "full", "--out", str(out), "--device",
                 "cpu"]) == 0
    values = json.loads(out.read_text())["values"]
    assert values["micro_batch"]["value"] * values["grad_accum"]["value"] == 3
    assert values["tokens_per_step"]["kind"] == "given" and values["tokens_per_step"]["evidence"]["given_rows"] == 3


def test_the_recipe_trains_at_the_rows_the_card_fits_not_the_plans_cut_micro_batch():
    from leadline.cli.train import recipe_micro_batch

    assert recipe_micro_batch(16, 16) == 16
    assert recipe_micro_batch(16, 12) == 8  # the most rows dividing the step within the fit
    assert recipe_micro_batch(16, 1) == 1
    assert recipe_micro_batch(16, 300) == 16
    assert recipe_micro_batch(12, None) == 12


# leadline run: derive, then train, in one process on one load

RUN_STEPS = "48"  # long enough that the look-ahead keeps its first steps for the run to continue from (20 here)
# at the least-time step: on the tiny model the step for the rows (2 rows) has the look-ahead refine its answer, so no
# branch is kept and there would be nothing to continue from
STEP = ["--step-for", "time"]


def _run_args(model_dir):
    return ["--model", str(model_dir), "--data", str(DATA / "prompt_completion.jsonl"), "--lora-rank", "4",
            "--steps", RUN_STEPS, "--device", "cpu"]


@contextlib.contextmanager
def ticking():
    """A clock that moves 1 ms at every read: on the CPU the ramp keeps the rows where rows a
    second stop improving, a reading a busy machine moves; on this clock two derives read the
    same timings and decide the same plan."""
    from helpers import FakeClock, install_clock

    with pytest.MonkeyPatch.context() as mp:
        install_clock(mp, FakeClock(tick=0.001))
        yield


@pytest.fixture(scope="module")
def one_run(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "run"
    said = io.StringIO()
    with ticking(), contextlib.redirect_stdout(said):
        rc = main(["run", *_run_args(model_dir), *STEP, "--effort", "full", "--out", str(out), "--html"])
    return rc, out, said.getvalue()


@pytest.fixture(scope="module")
def two_commands(model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("two")
    with ticking():
        assert main(["derive", *_run_args(model_dir), *STEP, "--effort", "full", "--out", str(d / "plan.json")]) == 0
    assert main(["train", *_run_args(model_dir)[:-4], "--device", "cpu", "--plan", str(d / "plan.json"),
                 "--out", str(d / "run")]) == 0
    return d


def test_run_derives_trains_and_saves_in_one_folder(one_run):
    rc, out, said = one_run
    assert rc == 0
    ending = json.loads((out / "run.json").read_text())["ending"]
    assert f"ending: {ending['kept']} kept on the held-out rows" in said  # the raced ending, with its two losses
    assert {"plan.json", "plan.state", "run.json", "adapter_config.json", "report.html"} <= {p.name for p in out.iterdir()}
    res = json.loads((out / "run.json").read_text())
    assert res["steps"] == int(RUN_STEPS)
    assert res["load_seconds"] > 0 and res["derive_seconds"] > 0 and res["train_seconds"] > 0
    assert res["continued"]["from_step"] == Plan.from_json(out / "plan.json").get("lookahead_state_steps") > 0
    lines = said.strip().splitlines()
    assert any(line.startswith("continued at step") for line in lines) and f"saved to {out}" in lines
    assert lines[-1].startswith("derive ") and "s + train " in lines[-1] and lines[-1].endswith(" s, once)")


def test_run_gives_the_plan_and_the_result_of_derive_then_train(one_run, two_commands):
    """The model derive measured is the one run trains: a model derive left changed would start
    elsewhere (or not continue from the kept steps) and end elsewhere."""
    import torch
    from safetensors.torch import load_file

    _, out, _ = one_run
    ours, theirs = Plan.from_json(out / "plan.json"), Plan.from_json(two_commands / "plan.json")
    timings = {n for n in theirs if n.endswith("_seconds")}  # the clock's readings, not decisions
    assert set(ours) == set(theirs)
    assert {n: ours.get(n) for n in ours if n not in timings} == {n: theirs.get(n) for n in theirs if n not in timings}
    ran, trained = (json.loads((d / "run.json").read_text()) for d in (out, two_commands / "run"))
    assert ran["continued"] == {**trained["continued"], "state": str(out / "plan.state")}
    assert [c["loss"] for c in ran["curve"]] == pytest.approx([c["loss"] for c in trained["curve"]], rel=1e-6)
    assert ran["test_loss_after"]["mean"] == pytest.approx(trained["test_loss_after"]["mean"], rel=1e-6)
    a, b = load_file(out / "adapter_model.safetensors"), load_file(two_commands / "run" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-7)


def test_run_refuses_bad_input_in_one_sentence_and_writes_nothing(model_dir, tmp_path, capsys, monkeypatch):
    full = tmp_path / "full"
    full.mkdir()
    (full / "kept.txt").write_text("x")
    cases = [
        (["run", *_run_args(model_dir), "--out", str(full)], f"--out {full} exists and is not empty"),
        (["run", *_run_args(model_dir)[:2], "--data", str(tmp_path / "missing.jsonl"), "--device", "cpu",
          "--out", str(tmp_path / "new")], "missing.jsonl does not exist"),
        (["run", *_run_args(model_dir)[:4], "--steps", "0", "--out", str(tmp_path / "new")], "--steps 0"),
    ]
    for argv, needle in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("leadline")]
        assert len(err) == 1 and needle in err[0], err
    monkeypatch.setenv("WORLD_SIZE", "2")  # one of several processes under torchrun
    assert main(["run", *_run_args(model_dir), "--out", str(tmp_path / "new")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "under torchrun" in err[0] and "leadline derive" in err[0]
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["full", "kept.txt"]


def test_train_races_the_ending_over_the_share_it_is_given(two_commands, model_dir):
    """--ending-share 0.5: the copy at the run's half, the last half rerun; derive's branch is
    continued only where its steps end before that copy."""
    d = two_commands
    out = d / "half"
    assert main(["train", *_run_args(model_dir)[:-4], "--device", "cpu", "--plan", str(d / "plan.json"),
                 "--ending-share", "0.5", "--out", str(out)]) == 0
    res = json.loads((out / "run.json").read_text())
    steps, n = int(RUN_STEPS), Plan.from_json(d / "plan.json").get("lookahead_state_steps")
    copy = steps - round(0.5 * steps)
    assert res["ending"]["from_step"] == copy and f"the last {steps - copy} steps rerun" in res["ending"]["why"]
    assert (res["continued"]["from_step"] == n) == (n < copy), res["continued"]


def test_a_run_of_several_passes_is_read_by_the_guard_and_says_which_check_it_kept(model_dir, tmp_path):
    """--epochs 4 over the shipped rows: the guard reads the run at checks spread over its passes,
    run.json holds them, the model kept is one of them, and the terminal and report say so."""
    out = tmp_path / "run"
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        rc = main(["run", "--model", str(model_dir), "--data", str(DATA / "prompt_completion.jsonl"), "--lora-rank",
                   "4", "--epochs", "4", "--device", "cpu", "--rows-per-step", "4", "--out", str(out), "--html"])
    res = json.loads((out / "run.json").read_text())
    assert rc == (0 if res["outcome"] == "improved" else 3)
    checks = res["checks"]
    assert len([c for c in checks if c["action"] != "start"]) >= 3 and res["cost"]["check_reads"] >= 3
    assert res["kept_step"] in [c["step"] for c in checks]
    assert Plan.from_json(out / "plan.json")["guard"].evidence["kept_step"] == res["kept_step"]
    assert "the guard: " in said.getvalue()
    from leadline.report.plots import matplotlib_available

    if matplotlib_available():  # the report draws the checks with the kept one marked
        assert "id='figure-guard'" in (out / "report.html").read_text()


def test_run_json_names_every_second_of_the_process(model_dir, tmp_path):
    """The seconds before the load, the load, the run (its parts within it) and the writing after it
    are named, and together they are no more than the process's own age at the end."""
    from leadline.cli._common import process_seconds

    if process_seconds() is None:
        pytest.skip("this platform does not say when a process started")
    out = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        main(["run", "--model", str(model_dir), "--data", str(DATA / "prompt_completion.jsonl"), "--lora-rank", "4",
              "--steps", "4", "--device", "cpu", "--rows-per-step", "4", "--out", str(out)])
    res = json.loads((out / "run.json").read_text())
    named = ("before_load_seconds", "load_seconds", "run_seconds", "after_run_seconds")
    assert all(res[k] >= 0 for k in (*named, "prepare_seconds", "process_seconds"))
    assert sum(res[k] for k in named) <= res["process_seconds"] + 0.1  # one clock tick and rounding of slack
    parts = ("prepare_seconds", "derive_seconds", "steps_seconds", "check_seconds", "verdict_seconds")
    assert sum(res[k] for k in parts) <= res["run_seconds"] + 0.01
