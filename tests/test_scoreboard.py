"""The scoreboard's judging rules (benchmarks/scoreboard.py), on recorded results: which sweep
rate is the optimum, what counts as a win, the table written into the README."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path
from typing import Any

import pytest

from helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sb():
    return load_benchmark("scoreboard")


def _unit(preds, lr=2e-4, unseen=0.1, cost=10.0, rows=16):
    return {"lr": lr, "rows_per_step": rows, "warmup_ratio": 0.03, "decide_seconds": 0.0, "train_seconds": cost,
            "unseen_loss": unseen, "verdict": {"metric": "accuracy", "accuracy": sum(p == "a" for p in preds) / len(preds),
                                               "predictions": preds, "top_answer_share": 0.5}}


def _board(sb, sweep_units):
    gold = ["a"] * 40
    units = {"recipe": _unit(["a"] * 20 + ["b"] * 20)}
    units.update({f"sweep_{k}": u for k, u in enumerate(sweep_units)})
    return {"task": "t", "kind": "classify", "train_rows": 100, "test_rows": 40, "gold": gold, "units": units,
            "machine": {"device": "cpu"}, "commit": "abc1234", "command": "python3 benchmarks/scoreboard.py"}


def test_the_swept_optimum_is_chosen_by_the_unseen_split_not_by_the_test_rows(sb):
    units = [_unit(["a"] * 10 + ["b"] * 30, lr=1e-5 * (k + 1), unseen=1.0, cost=5.0) for k in range(len(sb.SWEEP_RATES))]
    units[2] = _unit(["a"] * 40, lr=3e-5, unseen=0.9, cost=5.0)  # the best on test, not on the unseen split
    units[5] = _unit(["a"] * 25 + ["b"] * 15, lr=6e-5, unseen=0.2, cost=5.0)  # the lowest unseen loss
    arms = sb.arms_of(_board(sb, units))
    assert arms["sweep"]["lr"] == 6e-5
    assert arms["sweep"]["cost"] == pytest.approx(5.0 * len(sb.SWEEP_RATES))


def test_an_unfinished_sweep_is_no_arm(sb):
    units = [_unit(["a"] * 40) for _ in range(len(sb.SWEEP_RATES) - 1)]
    arms = sb.arms_of(_board(sb, units))
    assert "sweep" not in arms
    assert "7 of 8 runs so far" in sb.table_of(_board(sb, units), Path("x.json"))


def test_a_win_needs_p_below_005_and_a_better_metric(sb):
    assert sb.outcome({"diff": 0.02, "p": 0.01}).endswith("win)")
    assert sb.outcome({"diff": -0.02, "p": 0.01}).endswith("loss)")
    assert sb.outcome({"diff": 0.02, "p": 0.06}).endswith("tie)")
    assert sb.outcome(None) == "–"


def test_accuracy_is_compared_by_mcnemar_on_the_same_rows(sb):
    gold = ["a"] * 40
    better = _unit(["a"] * 40)
    worse = _unit(["a"] * 20 + ["b"] * 20)
    c = sb.compare("classify", better, worse, gold)
    assert c["diff"] == pytest.approx(0.5)
    assert c["p"] < 0.001  # 20 discordant rows, all one way


def test_cross_entropy_is_compared_by_a_paired_t_and_lower_is_better(sb):
    a = {"verdict": {"row_ce": [1.0, 1.1, 0.9, 1.0, 1.05]}}
    b = {"verdict": {"row_ce": [2.0, 2.1, 1.9, 2.0, 2.05]}}
    c = sb.compare("generate", a, b, [])
    assert c["diff"] == pytest.approx(1.0) and c["p"] < 0.001


def test_the_table_goes_between_the_readme_markers_and_nowhere_else(sb, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- scoreboard:start -->\nold\n<!-- scoreboard:end -->\n\nafter\n")
    sb.write_readme(readme, "new table")
    assert readme.read_text() == "# x\n\n<!-- scoreboard:start -->\nnew table\n<!-- scoreboard:end -->\n\nafter\n"
    bare = tmp_path / "BARE.md"
    bare.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="markers"):
        sb.write_readme(bare, "t")


def test_the_final_number_is_read_after_the_hashes(sb):
    assert sb._final_number("so 12 + 3 = 15\n#### 1,215") == "1215"
    assert sb._final_number("#### 7.0") == "7"
    assert sb._final_number("no answer here") is None


@pytest.mark.parametrize("task", ["man_sections", "debian_summary"])
def test_the_shipped_tasks_load_from_the_repository(sb, task):
    t = sb.load_task(task, ROOT / "nowhere", train_rows=50, test_rows=10)
    assert len(t["train"]) == 50 and len(t["test"]) == 10
    assert all(r["prompt"] and r["completion"] for r in t["train"])
    if task == "man_sections":
        assert {r["label"] for r in t["test"]} <= set(t["labels"])


def test_the_committed_results_render(sb):
    paths = sorted((ROOT / "benchmarks" / "results").glob("scoreboard_*.json"))
    if not paths:
        pytest.skip("no scoreboard results committed")
    text = sb.table(paths)
    for p in paths:
        assert json.loads(p.read_text())["task"] in text


def test_the_recipe_on_a_small_card_takes_its_step_in_passes_that_divide_it(sb):
    assert sb.recipe_micro(16, None) is None
    assert sb.recipe_micro(16, 4) == 4
    assert sb.recipe_micro(16, 6) == 4  # the most rows up to 6 that divide the step
    assert sb.recipe_micro(4, 8) == 4


def test_a_failed_arm_shows_why_and_a_collapse_is_flagged(sb):
    board = _board(sb, [])
    board["units"]["lr_find"] = {"failed": True, "range_test": {"output_tail": "loading\nthe step ran out of memory"}}
    board["units"]["schedulefree"] = _unit(["b"] * 40)
    board["units"]["schedulefree"]["verdict"]["top_answer_share"] = 1.0
    board["gold"] = ["a"] * 10 + ["b"] * 10 + ["c"] * 10 + ["d"] * 10
    text = sb.table_of(board, Path("x.json"))
    assert "| lr_find | failed: the step ran out of memory |" in text
    assert "100% (collapse)" in text
    assert "| recipe |" in text and "(collapse)" not in text.split("| recipe |")[1].split("\n")[0]


def test_a_failed_run_names_its_own_error_and_the_bar_says_both_pichak_arms_failed(sb):
    board = _board(sb, [])
    board["units"]["leadline_full"] = _unit(["a"] * 40, cost=30.0)
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 14.83 GiB. GPU 0 has a total capacity of "
           "139.80 GiB of which 7.51 GiB is free.")
    board["units"]["pichak_quick"] = {"failed": True, "train": {"output_tail": "Traceback\n" + oom},
                                      "run": {"error": oom, "micro_batch": 349, "rows_per_step": 349}}
    board["units"]["pichak_full"] = {"failed": True, "train": {"output_tail": "x"},
                                     "run": {"error": "ValueError: this plan's rate was not measured by running ahead: "
                                                      "pass grad_fn=ModelGradFn(...)"}}
    text = sb.table_of(board, Path("x.json"))
    assert "| pichak_quick | failed: torch.OutOfMemoryError: CUDA out of memory (its micro-batch 349 rows, 349 a step) |" in text
    assert "| pichak_full | failed: ValueError: this plan's rate was not measured by running ahead |" in text
    line = sb.bar_of(board, sb.arms_of(board))[0]
    assert "against pichak's best arm: both of pichak's arms failed, no model to compare" in line
    del board["units"]["pichak_full"]
    assert "against pichak's best arm: not run yet" in sb.bar_of(board, sb.arms_of(board))[0]
    board["units"]["pichak_full"] = {"failed": True, "run": None, "train": {
        "rc": "timeout after 300 s", "output_tail": "[pichak 179s] look-ahead: horizon 16 done, 52 steps run\n"}}
    assert ("| pichak_full | failed: cut by the harness's limit of 300 s (its last line: [pichak 179s] look-ahead: "
            "horizon 16 done, 52 steps run) |") in sb.table_of(board, Path("x.json"))


def test_the_cost_line_says_where_leadlines_seconds_went_and_why_the_run_started_over(sb):
    board = _board(sb, [])
    board["units"]["recipe"]["run"] = {"steps": 66, "seconds": 11.2}
    full = _unit(["a"] * 40, cost=70.0)
    full["decide_seconds"] = 100.0
    why = "the plan's rate 0.00113 is not the branch's 0.00164"
    full["plan"] = {"derive_seconds": 79.0, "phases": [
        {"phase": "corpus", "seconds": 0.0, "steps": 0}, {"phase": "memory", "seconds": 6.4, "steps": 0},
        {"phase": "first_step", "seconds": 1.4, "steps": 1}, {"phase": "rate", "seconds": 56.4, "steps": 270}],
        "values": {"lookahead_state_steps": {"value": 0, "evidence": {"why": why}}}}
    full["run"] = {"steps": 214, "seconds": 51.7, "continued": None}
    board["units"]["leadline_full"] = full
    line = sb.cost_of(sb.arms_of(board))[0]
    assert line.startswith("Where leadline_full's 170 s went: derive's process 100 s (derive 79 s: the memory ramp 6.4 s, ")
    assert "the first step 1.4 s over 1 optimizer step, the look-ahead 56.4 s over 270 optimizer steps;" in line
    assert "corpus" not in line  # a phase under half a second is not named
    assert "the training process 70 s (214 steps in 52 s); the recipe's one process 10 s (66 steps in 11 s)" in line
    assert line.endswith(f"The run started over: {why}.")
    full["run"]["continued"] = {"from_step": 40, "steps": 40}
    assert sb.cost_of(sb.arms_of(board))[0].endswith("The run continued from the look-ahead's first 40 steps.")
    del full["plan"]
    assert sb.cost_of(sb.arms_of(board)) == []


def test_rule_l_picks_the_ending_that_read_lower_on_the_held_out_rows_and_judges_it_on_the_test_rows(sb):
    board = _board(sb, [])
    short = _unit(["a"] * 30 + ["b"] * 10)
    half = _unit(["a"] * 40)
    short["run"] = {"ending": {"kept": "decay", "decay": {"loss": 0.111}, "constant": {"loss": 0.128}}}
    half["run"] = {"ending": {"kept": "decay", "decay": {"loss": 0.103}, "constant": {"loss": 0.128}}}
    board["units"].update(leadline_full=short, leadline_full_half_ending=half)
    arms = sb.arms_of(board)
    assert sb.ending_pick(arms) == ("leadline_full_half_ending", "leadline_full", 0.103, 0.111)
    line = next(r for r in sb.paired_rules(board, arms) if r.startswith("Both endings raced"))
    assert "pick leadline_full_half_ending's ending (0.1030 against 0.1110" in line and line.endswith("win).")
    short["run"]["ending"] = {"kept": "constant", "decay": {"loss": 0.2}, "constant": {"loss": 0.09}}
    assert sb.ending_pick(sb.arms_of(board))[0] == "leadline_full"  # its kept ending, the constant, read lower
    del half["run"]
    assert sb.ending_pick(sb.arms_of(board)) is None


def test_the_bar_names_each_part_and_what_is_missing(sb):
    board = _board(sb, [])
    board["units"]["leadline_full"] = _unit(["a"] * 40, cost=30.0)
    lines = sb.bar_of(board, sb.arms_of(board))
    assert len(lines) == 1
    line = lines[0]
    assert "against the swept optimum: not run yet" in line
    assert "against the recipe: win" in line  # 20 discordant rows, all leadline's
    assert "3.00x the recipe's one run (the bar: at most 1.5x)" in line
    del board["units"]["leadline_full"]
    assert sb.bar_of(board, sb.arms_of(board)) == []


def _tiny_task(d: Path, rows: int, seed: int) -> None:
    import random

    rng = random.Random(seed)
    words = {"games": "play level score", "net": "network socket http", "science": "math data model",
             "sound": "audio music volume"}
    for split, n in (("train", rows), ("test", 8)):
        with (d / f"debian_sections_{split}.jsonl").open("w") as f:
            for _ in range(n):
                label = rng.choice(sorted(words))
                f.write(json.dumps({"text": f"a tool for {words[label]} {rng.randint(0, 99)}", "label": label}) + "\n")


def _tiny_model_and_task(tmp_path: Path) -> tuple[Path, Path]:
    """The tiny model's folder and a data folder holding a 48-row debian_sections task."""
    from helpers import save_model_dir

    model = save_model_dir(tmp_path / "tiny")
    data = tmp_path / "data"
    data.mkdir()
    _tiny_task(data, 48, 0)
    return model, data


