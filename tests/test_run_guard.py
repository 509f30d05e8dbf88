"""The guarded run: checks spread over the whole run, a rollback at a worsening, the kept model never
worse than the start and never silent, a given rate under the same guard."""

from __future__ import annotations

import json
import random

import pytest

from leadline.rate.guard import MAX_ROLLBACKS, Guard, check_plan, check_steps

pytest.importorskip("schedulefree")


# ---- the rule, on numbers ------------------------------------------------------------------
def test_a_run_of_twenty_steps_is_checked_at_least_three_times_after_its_opening():
    _, checks = check_plan(256, 16, 20)
    at = check_steps(20, start=2, checks=checks)
    assert len(at) >= 3 and at[-1] == 20 and all(2 < s <= 20 for s in at)
    _, checks = check_plan(256, 16, 250)
    assert checks >= 8 and len(check_steps(250, 25, checks)) >= 8


def test_the_checks_together_read_at_most_the_share_of_the_steps_forwards_where_the_least_rows_allow():
    for held, rps, steps in ((256, 16, 250), (256, 16, 2000), (100, 8, 600), (256, 32, 400)):
        rows, checks = check_plan(held, rps, steps)
        assert rows * checks <= 0.05 * 3 * rps * steps + 1e-9 or rows == min(32, held)


def test_a_run_failing_again_from_its_best_goes_one_check_further_back():
    g = Guard(rate=0.01, looks=8)
    g.start(0, [2.0, 2.1, 1.9, 2.0, 2.05])
    assert g.check(10, [1.0, 1.1, 0.9, 1.0, 1.05]).action == "best"
    assert g.check(20, [0.5, 0.6, 0.4, 0.5, 0.55]).action == "best"
    first = g.check(30, [9.0, 9.5, 8.5, 9.2, 9.1])
    assert (first.action, first.to_step, first.lr) == ("rollback", 20, 0.005)
    again = g.check(40, [9.0, 9.5, 8.5, 9.2, 9.1])
    assert (again.action, again.to_step, again.further_back, again.lr) == ("rollback", 10, True, 0.0025)


def test_after_the_last_allowed_rollback_a_worsening_stops_the_run_at_its_best():
    rng = random.Random(0)
    start = [2.0 + 0.2 * rng.random() for _ in range(32)]
    worse = [x + 5.0 + rng.random() for x in start]
    g = Guard(rate=1.0, looks=8)
    g.start(0, start)
    for k in range(MAX_ROLLBACKS):
        assert g.check(10 * (k + 1), worse).action == "rollback"
    stop = g.check(50, worse)
    assert (stop.action, stop.to_step, g.kept_step) == ("stop", 0, 0)
    assert g.rate == 1.0 * 0.5 ** MAX_ROLLBACKS


# ---- the run, on the tiny model --------------------------------------------------------------
def _rows(path, n=400, seed=0, numbers=99):
    from helpers import section_rows

    return section_rows(path, n, seed, numbers)


def _run(tmp_path, monkeypatch=None, fault_at=None, **options):
    from helpers import make_model, make_tokenizer
    from leadline.run import RunOptions, run_in_one

    if fault_at is not None:  # the rate multiplied 10^4 for one step: the weights thrown far off
        import schedulefree

        import leadline.run.opening as opening

        fired = []

        class Faulty(schedulefree.AdamWScheduleFree):
            def step(self, closure=None):
                if not fired and self.param_groups[0]["k"] == fault_at:
                    fired.append(True)
                    lr = self.param_groups[0]["lr"]
                    self.param_groups[0]["lr"] = lr * 1e4
                    try:
                        return super().step(closure)
                    finally:
                        self.param_groups[0]["lr"] = lr
                return super().step(closure)

        monkeypatch.setattr(opening, "optimizer", lambda params, lr, warmup: Faulty(
            params, lr=lr, warmup_steps=warmup, weight_decay=0.0))
    tok = make_tokenizer()
    data = tmp_path / "train.jsonl"
    if not data.exists():
        _rows(data)
    return run_in_one(make_model(vocab_size=len(tok)), tok, str(data), RunOptions(total_steps=40, **options))


