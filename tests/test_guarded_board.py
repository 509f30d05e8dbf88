"""The guarded run's acceptance (benchmarks/guarded_run.py) and the scoreboard's decision on
several seeds (rule P): known answers for the pure parts, and the harness end to end on the tiny model."""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from helpers import load_benchmark


@pytest.fixture(scope="module")
def sb():
    return load_benchmark("scoreboard")


@pytest.fixture(scope="module")
def gr(sb):
    return load_benchmark("guarded_run")


def _acc(right: int, n: int = 40) -> list[bool]:
    return [True] * right + [False] * (n - right)


def test_rule_p_wins_only_when_every_seed_agrees_and_the_pooled_mcnemar_is_below_005(sb):
    # each seed: 6 rows leadline gets right that the other misses, none the other way (exact p 0.031)
    seed = (_acc(36), _acc(30))
    r = sb.pooled_accuracy([seed, seed, seed])
    assert (r["b"], r["c"]) == (18, 0) and r["word"] == "win"
    assert r["p"] == pytest.approx(2 * 0.5 ** 18)
    # one seed goes the other way: the pool still favours leadline, but not every seed does
    r = sb.pooled_accuracy([seed, seed, (_acc(30), _acc(31))])
    assert (r["b"], r["c"]) == (12, 1) and r["p"] < 0.05 and r["word"] == "tie"
    # every seed leans the same way, none significant alone, the pool is: a win on the seeds together
    small = (_acc(33), _acc(30))
    r = sb.pooled_accuracy([small] * 3)
    assert all(s["p"] > 0.05 for s in r["seeds"]) and r["word"] == "win"
    # the mirror image is a loss
    assert sb.pooled_accuracy([(b, a) for a, b in [small] * 3])["word"] == "loss"
    # every seed agrees but the pool is not below 0.05: a tie
    assert sb.pooled_accuracy([(_acc(31), _acc(30))] * 3)["word"] == "tie"


def test_rule_p_on_cross_entropy_is_a_paired_t_over_the_seeds_mean_differences(sb):
    base = [1.0, 1.2, 0.8, 1.1, 0.9]
    # leadline's CE lower by 0.10, 0.12, 0.08 at three seeds: t = 0.1 / (0.02 / sqrt 3) = 8.66, df 2, p = 0.013
    seeds = [([x - d for x in base], base) for d in (0.10, 0.12, 0.08)]
    r = sb.pooled_ce(seeds)
    assert r["diff"] == pytest.approx(0.10) and r["p"] == pytest.approx(0.0131, abs=5e-4) and r["word"] == "win"
    # the same mean difference spread wider over the seeds: p 0.31, a tie though every seed favours leadline
    r = sb.pooled_ce([([x - d for x in base], base) for d in (0.02, 0.25, 0.03)])
    assert all(s["diff"] > 0 for s in r["seeds"]) and r["p"] > 0.05 and r["word"] == "tie"
    # one seed: its own paired t over the rows
    one = sb.pooled_ce(seeds[:1])
    assert one["test"].startswith("paired t over the test rows") and one["word"] == "win"


def test_seeds_pair_by_seed_and_the_cell_names_every_seeds_direction(sb):
    gold = ["a"] * 40
    v = lambda right: {"verdict": {"metric": "accuracy", "predictions": ["a"] * right + ["b"] * (40 - right)}}  # noqa: E731
    units = {"leadline": v(36), "leadline_seed1": v(36), "leadline_seed2": v(36),
             "recipe": v(30), "recipe_seed1": v(30), "recipe_seed2": v(30), "recipe_seed3": v(10)}
    c = sb.compare_seeds("classify", sb.seed_units(units, "leadline"), sb.seed_units(units, "recipe"), gold)
    assert c["seed_ids"] == [0, 1, 2]  # seed 3 of the recipe has no leadline run to pair with
    assert sb.seeds_cell(c) == "win (pooled p < 0.0001, 3 seeds +++)"
    units["leadline_seed1"] = v(29)
    c = sb.compare_seeds("classify", sb.seed_units(units, "leadline"), sb.seed_units(units, "recipe"), gold)
    assert sb.seeds_cell(c).startswith("tie (pooled p") and sb.seeds_cell(c).endswith("3 seeds +-+)")
    assert sb.compare_seeds("classify", sb.seed_units(units, "leadline"), {}, gold) is None