def _leadline_in_process(sb: Any, monkeypatch: Any) -> list[list[str]]:
    """The harness's ``python -m leadline ...`` processes run as ``leadline.cli.main`` in this one
    (each new process imports torch, transformers and peft again: 9-26 s on two cores, most of
    the test's time), all but the first, which stays a real process so that path is run too.
    Returns the argument lists that ran in this process."""
    import contextlib
    import threading
    import time

    from leadline.cli import main

    real, here = sb.proc, []
    one_at_a_time = threading.Lock()  # redirect_stdout is the process's: two runs in threads would swap their logs

    def proc(args: list[str], log_path: Path, timeout: float) -> dict[str, Any]:
        if args[:2] != ["-m", "leadline"] or not getattr(proc, "forked", False):
            proc.forked = args[:2] == ["-m", "leadline"]  # type: ignore[attr-defined]
            return real(args, log_path, timeout)
        here.append(args)
        t = time.perf_counter()
        with one_at_a_time, log_path.open("w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
            try:
                rc: Any = main(args[2:])
            except SystemExit as e:
                rc = e.code
        return {"argv": args, "rc": rc, "seconds": time.perf_counter() - t, "output_tail": log_path.read_text()[-1500:]}

    monkeypatch.setattr(sb, "proc", proc)
    return here


@pytest.mark.slow
def test_every_arm_runs_two_steps_on_the_cpu_and_a_rerun_resumes(sb, tmp_path, monkeypatch):
    """The harness end to end on the tiny model, in every regime's shape: each arm whose package is
    installed runs two steps a run, side by side (--parallel); a second call with the same results
    file runs nothing again; --arms picks arms. No arm is bounded by time: what runs does not
    depend on the machine's load."""
    import importlib.util as iu


    in_process = _leadline_in_process(sb, monkeypatch)

    model, data = _tiny_model_and_task(tmp_path)
    arms = ["recipe", "sweep", "leadline"]  # leadline_full: the second seed's board below
    arms += [a for a, pkg in (("schedulefree", "schedulefree"), ("schedulefree_again", "schedulefree"),
                              ("schedulefree_algoperf", "schedulefree"),
                              ("prodigy", "prodigyopt"), ("optuna", "optuna"), ("lr_find", "lightning"))
             if iu.find_spec(pkg) is not None]
    out = tmp_path / "board.json"
    argv = ["--task", "debian_sections", "--model", str(model), "--data-dir", str(data), "--out", str(out),
            "--work", str(tmp_path / "work"), "--smoke", "--timeout", "600"]
    assert sb.main([*argv, "--arms", ",".join(arms), "--parallel", "2", "--seeds", "3"]) == 0
    board = json.loads(out.read_text())
    units = board["units"]
    assert board["regime"] == "lora" and board["sweep_rates"] == [sb.SWEEP_RATES[0], sb.SWEEP_RATES[7]]
    failed = {k: (v.get("train") or v.get("derive") or {}).get("output_tail", "")[-400:] for k, v in units.items()
              if v.get("failed")}
    assert not failed, failed
    assert not board.get("failures"), board.get("failures")
    for name in ("recipe", "sweep_0", "sweep_1", "leadline"):
        assert units[name]["verdict"]["metric"] == "accuracy", name
        assert units[name]["run"]["steps"] == 2, name
    assert units["leadline"]["plan"]["values"]["optimizer"]["value"] == "schedule_free_adamw"
    assert units["leadline"]["train"]["argv"][2:4] == ["run", "--model"]  # the command a user runs, no effort named
    for name in ("schedulefree_algoperf", "prodigy"):
        if name in arms:
            assert units[name]["run"]["optimizer"] == name and units[name]["run"]["steps"] == 2
    if "schedulefree_again" in arms:  # the A/A control: on the CPU two runs of one method are one run
        assert units["schedulefree_again"]["run"]["final_train_loss"] == units["schedulefree"]["run"]["final_train_loss"]
    text = sb.boards_table([out])
    # the recipe at three seeds: their mean, spread and range
    assert re.search(r"\| debian_sections · lora · CPU \| accuracy ↑ \| [01]\.\d{4} ± \d\.\d{4} \(3 seeds, [01]\.\d{4}\.\.[01]\.\d{4}\)", text)
    if "schedulefree_again" in arms:  # run beside the other arms (--parallel 2): on the CPU the same answers
        assert re.search(r"\| identical \(beside other processes\) \| `--task debian_sections` \|$", text.splitlines()[2]), text
    # every comparison arm trained on every row given; a search on all but its 10% to pick by
    assert units["recipe"]["train_rows"] == 48 and units["sweep_0"]["train_rows"] == 48 - 5
    assert units["sweep_0"]["run"]["validation_rows"] == 5 and units["sweep_0"]["unseen_loss_from"] == "validation_loss"
    assert units["recipe"]["unseen_loss"] is None and units["recipe"]["run"]["validation_loss"] is None
    for name in ("schedulefree", "schedulefree_algoperf", "prodigy"):
        if name in arms:
            assert units[name]["train_rows"] == 48 and units[name]["seed"] == 0, name
    assert units["leadline"]["exit_status"] == 0 and units["leadline"]["seed"] == 0
    for k in (1, 2):  # --seeds 3: the seeded arms at seeds 1 and 2 beside seed 0's plain unit
        for name in ("recipe", "leadline", *(["schedulefree"] if "schedulefree" in arms else [])):
            unit = units[f"{name}_seed{k}"]
            assert unit["seed"] == k and unit["verdict"]["metric"] == "accuracy", (name, k)
            assert unit["train"]["argv"][unit["train"]["argv"].index("--seed") + 1] == str(k), (name, k)
    assert "3 seeds" in text.splitlines()[2]
    before = {k: v.get("train_seconds") for k, v in units.items()}
    assert sb.main([*argv, "--arms", ",".join(arms), "--seeds", "3"]) == 0  # resumes: every unit is there, none runs
    again = json.loads(out.read_text())
    assert {k: v.get("train_seconds") for k, v in again["units"].items()} == before
    assert len(again["invocations"]) == 2
    assert in_process and all(a[:2] == ["-m", "leadline"] for a in in_process)  # the first ran as a process


@pytest.mark.slow
def test_a_full_fine_tune_board_trains_every_weight_and_judges_the_saved_weights(sb, tmp_path, monkeypatch):

    _leadline_in_process(sb, monkeypatch)
    model, data = _tiny_model_and_task(tmp_path)
    out = tmp_path / "board.json"
    assert sb.main(["--task", "debian_sections", "--model", str(model), "--data-dir", str(data), "--out", str(out),
                    "--work", str(tmp_path / "work"), "--smoke", "--regime", "full", "--quick-board", "--alone"]) == 0
    board = json.loads(out.read_text())
    assert sorted(board["units"]) == sorted(["untrained", *sb.QUICK_BOARD])
    assert all(board["units"][n]["timed_alone"] for n in sb.QUICK_BOARD)  # the cost ratio marked as alone
    assert " (alone) |" in sb.boards_table([out])
    with pytest.raises(SystemExit) as e:  # alone means one arm at a time
        sb.main(["--task", "debian_sections", "--model", str(model), "--alone", "--parallel", "2"])
    assert e.value.code == 2
    assert board["regime"] == "full" and board["sweep_rates"][0] == pytest.approx(sb.SWEEP_RATES[0] / 10)
    for name in ("recipe", "leadline"):
        unit = board["units"][name]
        assert not unit.get("failed") and unit["verdict"]["metric"] == "accuracy", name
        argv = unit["train"]["argv"]
        assert "--full" in argv if name == "leadline" else argv[argv.index("--regime") + 1] == "full", name
    assert board["units"]["recipe"]["lr"] == 2e-5 and board["units"]["recipe"]["run"]["regime"] == "full"


def test_rerun_sets_a_several_unit_arm_aside_at_once_and_a_one_unit_arm_when_its_new_run_lands(sb, tmp_path):
    data = {"units": {"recipe": {"a": 1}, "sweep_0": {}, "sweep_1": {}, "leadline_full": {"b": 2}, "sweep_extra": {}}}
    kept = sb.drop_units(data, "sweep,leadline_full")
    assert sorted(data["units"]) == ["leadline_full", "recipe", "sweep_extra"]  # a cut call leaves leadline_full
    assert sorted(data["superseded"]) == ["sweep_0", "sweep_1"] and kept == {"leadline_full"}
    board = sb.Board(tmp_path / "b.json", {"name": "t", "kind": "classify", "train": [], "test": []}, [])
    board.data["units"] = data["units"]
    board.rerun = kept
    assert not board.has("leadline_full") and board.has("recipe")  # runs again, though recorded
    board.put("leadline_full", {"b": 3})
    assert board.data["units"]["leadline_full"] == {"b": 3} and board.data["superseded"] == {"leadline_full": {"b": 2}}


def test_refresh_reruns_only_the_units_that_trained_on_leadlines_split_so_a_resumed_call_keeps_new_ones(sb):
    data = {"units": {"recipe": {"a": 1}, "recipe_seed1": {"train_rows": 100}, "leadline": {"train_rows": None},
                      "schedulefree": {"b": 2}, "sweep_0": {"train_rows": 90}, "sweep_1": {}, "prodigy": {}}}
    stale = sb.drop_stale(data, "recipe,leadline,schedulefree,sweep")
    assert stale == {"recipe", "schedulefree"}  # leadline's unit records its rows (None: not in its run.json)
    assert sorted(data["superseded"]) == ["sweep_0", "sweep_1"]  # a search is set aside whole
    assert "prodigy" in data["units"] and "recipe_seed1" in data["units"]
    data["units"].update(recipe={"train_rows": 100}, schedulefree={"train_rows": 100})
    assert sb.drop_stale(data, "recipe,leadline,schedulefree,sweep") == frozenset()  # the same command resumes


def test_the_summary_has_one_row_a_task_with_leadlines_outcome_and_cost(sb, tmp_path):
    board = _board(sb, [])
    board["units"]["leadline_full"] = _unit(["a"] * 40, cost=30.0)
    path = tmp_path / "scoreboard_t.json"
    path.write_text(json.dumps(board))
    text = sb.summary([path])
    row = next(line for line in text.splitlines() if line.startswith("| t (accuracy)"))
    assert "| 0.500 | – |" in row  # the recipe's accuracy, the sweep not run
    assert "| win / – | 3.0x | `scoreboard_t.json` |" in row


def test_the_model_load_is_read_from_derives_own_note(sb):
    board = _board(sb, [])
    assert sb.load_seconds(board) is None
    board["units"]["leadline_full"] = {"derive": {"output_tail": "note: derive took 41.7 s; loading the model and "
                                                                  "tokenizer before it 41.6 s\n"}}
    assert sb.load_seconds(board) == 41.6


def test_the_judge_scores_the_same_in_bounded_passes_and_leaves_the_model_in_host_memory(sb, tmp_path):
    """On a held card the judge scores in passes of at most ``token_budget`` tokens: the same
    scores as 64 rows a pass, and between verdicts the model waits on the host."""
    from helpers import save_model_dir

    model = save_model_dir(tmp_path / "tiny")
    rows = [{"prompt": f"row {i} is about", "label": lab} for i, lab in enumerate(["net", "games", "sound"] * 4)]
    task = {"name": "t", "kind": "classify", "labels": ["net", "games"], "test": rows}
    wide, bounded = sb.Judge(str(model), task, 0), sb.Judge(str(model), task, 0, token_budget=25)
    seqs = [(wide._enc(r["prompt"] + " " + r["label"]), 3) for r in rows]
    assert max(len(s) for s, _ in seqs) * 3 > 25  # the budget splits the rows into several passes
    for j in (wide, bounded):
        j.base.to(j.dev)
    got, want = bounded._seq_scores(bounded.base, seqs), wide._seq_scores(wide.base, seqs)
    assert [n for _, n in got] == [n for _, n in want]
    assert [s for s, _ in got] == pytest.approx([s for s, _ in want], abs=1e-4)
    v = bounded.verdict(None)
    assert v["metric"] == "accuracy" and len(v["predictions"]) == len(rows)
    assert next(bounded.base.parameters()).device.type == "cpu"
    moves = []
    to = bounded.base.to
    bounded.base.to = lambda where: (moves.append(where), to(where))[1]
    with pytest.raises(ValueError):  # an adapter folder that is none: the base still goes back to the host
        bounded.verdict(tmp_path / "no_adapter")
    assert moves == [bounded.dev, "cpu"] and not hasattr(bounded.base, "peft_config")


def test_a_search_judges_exact_match_only_for_the_unit_it_picks(sb, tmp_path):
    """The sweep's and optuna's units skip the greedy decoding; once the search is whole, the
    unit with the lowest unseen loss gets its exact match, from its adapter where it is still on
    disk, else from the same run trained again."""
    from types import SimpleNamespace

    judged, trained = [], []

    def verdict(adapter, em=True):
        judged.append((adapter.name, em))
        return {"metric": "test_ce", "test_ce": 0.5, "row_ce": [0.5], "exact_match": 0.25, "em_right": [True]}

    def recipe_train(unit, lr, batch, warmup):
        trained.append((unit, lr, batch, warmup))
        d = tmp_path / f"run_{unit}"
        d.mkdir(exist_ok=True)
        (d / "adapter_config.json").write_text("{}")
        (d / "run.json").write_text(json.dumps({"test_loss_after": {"mean": 0.31}}))
        return {"rc": 0, "seconds": 1.0}, d

    units = {f"sweep_{k}": {"lr": lr, "rows_per_step": 16, "warmup_ratio": 0.03, "unseen_loss": u,
                            "verdict": {"metric": "test_ce", "test_ce": u}}
             for k, (lr, u) in enumerate([(1e-4, 0.9), (1e-3, 0.3), (3e-3, 0.6)])}
    stored = {}
    arms = SimpleNamespace(judge=SimpleNamespace(has_em=True, verdict=verdict), work=tmp_path,
                           board=SimpleNamespace(data={"units": {"sweep_0": units["sweep_0"]}},
                                                 put=lambda name, rec: stored.update({name: rec})),
                           recipe_train=recipe_train)
    sb.Arms.em_for_best(arms, "sweep", 3)  # the search is not whole yet: nothing judged
    assert judged == [] and stored == {}

    arms.board.data["units"] = units
    sb.Arms.em_for_best(arms, "sweep", 3)  # the pick's adapter is gone: trained again, then judged
    assert trained == [("sweep_1", 1e-3, 16, 0.03)] and judged == [("run_sweep_1", True)]
    assert stored["sweep_1"]["verdict"]["exact_match"] == 0.25
    assert stored["sweep_1"]["em_retrained"]["unseen_loss"] == 0.31

    judged.clear()
    sb.Arms.em_for_best(arms, "sweep", 3)  # judged already: nothing runs again
    assert judged == [] and len(trained) == 1


def test_a_resumed_optuna_study_does_not_propose_a_trial_it_already_ran(sb):
    """A study resumed in a new process with one random start-up trial told proposes a new point,
    not the first random draw again (which a sampler seeded the same way in every process did)."""
    pytest.importorskip("optuna")
    fresh, dists = sb.optuna_study({}, 8)
    first = fresh.ask(dists).params
    units = {"optuna_0": {"params": first, "unseen_loss": 0.5}}
    resumed, dists = sb.optuna_study(units, 8)
    assert len(resumed.trials) == 1 and resumed.trials[0].value == 0.5
    again = resumed.ask(dists).params
    assert again != first
    failed = {"optuna_0": {"params": first, "unseen_loss": None, "failed": True}}
    assert len(sb.optuna_study(failed, 8)[0].trials) == 0  # a failed unit is not told: it runs again


def test_a_task_run_at_two_seeds_gets_its_arms_seed_by_seed_and_says_when_an_outcome_moves(sb, tmp_path):
    boards = []
    for seed, full in ((0, ["a"] * 40), (1, ["a"] * 21 + ["b"] * 19)):
        board = _board(sb, [])
        board["seed"] = seed
        board["units"]["leadline_full"] = _unit(full, cost=30.0)
        boards.append((board, tmp_path / f"scoreboard_t_seed{seed}.json"))
    lines = sb.seeds_table(boards)
    text = "\n".join(lines)
    assert "**t**, seed by seed (accuracy)" in text
    assert "| leadline_full | 1.0000 | 0.5250 | 0.7625 ± 0.3359 |" in text
    assert "| recipe | 0.5000 | 0.5000 | 0.5000 ± 0.0000 |" in text
    assert "- leadline_full against recipe: win at seed 0, tie at seed 1 (the outcome moves with the seed)." in text
    assert sb.seeds_table(boards[:1]) == []  # one seed: nothing to add
    assert ", seed 1" in sb.table_of(boards[1][0], boards[1][1])


def test_a_results_file_of_another_seed_is_refused_and_left_as_it_was(sb, tmp_path, capsys):
    out = tmp_path / "scoreboard_man_sections.json"
    out.write_text(json.dumps({"seed": 0, "units": {"recipe": {"x": 1}}}))
    before = out.read_text()
    rc = sb.main(["--task", "man_sections", "--train-rows", "50", "--seed", "1", "--out", str(out),
                  "--work", str(tmp_path / "work")])
    assert rc == 2 and out.read_text() == before
    assert "holds seed 0's arms, not --seed 1" in capsys.readouterr().err


@pytest.mark.slow
def test_a_second_seed_runs_every_arm_at_it_into_its_own_file(sb, tmp_path, monkeypatch):
    import importlib.util as iu


    in_process = _leadline_in_process(sb, monkeypatch)
    model, data = _tiny_model_and_task(tmp_path)
    arms = ["recipe", "leadline_full"] + (["schedulefree"] if iu.find_spec("schedulefree") else [])
    argv = ["--task", "debian_sections", "--model", str(model), "--data-dir", str(data), "--work", str(tmp_path / "work"),
            "--smoke", "--timeout", "240", "--arms", ",".join(arms)]
    monkeypatch.setattr(sb, "RESULTS", tmp_path / "results")
    (tmp_path / "results").mkdir()
    assert sb.main([*argv, "--seed", "1"]) == 0
    board = json.loads((tmp_path / "results" / "scoreboard_debian_sections_seed1.json").read_text())
    assert board["seed"] == 1 and not board.get("failures")
    assert all(not u.get("failed") for u in board["units"].values()), board["units"].keys()
    seeds = [a[a.index("--seed") + 1] for a in in_process if "--seed" in a]
    assert seeds and set(seeds) == {"1"}  # every leadline call ran at the seed
    assert board["units"]["leadline_full"]["plan"]["held_out"]["seed"] == 1
    if "schedulefree" in arms:
        assert board["units"]["schedulefree"]["train"]["argv"][board["units"]["schedulefree"]["train"]["argv"].index("--seed") + 1] == "1"


def test_an_arm_whose_last_run_would_pass_the_deadline_is_not_started(sb, tmp_path, monkeypatch):
    here = {"units": {"recipe": {"decide_seconds": 0.0, "train_seconds": 50.0, "judge_seconds": 10.0},
                      "pichak_quick": {"failed": True, "train_seconds": 5.0}},
            "superseded": {"leadline_full": {"decide_seconds": 90.0, "train_seconds": 60.0}}}
    other = {"units": {"pichak_quick": {"decide_seconds": 15.0, "train_seconds": 163.0, "judge_seconds": 9.0},
                       "leadline_full": {"decide_seconds": 1.0, "train_seconds": 1.0}}}
    assert sb.arm_seconds("recipe", [here, other]) == 60.0
    assert sb.arm_seconds("leadline_full", [here, other]) == 150.0  # this task's own run first, superseded or not
    assert sb.arm_seconds("pichak_quick", [here, other]) == 187.0  # a failed run says nothing of the time
    assert sb.arm_seconds("optuna", [here, other]) is None
    monkeypatch.setattr(sb, "RESULTS", tmp_path)  # no other board
    (tmp_path / "scoreboard_t.json").write_text(json.dumps(here))
    arms = object.__new__(sb.Arms)
    arms.board = types.SimpleNamespace(data=here, path=tmp_path / "scoreboard_t.json")
    arms.args = types.SimpleNamespace(deadline=None)
    assert arms.fits("leadline_full")  # no deadline: every arm starts
    monkeypatch.setattr(sb, "T0", sb.time.perf_counter() - 100.0)  # 100 s into the call
    arms.args.deadline = 200.0
    assert arms.fits("recipe") and not arms.fits("leadline_full") and arms.fits("optuna")  # 60 fits, 150 does not


def _range_test(lrs, loss_of):
    return {"suggestion": None, "seconds": 66.0, "lr": list(lrs), "loss": [loss_of(lr) for lr in lrs]}


def test_the_log_suggestion_reads_the_descent_the_linear_one_misses(sb):
    """A range test whose smoothed loss wiggles at the smallest rates and falls fastest around 1e-3:
    Lightning's suggestion() differentiates against lr, so a wiggle of 0.002 between rates 1e-6
    apart outweighs the descent; against log10(lr) the descent wins."""
    import math

    import torch

    lrs = [10 ** (-8 + 8 * k / 99) for k in range(100)]
    wiggle = {k: 0.002 * (-1) ** k for k in range(100)}
    found = _range_test(lrs, lambda lr: 3.0 - 1.0 / (1 + math.exp(-3 * (math.log10(lr) + 3)))
                        + wiggle[lrs.index(lr)] * (lr < 1e-5))
    lin = torch.tensor(found["lr"][10:-1], dtype=torch.float64)[
        int(torch.gradient(torch.tensor(found["loss"][10:-1], dtype=torch.float64),
                           spacing=[torch.tensor(found["lr"][10:-1], dtype=torch.float64)])[0].argmin())]
    assert float(lin) < 1e-5  # Lightning's reading: a wiggle at the smallest rates
    assert 3e-4 < sb.log_suggestion(found) < 3e-3  # the descent
    assert sb.log_suggestion(_range_test([1e-3, 1e-2], lambda lr: 1.0)) is None  # skipped down to nothing


def test_the_log_arm_reads_lr_finds_own_range_test_and_trains_the_recipe_there(sb):
    from types import SimpleNamespace

    lrs = [10 ** (-8 + 8 * k / 99) for k in range(100)]
    found = _range_test(lrs, lambda lr: 3.0 - (lr > 1e-4) * min(1.0, lr * 500))
    units = {"lr_find": {"lr": 3e-6, "range_test": found}}
    ran, searched = [], []
    fake = SimpleNamespace(board=SimpleNamespace(data={"units": units}, has=lambda u: u in units,
                                                 put=lambda u, rec: units.__setitem__(u, rec)),
                           lr_find=lambda: searched.append(1),
                           recipe_run=lambda unit, lr, **k: ran.append((unit, lr, k)))
    sb.Arms.lr_find_log(fake)
    assert searched == [] and len(ran) == 1
    unit, lr, k = ran[0]
    assert unit == "lr_find_log" and lr == sb.log_suggestion(found) and k["decide"] == 66.0
    assert k["extra"]["range_test_of"] == "lr_find"
    del units["lr_find"]  # no range test recorded and none that runs: the arm fails in one sentence
    sb.Arms.lr_find_log(fake)
    assert searched == [1] and units["lr_find_log"]["failed"]
    assert "no range test" in sb.failure(units["lr_find_log"])


def test_a_long_board_runs_the_recipe_shaped_arms_three_passes_and_leadline_three_epochs(sb, tmp_path):
    """The regime's length reaches every arm the same way: the recipe-shaped arms as the steps of
    three passes over the rows leadline's split trains on, leadline's own as --epochs 3."""
    import argparse

    from leadline.corpus.splits import split_rows
    from leadline.run.task import MAX_HELD_OUT_ROWS

    for n in (1000, 2000, 3001, 5000):  # leadline run holds out its decisions' rows and takes no test split
        held = min(round(0.1 * n), MAX_HELD_OUT_ROWS)
        assert sb.trained_rows(n) == len(split_rows(n, held_out=held, test=0).train), n
    assert sb.trained_rows(4000) == 4000 - 256 and sb.trained_rows(1000) == 900
    task = {"name": "t", "kind": "classify", "labels": ["a"], "test": [],
            "train": [{"prompt": f"p{i}", "completion": " a"} for i in range(1000)]}
    args = argparse.Namespace(work=str(tmp_path), model="m", seed=0, smoke=False, regime="long")
    arms = sb.Arms(args, task, sb.Board(tmp_path / "b.json", task, []), judge=None)
    assert arms.short == ["--steps", str(3 * 900 // 16)] and arms.length == ["--epochs", "3"]
    assert "--lora-rank" in arms.common and "--full" not in arms.common
    args.regime = "full"
    full = sb.Arms(args, task, sb.Board(tmp_path / "c.json", task, []), judge=None)
    assert "--full" in full.common and full.short == [] and full.recipe_lr == 2e-5
    args.regime = "rank64"
    rank64 = sb.Arms(args, task, sb.Board(tmp_path / "d.json", task, []), judge=None)
    assert rank64.common[rank64.common.index("--lora-rank") + 1] == "64" and rank64.recipe_lr == 2e-4


def test_a_regime_reaches_the_workers_adapter_and_the_range_tests(sb, tmp_path):
    """schedule-free's, Prodigy's and the range test's worker train the regime's adapter (rank64:
    rank 64, alpha 128) or every weight (full), as leadline and the recipe do."""
    from helpers import save_model_dir

    model = save_model_dir(tmp_path / "tiny")
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"tool {i}\nSection:", "completion": " net"}) + "\n" for i in range(24)))
    wrapped, _, _, params = sb._worker_task(str(model), str(train), 0, "rank64")
    cfg = wrapped.peft_config["default"]
    assert (cfg.r, cfg.lora_alpha) == (64, 128)
    full, _, _, params = sb._worker_task(str(model), str(train), 0, "full")
    assert not hasattr(full, "peft_config") and len(params) == len(list(full.parameters()))