def test_every_row_not_held_out_for_the_decisions_trains(tmp_path):
    from helpers import make_model, make_tokenizer
    from leadline.run import RunOptions, race_only

    tok = make_tokenizer()
    plan = race_only(make_model(vocab_size=len(tok)), tok, str(_rows(tmp_path / "t.jsonl")), RunOptions(total_steps=4))
    assert len(plan.held_out["train"]) >= 360 and len(plan.held_out["held_out"]) == 40 and not plan.held_out["test"]



def test_the_held_out_rows_no_check_reads_train_after_the_opening_by_default(tmp_path):
    """The 40 held-out rows are read by the opening; after it the 8 the checks do not read join the
    training rows and lengthen the one pass (360 + 8 rows: 23 steps of 16, not 22); the checks and
    the before/after verdict read the other 32 alone. ``train_held_out=False`` keeps all 40 out."""
    from helpers import make_model, make_tokenizer
    from leadline.run import RunOptions, run_in_one

    tok = make_tokenizer()
    data = str(_rows(tmp_path / "t.jsonl"))
    plan, res = run_in_one(make_model(vocab_size=len(tok)), tok, data, RunOptions(epochs=1))
    _, base = run_in_one(make_model(vocab_size=len(tok)), tok, data, RunOptions(epochs=1, train_held_out=False))
    assert (base.train_rows, res.train_rows) == (360, 368) and (base.steps, res.steps) == (22, 23)
    assert res.cost.check_rows == res.held_out_before.rows == res.held_out_after.rows == 32
    assert base.held_out_before.rows == base.held_out_after.rows == 40
    assert any("the held-out rows no check reads (8) trained" in n for n in plan.notes)
    _, fixed = run_in_one(make_model(vocab_size=len(tok)), tok, data, RunOptions(total_steps=10))
    assert fixed.steps == 10 and fixed.train_rows == 368  # a length the caller gave stays

def test_a_rate_thrown_past_divergence_mid_run_is_rolled_back_and_the_run_ends_within_the_unfaulted_runs_noise(
        tmp_path, monkeypatch):
    """The rate multiplied 10^4 for one step at step 30 of 40: the guard rolls back to its last check
    before it at half the rate, and the run ends within the spread of three unfaulted seeds."""
    from leadline.plan import Value

    _rows(tmp_path / "train.jsonl", numbers=3)
    rate = Value(1e-2, "given", "the caller's rate", unit="per step")
    clean = [_run(tmp_path, rate=rate, seed=seed)[1].held_out_after for seed in (0, 1, 2)]
    plan, faulted = _run(tmp_path, monkeypatch, fault_at=30, rate=rate, seed=0)
    rolled = [c for c in faulted.checks if c["action"] == "rollback"]
    assert rolled and rolled[0]["step"] > 30 and rolled[0]["to_step"] <= 30 and rolled[0]["lr"] == 5e-3
    assert faulted.outcome == "improved" and plan["guard"].value == len(rolled)
    a = faulted.held_out_after
    spread = max(c.mean for c in clean) - min(c.mean for c in clean)
    assert a.mean <= max(c.mean for c in clean) + spread, (a, clean)
    assert a.mean < 0.5 * faulted.held_out_before.mean


@pytest.mark.parametrize("lr", ["1", "30"])
def test_a_given_rate_runs_under_the_guard_and_the_model_kept_is_no_worse_than_its_start(tmp_path, lr):
    """``leadline run --lr X`` on the tiny model's LoRA adapter: no race, the guard reads the run; at
    30 the steps diverge, the guard rolls back and halves the rate. Either way the model kept reads
    no worse than the start on the held-out rows, and the exit status says whether it improved.
    (At 1 this adapter learns slowly without a spike: nothing to roll back.)"""
    from helpers import save_model_dir
    from leadline.cli import main

    out = tmp_path / "run"
    rc = main(["run", "--model", str(save_model_dir(tmp_path / "m")), "--data", str(_rows(tmp_path / "t.jsonl")),
               "--lora-rank", "4", "--steps", "40", "--lr", lr, "--device", "cpu", "--out", str(out)])
    record = json.loads((out / "run.json").read_text())
    plan = json.loads((out / "plan.json").read_text())
    assert plan["values"]["lr"]["kind"] == "given" and record["cost"]["overhead_steps"] == 0
    assert len([c for c in record["checks"] if c["action"] != "start"]) >= 3
    assert rc == (0 if record["outcome"] == "improved" else 3)
    assert record["held_out_after"]["mean"] <= record["held_out_before"]["mean"]
    if lr == "30":
        rolled = [c for c in record["checks"] if c["action"] == "rollback"]
        assert rolled and rolled[0]["lr"] == 15.0 and record["lr"] < 30.0


