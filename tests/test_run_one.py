"""The default run (effort race): the opening race's rule, its collapse check, its budget, and a
run that continues from the race's kept steps equal to a run that took them itself."""

from __future__ import annotations

import json
import random

import pytest

from leadline.rate.opening import (
    Reading,
    answer_set,
    challenge,
    climb,
    collapsed,
    horizon,
    opening_rates,
)

pytest.importorskip("schedulefree")


def test_a_challenger_that_learns_the_format_fast_but_collapses_the_answers_is_dropped():
    """A synthetic four-class task: the high rate reads lower on the held-out rows (it learned the
    answer's format first) but answers one class for 90% of the rows, where the gold's majority
    is 25%. The default stays."""
    rng = random.Random(0)
    gold = [rng.randrange(4) for _ in range(40)]
    default = Reading(2.5e-3, [1.0 + 0.1 * rng.random() for _ in gold], choices=list(gold))
    fast = [0.5 * x for x in default.losses]
    high_choices = [0] * 36 + [1, 2, 3, 1]
    high = Reading(1e-2, fast, choices=high_choices, collapsed=collapsed(high_choices, gold))
    assert high.collapsed
    test = challenge(default, high)
    assert test["better"] and not test["replaces"]  # lower loss, still dropped
    table = {2.5e-3: default, 1e-2: high, 6.25e-4: Reading(6.25e-4, [x + 0.2 for x in default.losses])}
    decision, ran = climb(table.__getitem__, [2.5e-3, 1e-2, 6.25e-4])  # the rule, given a higher rate too
    assert decision.lr == 2.5e-3 and sorted(ran) == [6.25e-4, 2.5e-3, 1e-2]
    assert "collapsed" in decision.sentence()


def test_no_rate_reaches_the_run_without_beating_the_default_by_a_paired_test():
    base = [1.0, 1.2, 0.9, 1.1, 1.05, 0.95, 1.0, 1.1]
    noisy_lower = [x - d for x, d in zip(base, [0.3, -0.3, 0.2, -0.25, 0.1, -0.05, 0.0, 0.05])]  # lower mean, no t
    table = {2.5e-4: Reading(2.5e-4, base), 1e-3: Reading(1e-3, noisy_lower), 6.25e-5: Reading(6.25e-5, noisy_lower)}
    decision, _ = climb(table.__getitem__, [2.5e-4, 1e-3, 6.25e-5])
    assert decision.lr == 2.5e-4
    assert [t["replaces"] for t in decision.tests] == [False, False]


def test_the_default_run_races_no_rate_above_the_default():
    """An opening horizon favours fast rates: the default run's candidates are the default and a
    quarter of it, and a higher rate reaches the run only where the user gives it (--lr)."""
    for trained_as in ("factors", "weights"):
        c, *others = opening_rates(trained_as)
        assert others == [c / 4]


def test_the_losers_steps_fit_the_share_of_the_run():
    for steps in (10, 25, 50, 107, 400, 3000):
        for share in (0.1, 0.2, 0.3):
            h = horizon(steps, share)
            assert 2 * h <= share * steps
            assert h == 0 or h >= 2


def test_the_answer_set_is_read_from_the_scored_tokens_and_free_text_has_none():
    from leadline.corpus import TokenizedRow

    rows = [TokenizedRow.from_labels([5, 6, 7, a], [-100, -100, -100, a]) for a in (1, 2, 1, 3, 2)]
    assert sorted(answer_set(rows, range(5))) == [(1,), (2,), (3,)]
    free = [TokenizedRow.from_labels([5, i, i + 1], [-100, i, i + 1]) for i in range(40)]
    assert answer_set(free, range(40)) is None


def _rows(path, n=96, seed=0, numbers=99):
    from helpers import section_rows

    return section_rows(path, n, seed, numbers)