def test_every_arm_trains_and_is_judged_in_the_precision_the_command_line_trains_in(sb, tmp_path, monkeypatch):
    """The workers (schedule-free, Prodigy, the range test) and the judge load the base as
    ``leadline run`` and ``leadline train`` do, in float32: on a GPU the library's default would be
    bfloat16, and those arms would train and be judged at another precision than the recipe's."""
    import torch

    import leadline.hf as hf
    from helpers import save_model_dir

    model = save_model_dir(tmp_path / "tiny")
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"tool {i}\nSection:", "completion": " net"}) + "\n" for i in range(24)))
    asked = []
    real = hf.load_model

    def spy(path, **kw):
        asked.append(kw.get("dtype"))
        return real(path, **kw)

    monkeypatch.setattr(hf, "load_model", spy)
    sb._worker_task(str(model), str(train))
    sb.Judge(str(model), {"kind": "classify", "name": "t", "train": [], "test": []}, 0)
    assert asked == [torch.float32, torch.float32]


def test_a_cost_ratio_is_quoted_only_where_the_two_arms_were_timed_alike(sb):
    lead, recipe = {"cost": 30.0}, {"cost": 25.0}
    assert sb.cost_ratio({**lead, "timed_alone": True}, {**recipe, "timed_alone": True}) == "1.20x (alone)"
    # side by side in one call: each one's seconds measured the sharing, not its run
    assert sb.cost_ratio({**lead, "invocation": 2}, {**recipe, "invocation": 2}) == "–"
    assert sb.cost_ratio({**lead, "invocation": 3}, {**recipe, "invocation": 2}) == "–"
    assert sb.cost_ratio({**lead, "timed_alone": True}, recipe) == "–"
    assert sb.cost_ratio(lead, None) == "–"