def test_a_run_whose_kept_model_collapses_says_so_and_exits_three(tmp_path, monkeypatch, capsys):
    """The kept model answers one section for every held-out row (its answers faked): the command
    prints the sentence, writes the adapter marked in run.json, and exits 3."""
    import leadline.run.end as rule
    from helpers import save_model_dir
    from leadline.cli import main

    monkeypatch.setattr(rule, "answers_chosen", lambda model, rows, asked, *a, **k: [0] * len(asked))
    model = save_model_dir(tmp_path / "m")
    out = tmp_path / "run"
    rc = main(["run", "--model", str(model), "--data", str(_rows(tmp_path / "t.jsonl")), "--lora-rank", "4",
               "--steps", "6", "--device", "cpu", "--out", str(out)])
    said = capsys.readouterr().out
    record = json.loads((out / "run.json").read_text())
    assert rc == 3 and record["outcome"] == "collapsed" and "collapsed" in said
    assert (out / "adapter_config.json").exists()


def test_a_run_no_better_than_its_start_keeps_the_start_writes_no_adapter_and_exits_three(tmp_path, capsys):
    """A rate of 10^4 on a LoRA adapter: every step diverges, the guard rolls
    back until it stops at the start; the command says so and writes no adapter."""
    from helpers import save_model_dir
    from leadline.cli import main

    model = save_model_dir(tmp_path / "m")
    out = tmp_path / "run"
    rc = main(["run", "--model", str(model), "--data", str(_rows(tmp_path / "t.jsonl")), "--lora-rank", "4",
               "--steps", "24", "--lr", "10000", "--device", "cpu", "--out", str(out)])
    said = capsys.readouterr().out
    record = json.loads((out / "run.json").read_text())
    assert rc == 3 and record["outcome"] == "no_better_than_start", said
    assert "no better than it started" in said and not (out / "adapter_config.json").exists()
    assert record["held_out_after"]["mean"] == record["held_out_before"]["mean"]
    assert any(c["action"] == "rollback" for c in record["checks"])


def test_leadline_run_prints_the_loss_before_and_after_and_each_rollback(tmp_path, capsys):
    from helpers import save_model_dir
    from leadline.cli import main

    model = save_model_dir(tmp_path / "m")
    out = tmp_path / "run"
    rc = main(["run", "--model", str(model), "--data", str(_rows(tmp_path / "t.jsonl")), "--lora-rank", "4",
               "--steps", "24", "--lr", "0.02", "--test-share", "0.1", "--device", "cpu", "--out", str(out)])
    said = capsys.readouterr().out
    record = json.loads((out / "run.json").read_text())
    assert rc == 0, said
    assert "held-out loss" in said and " before, " in said and "test share loss" in said
    assert record["test_source"] == "test share" and record["load_seconds"] > 0
    assert len([c for c in record["checks"] if c["action"] != "start"]) >= 3
    for c in record["checks"]:
        if c["action"] == "rollback":
            assert f"step {c['step']}: held-out loss" in said