def test_the_boards_table_shows_the_seeds_spread_a_collapse_at_any_seed_and_the_rows_trained(sb, tmp_path):
    gold = ["a"] * 10 + ["b"] * 10 + ["c"] * 10 + ["d"] * 10

    def unit(preds: list[str], **kw: Any) -> dict[str, Any]:
        acc = sum(p == g for p, g in zip(preds, gold)) / len(gold)
        top = max(preds.count(x) for x in set(preds)) / len(preds)
        return {"verdict": {"metric": "accuracy", "accuracy": acc, "predictions": preds, "top_answer_share": top},
                "dtype": sb.ARM_DTYPE, "decide_seconds": 0.0, "train_seconds": 10.0, **kw}

    good = list(gold)
    fell = ["a"] * 40  # one answer on every row: a collapse
    board = {"task": "t", "kind": "classify", "train_rows": 100, "test_rows": 40, "gold": gold,
             "machine": {"device": "cpu"}, "commit": "abc", "units": {
                 "recipe": unit(good, train_rows=100), "schedulefree": unit(good, train_rows=100, parallel=4),
                 "schedulefree_again": unit(good, train_rows=100, parallel=4),
                 "leadline": unit(good, train_rows=90), "leadline_seed1": unit(fell, train_rows=90),
                 "leadline_seed2": unit(good, train_rows=90, judged_as="untrained")}}
    path = tmp_path / "scoreboard_t.json"
    path.write_text(json.dumps(board))
    row = sb.boards_table([path]).splitlines()[2]
    assert "(3 seeds, 0.2500..1.0000) (collapse at seed 1) (no adapter kept, judged untrained: seed 2)" in row
    assert "| 100 / 100 / 90 |" in row
    assert "| identical (beside other processes) |" in row
    assert row.split(" | ")[-3] == "–"  # no cost ratio: nothing was timed alone
    del board["units"]["leadline"]["train_rows"]  # a unit from before the record
    path.write_text(json.dumps(board))
    assert "| 100 / 100 / leadline's split |" in sb.boards_table([path])


def test_a_leadline_run_that_exits_3_is_judged_as_its_outcome_says(sb, tmp_path):
    """Exit 3 with an adapter (collapsed) is judged by the adapter; without one
    (no_better_than_start) as the untrained model; any other failure is a failed unit."""
    from types import SimpleNamespace

    judged: list[Any] = []
    put: dict[str, Any] = {}
    fake = SimpleNamespace(args=SimpleNamespace(seed=0, parallel=3, alone=False), regime="lora",
                           board=SimpleNamespace(data={"invocations": [{}]}, put=lambda u, r: put.update({u: r})),
                           judge=SimpleNamespace(verdict=lambda a, em=True: judged.append(a) or {
                               "metric": "accuracy", "accuracy": 0.5}),
                           lock=contextlib.nullcontext(), seed_of=lambda unit: 2)
    sb.Arms.finish(fake, "leadline_seed2", {"run": {"train_rows": 90}, **sb.leadline_exit(3, {"outcome": "no_better_than_start"})},
                   None, as_untrained=True)
    rec = put["leadline_seed2"]
    assert judged == [None] and rec["judged_as"] == "untrained" and not rec.get("failed")
    assert rec["exit_status"] == 3 and rec["outcome"] == "no_better_than_start" and rec["seed"] == 2
    assert rec["train_rows"] == 90 and rec["parallel"] == 3
    adapter = tmp_path / "run"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    sb.Arms.finish(fake, "leadline", {**sb.leadline_exit(3, {"outcome": "collapsed"})}, adapter, as_untrained=True)
    assert judged[-1] == adapter and "judged_as" not in put["leadline"]
    sb.Arms.finish(fake, "leadline", {**sb.leadline_exit(1, None)}, None)
    assert put["leadline"]["failed"]


def test_a_run_without_a_test_split_reads_its_held_out_rows_and_says_so(sb):
    assert sb.unseen_fields({"held_out_after": {"mean": 1.25, "se": 0.02}, "test_loss_after": None}) == {
        "unseen_loss": 1.25, "unseen_loss_from": "held_out_after"}
    assert sb.unseen_fields({"test_loss_after": {"mean": 1.5}, "held_out_after": {"mean": 1.25}})[
        "unseen_loss_from"] == "test_loss_after"
    assert sb.unseen_fields({}) == {"unseen_loss": None, "unseen_loss_from": None}