def test_a_run_of_several_passes_states_its_cost_less_the_passes_after_the_first(sb):
    alone = {"timed_alone": True}
    lead = {**alone, "cost": 120.0, "run": {"more_passes_seconds": 45.0, "passes": 3}}
    assert sb.cost_ratio(lead, {**alone, "cost": 100.0}) == "1.20x (alone; 0.75x less its passes 2-3)"
    one_pass = {**alone, "cost": 120.0, "run": {"more_passes_seconds": 0.0, "passes": 1}}
    assert sb.cost_ratio(one_pass, {**alone, "cost": 100.0}) == "1.20x (alone)"


def _sweep_board(sb, pick_nll: dict[str, float], rest_acc: dict[str, float], n: int = 40) -> dict[str, Any]:
    """A classification board whose sweep runs read ``pick_nll`` on the pick's rows and answer right on
    the share ``rest_acc`` of the other rows; leadline and schedule-free at three seeds."""
    gold = ["a"] * n
    picks = sb.pick_rows(n)
    rest = [i for i in range(n) if i not in picks]

    def verdict(nll: float, acc: float) -> dict[str, Any]:
        right = set(rest[:round(acc * len(rest))])
        preds = ["a" if (i in right or i in picks) else "b" for i in range(n)]
        return {"metric": "accuracy", "accuracy": sum(p == "a" for p in preds) / n, "predictions": preds,
                "row_nll": [nll] * n}

    units = {u: {"lr": lr, "passes": p, "train_seconds": 10.0, "verdict": verdict(pick_nll[u], rest_acc[u])}
             for u, lr, p in sb.sweep_units("lora")}
    for k in range(3):
        suffix = f"_seed{k}" if k else ""
        units["leadline" + suffix] = {"verdict": verdict(1.0, 0.5)}
        units["schedulefree" + suffix] = {"verdict": verdict(1.0, 0.9)}
    return {"task": "t", "kind": "classify", "regime": "lora", "test_rows": n, "gold": gold, "units": units,
            "pick_rows": picks}