def test_your_own_eval_rows_are_read_before_and_after_and_never_train(tmp_path, capsys):
    """--eval FILE: the verdict is on the user's rows (tokenized as the training rows), none of which
    trains or decides; the training rows keep only the decisions' held-out share out."""
    from helpers import save_model_dir
    from leadline.cli import main

    train, dev = _rows(tmp_path / "t.jsonl"), _rows(tmp_path / "dev.jsonl", n=24, seed=1)
    out = tmp_path / "run"
    rc = main(["run", "--model", str(save_model_dir(tmp_path / "m")), "--data", str(train), "--lora-rank", "4",
               "--steps", "8", "--eval", str(dev), "--device", "cpu", "--out", str(out)])
    said = capsys.readouterr().out
    record = json.loads((out / "run.json").read_text())
    plan = json.loads((out / "plan.json").read_text())
    assert rc in (0, 3) and record["test_source"] == "eval rows" and record["test_rows"] == 24
    assert record["test_loss_before"]["mean"] != record["test_loss_after"]["mean"]
    assert plan["held_out"]["test"] == list(range(400, 424)) and len(plan["held_out"]["train"]) == 360
    assert "eval rows loss" in said


def test_leadline_run_trains_the_held_out_rows_no_check_reads_unless_told_not_to_and_full_refuses_it(tmp_path,
                                                                                                      capsys):
    from helpers import save_model_dir
    from leadline.cli import main

    model, data = save_model_dir(tmp_path / "m"), str(_rows(tmp_path / "t.jsonl"))
    for flag, rows in (([], 368), (["--no-train-held-out"], 360)):
        out = tmp_path / f"run{rows}"
        rc = main(["run", "--model", str(model), "--data", data, "--lora-rank", "4", *flag, "--epochs", "1",
                   "--device", "cpu", "--out", str(out)])
        said = capsys.readouterr()
        assert rc in (0, 3), said.err
        assert json.loads((out / "run.json").read_text())["train_rows"] == rows
    rc = main(["run", "--model", str(model), "--data", data, "--effort", "full", "--train-held-out",
               "--device", "cpu", "--out", str(tmp_path / "full")])
    assert rc == 2 and "--train-held-out belongs to --effort race" in capsys.readouterr().err
    assert not (tmp_path / "full").exists()


def test_a_card_that_runs_short_mid_run_halves_the_micro_batch_and_the_run_goes_on(tmp_path, monkeypatch):
    """An out-of-memory error inside a step (another process took memory after the fit) halves the
    micro-batch and takes the same step again; the plan says where; every step is taken."""
    import torch

    from helpers import make_model, make_tokenizer
    from leadline.run import RunOptions, run_in_one
    from leadline.run.task import Task

    real, raised = Task.train_step_of, []

    def train_step_of(self, micro_batch, grad_accum):
        inner = real(self, micro_batch, grad_accum)

        def step(s):
            if micro_batch == 16 and s == 12 and not raised:
                raised.append(s)
                raise torch.OutOfMemoryError("CUDA out of memory (made up)")
            return inner(s)
        return step

    tok, data = make_tokenizer(), str(_rows(tmp_path / "t.jsonl"))
    one_pass = RunOptions(epochs=1, train_held_out=False)  # 22 steps of the 360 rows not held out
    _, base = run_in_one(make_model(vocab_size=len(tok)), tok, data, one_pass)
    monkeypatch.setattr(Task, "train_step_of", train_step_of)
    plan, res = run_in_one(make_model(vocab_size=len(tok)), tok, data, one_pass)
    assert raised == [12] and res.micro_batch == 8 and res.grad_accum == 2
    assert res.steps == 22 and len(res.curve) == 22 - res.cost.kept_steps and res.curve[-1]["step"] == 21
    assert res.outcome == base.outcome  # the same run: the same rows a step, summed in two halves from step 12
    assert abs(res.held_out_after.mean - base.held_out_after.mean) < 1e-3
    assert plan.micro_batch == 8 and "8 at step 12" in plan["micro_batch"].source
    assert any("ran out of memory during the run" in n for n in plan.notes)


def _noisy(mean: float, n: int = 64, spread: float = 0.05, seed: int = 0) -> list[float]:
    import random

    rng = random.Random(seed)
    return [mean + spread * rng.uniform(-1, 1) for _ in range(n)]