def test_the_run_that_kept_the_race_winners_steps_is_the_run_that_took_them_itself(tmp_path):
    """run_in_one on the tiny model, then the winner's rate trained from the same start for the
    same steps by a plain schedule-free loop: the same weights, bit for bit (the losers' steps
    and the held-out reads left no trace), and the saved model is the averaged weights at the
    pass the pass rule kept (20 steps of 16 rows are about four passes over these rows)."""
    import schedulefree
    import torch

    from helpers import make_model, make_tokenizer
    from leadline.hf import prepare, trained_named_weights
    from leadline.run import RunOptions, run_in_one
    from leadline.run.options import WARMUP_SHARE

    data = _rows(tmp_path / "train.jsonl")
    tok = make_tokenizer()
    model = make_model(vocab_size=len(tok))
    plan, res = run_in_one(model, tok, str(data), RunOptions(total_steps=20, decide_share=0.2), out_dir=tmp_path / "run")
    cost = res.cost.as_dict()
    assert plan.opening_steps == 2 and cost["overhead_steps"] in (0, 2) and cost["budget_held"]
    assert plan.lr in (2.5e-4, 6.25e-5)  # every weight trains
    assert plan["lr"].kind == ("measured" if cost["overhead_steps"] else "constant")  # measured where a rival raced
    assert res.rollbacks == 0 and res.kept_step == 20 and res.outcome == "improved"
    assert len(res.curve) == 18 and res.curve[0]["step"] == 2 and cost["steps_not_run"] == 0
    steps_counted = next(p for p in plan.phases if p.phase == "rate").steps
    assert steps_counted == 2 + cost["overhead_steps"]

    again = make_model(vocab_size=len(tok))
    task, _ = prepare(again, tok, str(data), seed=0, test=0.0)
    params = [p for _, p in trained_named_weights(again)]
    opt = schedulefree.AdamWScheduleFree(params, lr=plan.lr, warmup_steps=max(1, round(WARMUP_SHARE * 20)),
                                         weight_decay=0.0)
    step = task.train_step_of(plan.micro_batch, plan.grad_accum)
    again.train()
    opt.train()
    assert sum(1 for c in res.checks if c["action"] != "start") >= 3  # the guard read the run, and left no trace
    for s in range(res.kept_step):
        opt.zero_grad(set_to_none=True)
        step(s)
        opt.step()
    opt.eval()
    for (name, a), (_, b) in zip(trained_named_weights(model), trained_named_weights(again)):
        assert torch.equal(a, b), name
    saved = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert saved["values"]["optimizer"]["value"] == "schedule_free_adamw"
    assert json.loads((tmp_path / "run" / "run.json").read_text())["cost"]["kept_steps"] == 2


def test_a_run_too_short_to_race_trains_the_default_and_says_so(tmp_path):
    from helpers import make_model, make_tokenizer
    from leadline.run import RunOptions, run_in_one

    tok = make_tokenizer()
    plan, res = run_in_one(make_model(vocab_size=len(tok)), tok, str(_rows(tmp_path / "t.jsonl")),
                           RunOptions(total_steps=5))
    assert plan.lr == 2.5e-4 and plan["lr"].kind == "constant" and "too short to race" in plan["lr"].source
    assert plan["lr"].source.startswith("schedule-free's default, checked by the guard")
    assert res.cost.overhead_steps == 0 and len(res.curve) == 5


def test_the_rate_is_measured_only_where_a_challenger_raced_it(tmp_path, monkeypatch):
    """A default that learned over the opening is raced by nobody: a constant, "schedule-free's
    default, checked by the guard", with why no challenger ran; and its single reading is no race
    to draw. Where the default stalls (here a rate too small to move the loss), its challenger runs
    and the rate is measured, whichever wins."""
    import leadline.run.opening as opening
    from helpers import make_model, make_tokenizer
    from leadline.report.html import render_plan
    from leadline.run import RunOptions, race_only

    tok, data = make_tokenizer(), str(_rows(tmp_path / "t.jsonl"))
    plan = race_only(make_model(vocab_size=len(tok)), tok, data, RunOptions(total_steps=20))
    lr = plan["lr"]
    assert lr.kind == "constant" and lr.value == 2.5e-4, lr
    assert lr.source.startswith("schedule-free's default, checked by the guard (a tenth of its 0.0025")
    assert "no challenger ran: 0.00025 learned in its 2 opening steps" in lr.source and "won" not in lr.source
    assert list(lr.evidence["readings"]) == ["0.00025"]  # the default's reading is kept as evidence
    assert "the opening race: held-out loss" not in render_plan(plan)

    monkeypatch.setattr(opening, "opening_rates", lambda trained_as: (1e-12, 2.5e-13))
    plan = race_only(make_model(vocab_size=len(tok)), tok, data, RunOptions(total_steps=20))
    assert plan["lr"].kind == "measured" and plan["lr"].source.startswith("won the opening race")
    assert len(plan["lr"].evidence["readings"]) == 2