def test_the_sweeps_pick_reads_its_own_rows_and_every_regret_is_judged_on_the_others(sb):
    names = [u for u, _, _ in sb.sweep_units("lora")]
    nll = {u: 1.0 for u in names} | {"sf_sweep_lr1": 0.5}  # the pick's rows favour c/2
    acc = {u: 0.6 for u in names} | {"sf_sweep_lr1": 0.9, "sf_sweep_ep5": 1.0}  # the test rows favour 5 passes
    data = _sweep_board(sb, nll, acc)
    sw = sb.sweep_result(data)
    assert sw["pick"] == "sf_sweep_lr1" and sw["ceiling"] == "sf_sweep_ep5"  # the ceiling is never the pick's bar
    assert not set(sw["pick_rows"]) & set(sw["rest_rows"]) and len(sw["pick_rows"]) == 10
    assert sw["cost"] == pytest.approx(70.0)
    assert sb.regret(data, "leadline")["word"] == "loss"  # 0.5 against the pick's 0.9, three seeds
    assert sb.regret(data, "schedulefree")["word"] == "tie"  # 0.9 against 0.9
    data["units"].pop("sf_sweep_ep3")
    assert sb.sweep_result(data) is None and sb.regret(data, "leadline") is None  # an unfinished sweep is no bar