def test_a_significant_wobble_that_gives_back_little_of_the_fall_is_no_rollback():
    """A one-pass run's check significantly worse than its best, but only 1.2% of the start-to-best
    fall given back (the wobble the recorded one-pass rollbacks were): kept, the rate untouched."""
    from leadline.rate.guard import GIVE_BACK, Guard

    g = Guard(rate=2.5e-3, looks=8)
    g.start(0, _noisy(8.6))
    assert g.check(10, _noisy(0.35, seed=1)).action == "best"
    said = g.check(20, _noisy(0.45, seed=1))
    assert said.action == "keep" and g.rate == 2.5e-3
    v = g.records[-1]["versus_best"]
    assert v["worse"] and v["gave_back"] < GIVE_BACK  # significant, and small: a wobble
    assert g.check(30, _noisy(1.2, seed=1)).action == "rollback"  # 10% given back: gone wrong
    assert g.rate == 1.25e-3 and g.records[-1]["versus_best"]["gave_back"] >= GIVE_BACK


def test_a_check_no_better_than_the_start_rolls_back_at_once_whatever_the_bar_says():
    """Two rows are too few for the sequential bar to call anything significant at the first looks;
    a check that reads no better than the start rolls back all the same."""
    from leadline.rate.guard import Guard

    g = Guard(rate=1e-2, looks=8)
    g.start(0, [2.0, 2.2])
    assert g.check(5, [1.0, 1.3]).action == "best"
    said = g.check(10, [2.3, 2.0])
    assert said.action == "rollback" and said.to_step == 5 and said.lr == 5e-3
    assert g.records[-1]["versus_best"]["worse_than_start"] is True
    assert g.records[-1]["versus_best"]["worse"] is False  # the bar alone would have kept it


def test_a_run_of_no_given_length_goes_on_pass_by_pass_while_its_checks_improve_and_stops_at_five(tmp_path,
                                                                                                  monkeypatch):
    """Each pass's end is a check; the run adds a pass while that check is significantly below the one
    before it (here: always), up to five passes, each with the first pass's checks; the added steps
    are their own row of the phase table and run.json says how many passes ran."""
    import leadline.run.end as end
    from helpers import make_model, make_tokenizer
    from leadline.run import run_in_one

    asked = []
    monkeypatch.setattr(end, "still_improving", lambda last, before: asked.append((last, before)) or True)
    tok, data = make_tokenizer(), str(_rows(tmp_path / "t.jsonl"))
    plan, res = run_in_one(make_model(vocab_size=len(tok)), tok, data, out_dir=tmp_path / "run")
    assert res.passes == 5 and res.steps == 5 * 23 and res.extra_pass_steps == 4 * 23 and len(asked) == 4
    ends = [c for c in res.checks if c.get("why") == "the pass's end"]
    assert [c["step"] for c in ends] == [23, 46, 69, 92]
    scheduled = [c["step"] for c in res.checks if c.get("why") == "scheduled"]
    assert sum(23 < s < 46 for s in scheduled) == sum(0 < s < 23 for s in scheduled) > 0  # each pass its checks
    rows = {p.phase: p for p in plan.phases}
    assert rows["passes"].steps == 92 and rows["run"].steps == 23 - res.cost.kept_steps
    assert plan["total_steps"].value == 115 and "5 passes: the most a run takes" in plan["total_steps"].source
    assert json.loads((tmp_path / "run" / "run.json").read_text())["passes"] == 5


def test_a_run_whose_check_at_a_passs_end_no_longer_improves_stops_there(tmp_path, monkeypatch):
    import leadline.run.end as end
    from helpers import make_model, make_tokenizer
    from leadline.run import RunOptions, run_in_one

    verdicts = iter([True, False])
    monkeypatch.setattr(end, "still_improving", lambda last, before: next(verdicts))
    monkeypatch.setattr(end, "_collapsed", lambda *a, **k: False)  # the tiny model's answers are one answer
    tok, data = make_tokenizer(), str(_rows(tmp_path / "t.jsonl"))
    plan, res = run_in_one(make_model(vocab_size=len(tok)), tok, data)
    assert res.passes == 2 and res.steps == 46 and "2 passes: the run went on while" in plan["total_steps"].source
    _, given = run_in_one(make_model(vocab_size=len(tok)), tok, data, RunOptions(epochs=1))
    assert given.passes is None and given.steps == 23 and not [c for c in given.checks
                                                              if c.get("why") == "the pass's end"]