def test_the_guarded_decision_fails_on_a_collapse_a_loss_a_changed_adapter_or_an_unexpected_exit(gr):
    gold = ["a"] * 10 + ["b"] * 10 + ["c"] * 10 + ["d"] * 10

    def v(right: int, top: float = 0.3) -> dict[str, Any]:
        preds = gold[:right] + ["x"] * (40 - right)
        return {"metric": "accuracy", "predictions": preds, "top_answer_share": top}

    def data(lead_right: int, sf_right: int, seeds: int = 3) -> dict[str, Any]:
        units: dict[str, Any] = {}
        for k in range(seeds):
            units[f"leadline_seed{k}"] = {"exit_status": 0, "outcome": "improved", "verdict": v(lead_right),
                                          "adapter_sha256": f"h{k}"}
            units[f"schedulefree_seed{k}"] = {"verdict": v(sf_right)}
        units["leadline_alone_seed0"] = {**units["leadline_seed0"]}
        return {"gold": gold, "units": units}

    seeds = [0, 1, 2]
    assert gr.decide(data(30, 30), seeds, [0])["passed"]
    d = gr.decide(data(24, 32), seeds, [0])  # 8 rows a seed schedule-free gets and leadline misses: a loss
    assert d["G2"]["holds"] is False and d["G2"]["word"] == "loss" and not d["passed"]
    d = gr.decide(data(32, 24), seeds, [0])
    assert d["G2"]["holds"] is True and d["G2"]["word"] == "win" and d["passed"]
    fell = data(30, 30)
    fell["units"]["leadline_seed1"]["verdict"]["top_answer_share"] = 0.7
    d = gr.decide(fell, seeds, [0])
    assert d["G1"]["holds"] is False and "seed 1" in d["G1"]["why"]
    moved = data(30, 30)
    moved["units"]["leadline_alone_seed0"]["adapter_sha256"] = "other"
    assert gr.decide(moved, seeds, [0])["G3"] == {"holds": False, "identical": {0: False},
                                                     "why": "the adapter differs alone at seed 0"}
    kept_none = data(30, 30)
    for name in ("leadline_seed0", "leadline_alone_seed0"):
        kept_none["units"][name].update(exit_status=3, outcome="no_better_than_start", adapter_sha256=None)
    d = gr.decide(kept_none, seeds, [0])
    assert d["G3"]["holds"] is True and d["G4"]["holds"] is True  # exit 3 is the run's own verdict, recorded
    silent = data(30, 30)
    silent["units"]["leadline_seed1"]["outcome"] = None  # exit 0 with no outcome in its run.json
    assert gr.decide(silent, seeds, [0])["G4"]["holds"] is False
    crashed = data(30, 30)
    crashed["units"]["leadline_seed2"].update(exit_status=1, outcome=None)
    assert gr.decide(crashed, seeds, [0])["G4"]["holds"] is False
    assert gr.decide(data(30, 30, seeds=2), seeds, [0])["G1"]["holds"] is None  # seed 2 has not run: open
    assert not gr.decide(data(30, 30, seeds=2), seeds, [0])["passed"]


def test_the_prompt_is_cut_to_its_first_tokens(gr):
    from helpers import make_tokenizer

    tok = make_tokenizer()
    text = "the quick brown fox jumps over the lazy dog " * 20
    cut = gr.cut_prompt(text, tok, 8)
    assert cut.endswith("\nSection:")
    assert len(tok(cut.removesuffix("\nSection:"), add_special_tokens=False)["input_ids"]) <= 8
    assert gr.cut_prompt("short", tok, 256) == "short\nSection:"


