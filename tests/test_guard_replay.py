"""benchmarks/guard_replay.py: the share of the fall a rollback's check gave back, read from recorded checks."""

from __future__ import annotations

import doctest
import json

import pytest

from helpers import load_benchmark


@pytest.fixture(scope="module")
def gr():
    load_benchmark("scoreboard")
    return load_benchmark("guard_replay")


def test_the_examples_run(gr):
    result = doctest.testmod(gr)
    assert result.attempted > 0 and result.failed == 0


def test_it_lists_each_run_that_rolled_back_with_its_passes_and_metric(gr, tmp_path):
    checks = [{"step": 0, "action": "start", "loss": 5.0}, {"step": 10, "action": "best", "loss": 1.0},
              {"step": 20, "action": "rollback", "loss": 3.0}, {"step": 30, "action": "rollback", "loss": 9.0}]
    board = {"regime": "long", "units": {
        "leadline": {"run": {"steps": 30, "checks": checks}, "verdict": {"metric": "test_ce", "test_ce": 2.5}},
        "leadline_seed1": {"run": {"steps": 30, "checks": checks[:2]}, "verdict": {"metric": "test_ce", "test_ce": 2.4}},
        "recipe": {"run": {"steps": 30}}}}
    (tmp_path / "scoreboard_t_long.json").write_text(json.dumps(board))
    out = tmp_path / "replay.json"
    assert gr.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["unit"], r["passes"], r["step"], r["gave_back"], r["rollbacks"], r["value"]) for r in runs] == [
        ("leadline", 3, 20, 0.5, 2, 2.5)]


def test_the_runs_under_the_give_back_rule_are_counted_by_passes_with_their_rollbacks(gr, tmp_path):
    under = {"versus_best": {"worse": False, "gave_back": 0.01}}
    one = [{"step": 0, "action": "start", "loss": 5.0}, {"step": 10, "action": "best", "loss": 1.0, **under}]
    rolled = [*one, {"step": 20, "action": "rollback", "loss": 2.0, "versus_best": {"worse": True, "gave_back": 0.25}}]
    board = {"regime": "lora", "units": {
        "leadline": {"run": {"passes": 1, "checks": one}},
        "leadline_seed1": {"run": {"passes": 3, "checks": rolled}},
        "leadline_seed2": {"run": {"checks": [{"step": 0, "action": "start", "loss": 5.0}]}},  # an earlier rule's
        "recipe": {"run": {}}}}
    path = tmp_path / "scoreboard_t.json"
    path.write_text(json.dumps(board))
    assert gr.runs_under_the_rule([path]) == {"one_pass": 1, "one_pass_rolled_back": 0, "several_passes": 1,
                                              "several_passes_rolled_back": 1}