def test_a_passs_end_that_reads_flat_while_its_answers_collapsed_takes_another_pass(tmp_path, monkeypatch):
    """The pass rule reads flat at every pass's end; the answers are collapsed at the first pass's end
    only: the run takes a second pass and stops at its end, and the plan says why it went on."""
    import leadline.run.end as end
    from helpers import make_model, make_tokenizer
    from leadline.run import run_in_one

    collapsed = iter([True, False, False])  # the first pass's end, the second's, the kept model's
    asked: list[int | None] = []
    monkeypatch.setattr(end, "still_improving", lambda last, before: False)
    monkeypatch.setattr(end, "_collapsed", lambda opened, task, rows=None: asked.append(rows) or next(collapsed))
    tok, data = make_tokenizer(), str(_rows(tmp_path / "t.jsonl"))
    plan, res = run_in_one(make_model(vocab_size=len(tok)), tok, data)
    assert res.passes == 2 and res.steps == 46 and len(asked) == 3
    assert "2 passes: the run went on while" in plan["total_steps"].source
    assert [c["step"] for c in res.checks if c.get("why") == "the pass's end"] == [23, 46]


def test_a_run_that_reaches_five_passes_with_its_answers_collapsed_says_so(tmp_path, monkeypatch):
    import leadline.run.end as end
    from helpers import make_model, make_tokenizer
    from leadline.run import run_in_one

    monkeypatch.setattr(end, "still_improving", lambda last, before: False)
    monkeypatch.setattr(end, "_collapsed", lambda opened, task, rows=None: True)
    tok, data = make_tokenizer(), str(_rows(tmp_path / "t.jsonl"))
    plan, res = run_in_one(make_model(vocab_size=len(tok)), tok, data)
    assert res.passes == 5 and "held-out answers were one answer for most rows" in plan["total_steps"].source


def test_the_pass_rule_reads_the_pass_ends_check_against_the_check_half_a_pass_before_it(tmp_path, monkeypatch):
    """The real rule on the tiny model: every added pass followed a pass-end check significantly below
    the check before it, and a run that stopped short of five did so at a check that was not."""
    from helpers import make_model, make_tokenizer
    from leadline.run import run_in_one
    from leadline.run.length import MAX_PASSES

    tok, data = make_tokenizer(), str(_rows(tmp_path / "t.jsonl"))
    plan, res = run_in_one(make_model(vocab_size=len(tok)), tok, data)
    assert 1 <= res.passes <= MAX_PASSES and res.steps == res.passes * 23
    ends = [c for c in res.checks if c.get("why") == "the pass's end"]
    assert len(ends) == min(res.passes, MAX_PASSES - 1)
    if res.passes < MAX_PASSES:
        assert "stopped when it was not" in plan["total_steps"].source or "guard" in plan["total_steps"].source


def test_the_end_keeps_the_best_check_where_it_is_significantly_worse_however_little_it_gave_back():
    """A wobble too small to roll a run back (under 5% of the fall) still decides the end: the best
    check is kept where the end reads significantly worse than it."""
    from leadline.rate.guard import GIVE_BACK, Guard

    g = Guard(rate=2.5e-3, looks=4)
    g.start(0, _noisy(8.6))
    assert g.check(10, _noisy(0.24, seed=1)).action == "best"
    assert g.check(20, _noisy(0.30, seed=1)).action == "keep"  # significant, 0.7% of the fall: no rollback
    said = g.finish(30, _noisy(0.47, seed=1))
    assert said.action == "restore" and said.to_step == 10 and g.kept_step == 10
    assert g.records[-1]["versus_best"]["gave_back"] < GIVE_BACK
    assert g.rate == 2.5e-3 and g.rollbacks == 0  # the end chose, it halved nothing