def _in_process(gr: Any, monkeypatch: Any) -> list[list[str]]:
    """The harness's processes run in this one (``leadline run`` by its CLI's main, the worker by
    the scoreboard's): a new process imports torch, transformers and peft again, most of the time."""
    from leadline.cli import main

    ran: list[list[str]] = []

    def proc(args: list[str], log_path: Path, timeout: float) -> dict[str, Any]:
        ran.append(args)
        t = time.perf_counter()
        with log_path.open("w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
            try:
                rc: Any = main(args[2:]) if args[:2] == ["-m", "leadline"] else gr.sb.main(args[1:])
            except SystemExit as e:
                rc = e.code
        return {"argv": args, "rc": rc or 0, "seconds": time.perf_counter() - t, "output_tail": log_path.read_text()[-1500:]}

    monkeypatch.setattr(gr, "proc", proc)
    return ran


@pytest.mark.slow
def test_the_guarded_run_smoke_runs_every_unit_writes_as_it_goes_and_resumes(gr, tmp_path, monkeypatch):
    pytest.importorskip("schedulefree")
    from helpers import save_model_dir
    from test_scoreboard import _tiny_task

    ran = _in_process(gr, monkeypatch)
    model = save_model_dir(tmp_path / "tiny")
    data = tmp_path / "data"
    data.mkdir()
    _tiny_task(data, 48, 0)
    out, copies = tmp_path / "guarded.json", tmp_path / "device_out"
    monkeypatch.setenv("OUT", str(copies))
    argv = ["--model", str(model), "--data-dir", str(data), "--out", str(out), "--work", str(tmp_path / "work"),
            "--seeds", "0,1", "--alone-seeds", "0", "--parallel", "1", "--smoke"]
    assert gr.main(argv) == 0
    res = json.loads(out.read_text())
    assert json.loads((copies / "guarded.json").read_text()) == res  # the copy in $OUT
    units = res["units"]
    assert sorted(units) == ["leadline_alone_seed0", "leadline_seed0", "leadline_seed1", "schedulefree_seed0",
                             "schedulefree_seed1", "untrained"]
    assert not [n for n, u in units.items() if u.get("failed")], {n: u.get("traceback") for n, u in units.items()}
    for k in (0, 1):
        lead = units[f"leadline_seed{k}"]
        assert lead["exit_status"] in (0, 3) and "outcome" in lead and lead["seed"] == k
        assert lead["process"]["argv"][lead["process"]["argv"].index("--seed") + 1] == str(k)
        assert units[f"schedulefree_seed{k}"]["train_rows"] == 48
    assert units["leadline_alone_seed0"]["timed_alone"] and not units["leadline_seed0"]["timed_alone"]
    d = res["decision"]
    assert d["G3"]["holds"] is True and units["leadline_seed0"]["adapter_sha256"]  # the same seed, the same adapter
    assert d["G1"]["holds"] in (True, False) and d["G2"]["holds"] in (True, False)
    # G4 reads the outcome leadline run writes in run.json; a run that writes none is not recorded
    written = all(units[n]["outcome"] for n in units if n.startswith("leadline_"))
    assert d["G4"]["holds"] is written, d["G4"]
    n = len(ran)
    assert gr.main(argv) == 0  # the same command again: every unit is there, none runs again
    again = json.loads(out.read_text())
    assert len(ran) == n and len(again["invocations"]) == 2 and again["units"].keys() == units.keys()


def test_boards_that_compare_as_users_do_come_first_with_their_own_tally(sb, tmp_path):
    """A board whose schedule-free arm trained on every row leads; one from before that record
    (every arm on leadline's split) follows under its own line and tally; the A/A control pairs
    only two runs on the same rows."""
    gold = ["a", "b"] * 10

    def unit(right: int, **kw: Any) -> dict[str, Any]:
        preds = [g if i < right else "x" for i, g in enumerate(gold)]
        return {"verdict": {"metric": "accuracy", "accuracy": right / 20, "predictions": preds,
                            "top_answer_share": 0.5}, "dtype": sb.ARM_DTYPE, **kw}

    def board(task: str, units: dict[str, Any]) -> Any:
        path = tmp_path / f"scoreboard_{task}.json"
        path.write_text(json.dumps({"task": task, "kind": "classify", "gold": gold, "units": units}))
        return path

    new = board("new", {"recipe": unit(20, train_rows=100), "schedulefree": unit(20, train_rows=100),
                        "schedulefree_again": unit(10), "leadline": unit(2, train_rows=90)})
    old = board("old", {"recipe": unit(2), "schedulefree": unit(2), "leadline": unit(20)})
    text = sb.boards_table([old, new])
    first, rest = text.split("The earlier boards")
    assert "| new · lora |" in first and "| old · lora |" in rest
    assert "On these boards, leadline against the recipe: 0 win, 0 tie, 1 loss" in first
    assert "On the earlier boards, leadline against the recipe: 1 win, 0 tie, 0 loss" in rest
    assert first.splitlines()[2].split(" | ")[-2] == "–"  # the A/A pair trained on different rows


def test_the_held_out_arm_runs_leadline_run_with_the_flag_and_is_compared_with_leadline_in_its_cell(sb, tmp_path):
    """Rule HO's arm: ``leadline run --train-held-out`` at each seed; the table puts its value and its
    comparison with leadline (rule P) in leadline's cell."""
    from types import SimpleNamespace

    ran = []
    fake = SimpleNamespace(board=SimpleNamespace(has=lambda u: False), length=["--epochs", "1"],
                           one_process=lambda unit, flags: ran.append((unit, flags)))
    sb.Arms.leadline_default(fake, "leadline_held_out_seed1")
    sb.Arms.leadline_default(fake, "leadline")
    assert ran == [("leadline_held_out_seed1", ["--epochs", "1", "--train-held-out"]), ("leadline", ["--epochs", "1"])]
    assert sb.with_seeds(["leadline_held_out"], 2) == ["leadline_held_out", "leadline_held_out_seed1"]

    gold = ["a", "b"] * 10

    def unit(right: int) -> dict[str, Any]:
        preds = [g if i < right else "x" for i, g in enumerate(gold)]
        return {"verdict": {"metric": "accuracy", "accuracy": right / 20, "predictions": preds,
                            "top_answer_share": 0.5}, "dtype": sb.ARM_DTYPE}

    data = {"task": "t", "kind": "classify", "gold": gold,
            "units": {"leadline": unit(10), "leadline_held_out": unit(20), "schedulefree": unit(10)}}
    row = sb.board_row(data, Counter())
    assert "; --train-held-out 1.0000: win (p " in row