def test_the_boards_table_counts_leadline_against_the_swept_optimum(sb, tmp_path):
    names = [u for u, _, _ in sb.sweep_units("lora")]
    data = _sweep_board(sb, {u: 1.0 for u in names}, {u: 0.9 for u in names})
    data.update(train_rows=100, machine={"device": "cpu"}, commit="abc", command="x")
    path = tmp_path / "scoreboard_t.json"
    path.write_text(json.dumps(data))
    text = sb.boards_table([path])
    assert "against the swept optimum: 0 win, 0 tie, 1 loss on 1 board" in text.splitlines()
    assert "0.900 (0.000625 x1; ceiling 0.900 at 0.000625 x1)" in text  # ties pick the first run


def test_the_sweep_runs_seven_schedule_free_runs_on_every_row_side_by_side(sb, tmp_path, monkeypatch):
    """The sweep end to end on the tiny model (two steps a run): its seven runs at their rates and
    passes, each on every row given, judged with the loss its pick reads, and the board's table
    with the pick and each arm's regret."""
    pytest.importorskip("schedulefree")
    import threading


    _leadline_in_process(sb, monkeypatch)
    real, one_at_a_time = sb.proc, threading.Lock()  # a model's load is not thread-safe: one worker at a time

    def proc(args: list[str], log_path: Path, timeout: float) -> dict[str, Any]:  # the workers in this process
        if "--worker" not in args:
            return real(args, log_path, timeout)
        with one_at_a_time:
            sb.main(args[1:])
        return {"argv": args, "rc": 0, "seconds": 1.0, "output_tail": ""}

    monkeypatch.setattr(sb, "proc", proc)
    model, data = _tiny_model_and_task(tmp_path)
    out = tmp_path / "board.json"
    assert sb.main(["--task", "debian_sections", "--model", str(model), "--data-dir", str(data), "--out", str(out),
                    "--work", str(tmp_path / "work"), "--smoke", "--regime", "small", "--train-rows", "48",
                    "--arms", "sf_sweep,leadline", "--parallel", "2"]) == 0
    board = json.loads(out.read_text())
    units = board["units"]
    assert not board.get("failures"), board.get("failures")
    for unit, lr, passes in sb.sweep_units("small"):
        u = units[unit]
        assert u["run"]["lr"] == pytest.approx(lr) and u["run"]["passes"] == passes and u["run"]["train_rows"] == 48
        assert len(u["verdict"]["row_nll"]) == 8 and u["verdict"]["metric"] == "accuracy"
    assert board["pick_rows"] == sb.pick_rows(8)
    sw = sb.sweep_result(board)
    assert sw is not None and sw["pick"] in units
    assert "against the swept optimum:" in sb.boards_table([out])