def test_leadline_run_races_by_default_and_refuses_a_share_out_of_range(tmp_path, capsys):
    from helpers import save_model_dir
    from leadline.cli import main

    model = save_model_dir(tmp_path / "tiny")
    data = _rows(tmp_path / "train.jsonl")
    assert main(["run", "--model", str(model), "--data", str(data), "--decide-share", "1.5",
                 "--out", str(tmp_path / "bad")]) == 2
    assert "--decide-share 1.5" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    assert main(["run", "--model", str(model), "--data", str(data), "--steps", "20", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "schedule-free AdamW" in out and "overhead" in out and "the rate: " in out
    table = out[:out.index("\n\n")].splitlines()  # the plan's first lines: the numbers to train with
    assert table[0].strip() == "train with:" and all(len(line) <= 100 for line in table), table
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["optimizer"] == "schedule_free_adamw" and run["steps"] == 20 and "load_seconds" in run


def test_a_default_that_learned_is_not_challenged_from_below():
    """The downward challenge costs h steps it cannot win over an opening where the default
    learned; it runs only where the default stalled (too high to learn), on the same test."""
    start = [3.0, 3.2, 2.9, 3.1, 3.0, 3.05]
    learned = Reading(2.5e-3, [x - 1.0 for x in start])
    too_high = Reading(1e-2, [x + 0.5 for x in start])
    below = Reading(6.25e-4, [x - 1.5 for x in start])  # would read lower: it never runs
    table = {r.lr: r for r in (learned, too_high, below)}
    decision, ran = climb(table.__getitem__, [2.5e-3, 1e-2, 6.25e-4], start=start)
    assert decision.lr == 2.5e-3 and sorted(ran) == [2.5e-3, 1e-2]
    stuck = Reading(2.5e-3, [x + 0.01 for x in start])  # the default made no headway: the lower rate runs
    table[2.5e-3] = stuck
    decision, ran = climb(table.__getitem__, [2.5e-3, 1e-2, 6.25e-4], start=start)
    assert decision.lr == 6.25e-4 and sorted(ran) == [6.25e-4, 2.5e-3, 1e-2]
    decision, ran = climb(table.__getitem__, opening_rates("factors"), start=start)  # the default run's race
    assert decision.lr == 6.25e-4 and sorted(ran) == [6.25e-4, 2.5e-3]


@pytest.mark.parametrize("call", ["race_only", "run_in_one"])
def test_a_race_cut_short_leaves_the_model_as_it_found_it(tmp_path, monkeypatch, call):
    """The race interrupted after its first candidate's steps (a Ctrl-C, or an error in a read), in
    the race alone and in the run: the trained tensors, their grads, the RNG and the mode are the
    start's, and the run wrote nothing."""
    import torch

    import leadline.run as run
    import leadline.run.opening as opening
    from helpers import make_model, make_tokenizer

    def interrupted(run, rates, start=None):
        run(rates[0])  # h steps taken on the model
        raise KeyboardInterrupt

    monkeypatch.setattr(opening, "climb", interrupted)
    tok = make_tokenizer()
    model = make_model(vocab_size=len(tok))
    model.eval()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rng = torch.get_rng_state()
    with pytest.raises(KeyboardInterrupt):
        getattr(run, call)(model, tok, str(_rows(tmp_path / "t.jsonl")), run.RunOptions(total_steps=20),
                           out_dir=tmp_path / "run")
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert all(p.grad is None for p in model.parameters()) and not model.training
    assert torch.equal(rng, torch.get_rng_state()) and not (tmp_path / "run").exists()


def test_a_step_the_caller_gives_is_listed_as_given(tmp_path):
    from helpers import make_model, make_tokenizer
    from leadline.run import RunOptions, race_only

    tok = make_tokenizer()
    data = str(_rows(tmp_path / "t.jsonl"))
    given = race_only(make_model(vocab_size=len(tok)), tok, data, RunOptions(total_steps=4, rows_per_step=8))
    default = race_only(make_model(vocab_size=len(tok)), tok, data, RunOptions(total_steps=4))
    assert (given["rows_per_step"].kind, given.rows_per_step) == ("given", 8)
    assert (default["rows_per_step"].kind, default.rows_per_step) == ("constant", 16)


def test_the_kept_micro_batch_is_the_most_rows_dividing_the_step_that_fit_whatever_the_time(monkeypatch):
    """The default run's micro-batch on a card: each out-of-memory error halves it to the next
    divisor of the step, and no clock cuts the search short. A card that fits 5 rows of the longest
    length keeps 4 of a 16-row step (the bisection's truth, 5, is no divisor of 16: accumulation
    makes up the step), one that fits 12 of a 12-row step keeps all 12, one that fits 1 keeps 1."""
    import torch

    from leadline.run.fit import micro_batch

    class Task:
        device = "cuda:0"
        seq_len = 4096

        def __init__(self, fits: int) -> None:
            self.fits, self.asked = fits, []
            self.model = torch.nn.Linear(2, 2)

        def loss_of(self, rows: int, length: int) -> torch.Tensor:
            self.asked.append(rows)
            if rows > self.fits:
                raise torch.OutOfMemoryError("CUDA out of memory (a test's)")
            return self.model(torch.ones(rows, 2)).sum()

    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    for fits, step, kept, asked in ((5, 16, 4, [16, 8, 4]), (12, 12, 12, [12]), (1, 16, 1, [16, 8, 4, 2, 1]),
                                    (7, 12, 6, [12, 6])):
        task = Task(fits)
        mb, tried = micro_batch(task, step)
        assert (mb, task.asked) == (kept, asked), fits
        assert [t["verdict"] for t in tried] == ["out of memory"] * (len(asked) - 1) + ["runs"]
        assert task.model.weight.grad is None  # the probe's gradients are not the run's


@pytest.mark.parametrize("lower", [False, True])
def test_the_answers_are_read_only_for_a_challenger_that_reads_lower_than_the_default(tmp_path, monkeypatch, lower):
    """The collapse check can only stop a challenger that would replace the default; one that does
    not read lower by the paired test costs no read of its answers (on the CPU the answers of 64
    rows took most of the race's reads)."""
    import leadline.rate.opening as rule
    import leadline.run.opening as opening
    from helpers import make_model, make_tokenizer
    from leadline.rate.compare import Verdict
    from leadline.run import RunOptions, race_only

    asked: list[int] = []
    monkeypatch.setattr(rule, "stalled", lambda start, reading: True)  # the default stalled: c/4 challenges
    monkeypatch.setattr(opening, "compare", lambda a, b, alpha: Verdict(worse=not lower, better=lower, bar=1.0,
                                                                          diff=None))
    monkeypatch.setattr(opening, "answers_chosen", lambda *a, **k: asked.append(1) or [0] * len(a[2]))
    tok = make_tokenizer()
    plan = race_only(make_model(vocab_size=len(tok)), tok, str(_rows(tmp_path / "t.jsonl")), RunOptions(total_steps=20))
    assert plan["lr"].kind == "measured"
    ran = [t for t in plan["lr"].evidence["tests"] if t.get("ran", True)]  # c/4, where c stalled
    assert len(asked) == (len(ran) if lower else 0) and ran


def test_a_start_read_that_fails_leaves_the_model_in_the_mode_it_was_given(tmp_path, monkeypatch):
    import torch

    from helpers import make_model, make_tokenizer
    from leadline.run import RunOptions, run_in_one
    from leadline.run.task import Task

    def broken(self):
        def read():
            raise RuntimeError("the card went away")
        return read

    monkeypatch.setattr(Task, "held_out_losses", broken)
    tok = make_tokenizer()
    model = make_model(vocab_size=len(tok))
    model.eval()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="went away"):
        run_in_one(model, tok, str(_rows(tmp_path / "t.jsonl")), RunOptions(total_steps=20))
    assert model.training is False
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_derive_for_then_train_with_plan_prepares_the_rows_once_and_trains_as_a_fresh_preparation(tmp_path,
                                                                                                   monkeypatch):
    """The race's rows ride on the plan (never in its JSON) and the run reuses them: one preparation
    for derive_for and train_with_plan; the run is the one a plan read back from JSON trains."""
    import leadline.run.task as task_module
    from helpers import make_model, make_tokenizer
    from leadline.hf import derive_for
    from leadline.plan import Plan
    from leadline.train import train_with_plan

    tok, data = make_tokenizer(), str(_rows(tmp_path / "t.jsonl"))
    calls, real = [], task_module.prepare
    monkeypatch.setattr(task_module, "prepare", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = make_model(vocab_size=len(tok))
    plan = derive_for(model, tok, data, total_steps=8)
    assert plan.prepared is not None and "prepared" not in plan.to_json()
    reused = train_with_plan(model, tok, data, plan)
    assert len(calls) == 1
    fresh = train_with_plan(make_model(vocab_size=len(tok)), tok, data, Plan.from_json(plan.to_json()))
    assert len(calls) == 2
    assert [r["loss"] for r in reused["curve"]] == [r["loss"] for r in fresh["curve"]]
    other = str(_rows(tmp_path / "u.jsonl", seed=1))
    train_with_plan(make_model(vocab_size=len(tok)), tok, other, plan)  # other rows: prepared again
    assert len(calls) == 3
