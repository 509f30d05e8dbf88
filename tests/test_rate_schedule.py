"""LookaheadSchedule: a planted loss spike rolls back bit-exactly and halves; a failure from the
same check goes further back; finish() keeps the decayed ending unless a test says the constant one is better."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from leadline.errors import InputError  # noqa: E402
from leadline.lookahead.rate import LookaheadSchedule, lookahead_from  # noqa: E402
from leadline.plan import Plan, Value  # noqa: E402
from test_rate_toys import Regression  # noqa: E402


def config(lr: float, h: int = 8, warmup: int = 0, alpha1: float | None = None):
    return lookahead_from({"lr": lr, "alpha1": alpha1 or lr, "warmup_steps": warmup, "lookahead_horizon_steps": h})


def run(toy: Regression, sched: LookaheadSchedule, steps: int, at_checks: dict | None = None) -> None:
    for t in range(steps):
        if at_checks is not None and t % sched.h == 0:
            at_checks[t] = (toy.w.detach().clone(), {k: v.clone() for k, v in toy.opt.state.get(toy.w, {}).items()})
        sched.before(t)
        toy.opt.zero_grad(set_to_none=True)
        toy.train_step(t)
        toy.opt.step()


def test_a_planted_spike_rolls_back_bit_exactly_to_the_best_check_and_halves_the_rate():
    toy = Regression(seed=0, dim=32)
    toy.spike = set(range(20, 24))  # four steps on targets x -20: the held-out loss jumps
    sched = LookaheadSchedule(toy.params, toy.opt, toy.train_step, toy.held_out, config(0.01), total_steps=64)
    states: dict[int, tuple] = {}
    for t in range(33):
        if t % 8 == 0:
            states[t] = (toy.w.detach().clone(), {k: v.clone() for k, v in toy.opt.state.get(toy.w, {}).items()})
        sched.before(t)
        if t < 32:
            toy.opt.zero_grad(set_to_none=True)
            toy.train_step(t)
            toy.opt.step()
        else:
            break
    last = sched.checks[-1]
    assert last["step"] == 32 and last["action"] == "rollback"
    assert last["versus_best"]["t"] > last["versus_best"]["bar"] and last["versus_best"]["gave_back"] >= 0.05
    target = last["to_step"]
    assert [c["action"] for c in sched.checks if c["step"] == target] == ["best"]
    w, opt_state = states[target]
    assert torch.equal(toy.w, w)  # bit-exactly the best check's weights ...
    for k, v in opt_state.items():  # ... and its optimizer state
        assert torch.equal(toy.opt.state[toy.w][k], v)
    assert sched.rate == 0.005 and toy.opt.param_groups[0]["lr"] == 0.005


def test_failing_again_from_the_same_check_goes_back_further_to_step_zero():
    """The check the first rollback went to was already bad (its Adam state carries the
    spike): the run fails again from it, and the schedule goes back past it — with
    keep_checks=2, to step 0, where the warmup from alpha1 starts again."""
    toy = Regression(seed=0, dim=32)
    toy.spike = set(range(20, 24))
    w0 = toy.w.detach().clone()
    sched = LookaheadSchedule(toy.params, toy.opt, toy.train_step, toy.held_out,
                              config(0.01, warmup=4, alpha1=0.002), total_steps=64, keep_checks=2)
    run(toy, sched, 40)
    sched.before(40)
    actions = [(c["step"], c["action"], c.get("to_step")) for c in sched.checks]
    assert actions[-2:] == [(32, "rollback", 24), (40, "rollback", 0)]
    assert sched.checks[-1]["further_back"] is True
    assert torch.equal(toy.w, w0) and toy.w not in toy.opt.state  # step 0: weights, a fresh optimizer
    assert sched.rate == 0.0025 and sched.warm_from == 40
    assert toy.opt.param_groups[0]["lr"] == pytest.approx(0.002)  # warming up from alpha1 again


def test_the_checks_are_the_guards_decisions_and_each_kept_check_has_one_copy():
    """The schedule decides through :class:`leadline.rate.guard.Guard`: its checks are the guard's
    readings (its start a best, its restore a final rollback) at the rate the run takes, and it
    holds a copy for each check the guard keeps: the suspect check it went back past is freed."""
    toy = Regression(seed=0, dim=32)
    toy.spike = set(range(20, 24))
    sched = LookaheadSchedule(toy.params, toy.opt, toy.train_step, toy.held_out,
                              config(0.01, warmup=4, alpha1=0.002), total_steps=64, keep_checks=2)
    run(toy, sched, 40)
    sched.before(40)
    assert [s for s, _ in sched.guard.chain] == sorted(sched.snapshots) == [0]
    run_on = {"start": "best"}
    assert [(c["step"], c["action"], c.get("to_step"), c["loss"], c["se"], c.get("versus_best"))
            for c in sched.checks] == [(r["step"], run_on.get(r["action"], r["action"]), r.get("to_step"), r["loss"],
                                        r["se"], r.get("versus_best")) for r in sched.guard.records]
    assert sched.rate == sched.guard.rate == 0.0025
    assert sched.checks[-1]["lr"] == pytest.approx(0.002) != sched.guard.records[-1]["lr"]  # the warmup's rate


def test_an_end_significantly_worse_than_the_best_check_puts_the_best_back_bit_exactly():
    """The guard's final check restores the best check; the schedule records it as a final rollback."""
    toy = Regression(seed=0, dim=32)
    toy.spike = set(range(56, 64))  # the last eight steps pull the weights far away: at this rate, by more
    cfg = lookahead_from({"lr": 0.15, "alpha1": 0.15, "lookahead_horizon_steps": 8}, ending="to_zero")  # than 5%
    sched = LookaheadSchedule(toy.params, toy.opt, toy.train_step, toy.held_out, cfg, total_steps=64)
    states: dict[int, tuple] = {}
    run(toy, sched, 64, at_checks=states)
    sched.finish()
    last = sched.checks[-1]
    assert (last["step"], last["action"], last["final"]) == (64, "rollback", True)
    assert sched.guard.records[-1]["action"] == "restore" and last["to_step"] == sched.guard.best_step == 56
    assert last["versus_best"]["t"] > last["versus_best"]["bar"] and last["versus_best"]["gave_back"] >= 0.05
    w, opt_state = states[56]
    assert torch.equal(toy.w, w)
    for k, v in opt_state.items():
        assert torch.equal(toy.opt.state[toy.w][k], v)
    assert sched.rollbacks == sum(c["action"] == "rollback" for c in sched.checks)  # the end's restore among them
    assert sched.snapshots == {}  # the copies go once the run is finished


def test_finish_keeps_the_decayed_ending_when_it_is_significantly_better():
    """One length raced (``ending_steps``): the last 16 steps rerun with the rate decaying."""
    toy = Regression(seed=0, dim=32)
    cfg = lookahead_from({"lr": 0.08, "alpha1": 0.08, "lookahead_horizon_steps": 8}, ending_steps=16)
    sched = LookaheadSchedule(toy.params, toy.opt, toy.train_step, toy.held_out, cfg, total_steps=64)
    run(toy, sched, 64)
    ending = sched.finish()
    assert ending["kept"] == "decay" and ending["from_step"] == 48 and len(ending["decays"]) == 1
    assert ending["constant_versus_decay"]["t"] > ending["constant_versus_decay"]["bar"]
    # the model holds the decayed ending: its held-out loss is the one read for it
    assert sum(toy.held_out()) / 256 == pytest.approx(ending["decay"]["loss"])
    assert toy.calls[-16:] == list(range(48, 64))  # the same 2h steps, rerun
    values = sched.as_values()
    assert values["ending"].value == "decay" and values["schedule_rollbacks"].evidence["plot"] == "schedule"


def test_finish_races_the_last_half_against_the_last_2h_and_keeps_the_better_decay():
    """By default two endings are raced: the last half (from T/2) and the last 2h, each rerun
    from its own copy; on a noisy regression at a high rate the longer decay averages more
    noise away, reads lower, and is the one the model holds."""
    toy = Regression(seed=0, dim=32)
    sched = LookaheadSchedule(toy.params, toy.opt, toy.train_step, toy.held_out, config(0.08), total_steps=64)
    run(toy, sched, 64)
    ending = sched.finish()
    by_start = {d["from_step"]: d for d in ending["decays"]}
    assert set(by_start) == {32, 48} and by_start[32]["steps"] == 32 and by_start[48]["steps"] == 16
    assert by_start[32]["loss"] < by_start[48]["loss"]
    assert ending["kept"] == "decay" and ending["from_step"] == 32
    assert ending["decay"]["loss"] == by_start[32]["loss"]
    assert sum(toy.held_out()) / 256 == pytest.approx(by_start[32]["loss"])  # the model holds the half's ending
    assert toy.calls[-48:] == list(range(48, 64)) + list(range(32, 64))  # the 2h rerun first, then the half
    assert ending["why"].startswith("the last 16 and the last 32 steps each rerun from a copy")
    assert "the decay over the last 32 read lower on the held-out rows" in ending["why"]


def test_finish_keeps_the_decayed_ending_when_the_difference_is_not_significant():
    toy = Regression(seed=0, dim=32)
    noise = torch.Generator().manual_seed(7)

    def noisy_held_out() -> list[float]:  # per-row noise far above any difference an ending makes
        return [x + 5.0 * float(torch.randn((), generator=noise)) ** 2 for x in toy.held_out()]

    sched = LookaheadSchedule(toy.params, toy.opt, toy.train_step, noisy_held_out, config(0.08), total_steps=64)
    run(toy, sched, 64)
    end_w = toy.w.detach().clone()
    ending = sched.finish()
    assert ending["kept"] == "decay" and not ending["constant_versus_decay"]["better"]
    assert not torch.equal(toy.w, end_w)  # the model holds the decayed ending, not the run's end


def test_finish_keeps_the_constant_ending_bit_exactly_when_it_is_significantly_better():
    """A rate far too low for the run: every row's loss is still falling at the end, so halving
    the last 16 steps' progress leaves each row higher; the constant ending is put back."""
    toy = Regression(seed=0, dim=32)
    sched = LookaheadSchedule(toy.params, toy.opt, toy.train_step, toy.held_out, config(0.001), total_steps=64)
    run(toy, sched, 64)
    end_w = toy.w.detach().clone()
    end_state = {k: v.clone() for k, v in toy.opt.state[toy.w].items()}
    ending = sched.finish()
    assert ending["kept"] == "constant" and ending["constant_versus_decay"]["better"]
    assert ending["constant"]["loss"] < ending["decay"]["loss"]
    short, half = sorted(ending["decays"], key=lambda d: d["steps"])  # a longer decay gives up more progress
    assert (short["steps"], half["steps"]) == (16, 32) and short["loss"] < half["loss"]
    assert ending["decay"]["loss"] == short["loss"] and ending["from_step"] == 48
    assert torch.equal(toy.w, end_w)
    for k, v in end_state.items():
        assert torch.equal(toy.opt.state[toy.w][k], v)


def test_an_exception_inside_finish_puts_the_run_back_as_it_ended():
    toy = Regression(seed=0, dim=32)
    sched = LookaheadSchedule(toy.params, toy.opt, toy.train_step, toy.held_out, config(0.08), total_steps=64)
    run(toy, sched, 64)
    end_w = toy.w.detach().clone()
    end_state = {k: v.clone() for k, v in toy.opt.state[toy.w].items()}
    toy.fail_at = 55
    with pytest.raises(RuntimeError, match="planted"):
        sched.finish()
    assert torch.equal(toy.w, end_w)
    for k, v in end_state.items():
        assert torch.equal(toy.opt.state[toy.w][k], v)


def test_warmup_from_alpha1_then_the_rate_and_the_check_interval():
    toy = Regression()
    sched = LookaheadSchedule(toy.params, toy.opt, toy.train_step, toy.held_out,
                              config(0.01, h=100, warmup=10, alpha1=0.001), total_steps=64)
    assert sched.h == 8  # at most T/8
    assert [round(sched.lr_at(t), 6) for t in (0, 5, 10, 30)] == [0.001, 0.0055, 0.01, 0.01]
    sched.before(0)
    assert toy.opt.param_groups[0]["lr"] == 0.001
    with pytest.raises(InputError, match="increasing steps"):
        sched.before(0)


def test_lookahead_from_reads_a_plan():
    plan = Plan()
    plan.set("lr", Value(2e-4, "measured", "look-ahead"))
    plan.set("alpha1", Value(1e-4, "measured", "walk"))
    plan.set("warmup_steps", Value(10, "derived", "1/(1-beta1)"))
    plan.set("lookahead_horizon_steps", Value(32, "measured", "settled"))
    cfg = lookahead_from(Plan.from_json(plan.to_json()))
    assert (cfg.lr, cfg.alpha1, cfg.warmup_steps, cfg.horizon_steps) == (2e-4, 1e-4, 10, 32)
    with pytest.raises(InputError, match="lr"):
        lookahead_from(Plan())


def test_the_to_zero_ending_falls_linearly_to_zero_over_the_run_and_reruns_nothing():
    toy = Regression(seed=0, dim=32)
    cfg = lookahead_from({"lr": 0.04, "alpha1": 0.04, "lookahead_horizon_steps": 8}, ending="to_zero")
    sched = LookaheadSchedule(toy.params, toy.opt, toy.train_step, toy.held_out, cfg, total_steps=64)
    rates = []
    for t in range(64):
        sched.before(t)
        rates.append(toy.opt.param_groups[0]["lr"])
        toy.opt.zero_grad(set_to_none=True)
        toy.train_step(t)
        toy.opt.step()
    assert rates == pytest.approx([0.04 * (64 - t) / 64 for t in range(64)])
    assert sched.copies == []  # no copy for a raced ending
    ending = sched.finish()
    assert ending["kept"] == "to_zero" and (ending["from_step"], ending["to_step"]) == (0, 64)
    assert toy.calls == list(range(64))  # no step rerun
    assert sched.checks[-1]["action"] == "final"
    assert sched.as_values()["ending"].kind == "given"


def test_the_to_zero_ending_starts_after_the_steps_taken_elsewhere_and_halves_on_a_rollback():
    toy = Regression(seed=0, dim=32)
    toy.spike = set(range(20, 24))
    cfg = lookahead_from({"lr": 0.01, "alpha1": 0.01, "lookahead_horizon_steps": 8}, taken=(8, 0.01),
                         ending="to_zero")
    sched = LookaheadSchedule(toy.params, toy.opt, toy.train_step, toy.held_out, cfg, total_steps=64)
    assert [sched.lr_at(t) for t in (0, 7)] == [0.01, 0.01]  # the taken steps keep their rate
    assert sched.lr_at(8) == pytest.approx(0.01) and sched.lr_at(36) == pytest.approx(0.01 * 28 / 56)
    run(toy, sched, 33)
    assert sched.checks[-1]["action"] == "rollback"
    assert sched.lr_at(40) == pytest.approx(0.005 * 24 / 56)  # the halving applies on top of the decay


def test_an_unknown_ending_is_one_sentence():
    with pytest.raises(InputError, match="ending must be one of raced, to_zero"):
        lookahead_from({"lr": 1e-3}, ending="cosine")



def test_a_longer_raced_ending_copies_earlier_and_reruns_its_own_steps():
    """ending_steps=32 of 64: the copy at step 32, the last 32 steps rerun with the rate falling from
    the copy's rate to zero, and no other length raced (the default copies at 32 and 48)."""
    toy = Regression(seed=0, dim=32)
    cfg = lookahead_from({"lr": 0.08, "alpha1": 0.08, "lookahead_horizon_steps": 8}, ending_steps=32)
    sched = LookaheadSchedule(toy.params, toy.opt, toy.train_step, toy.held_out, cfg, total_steps=64)
    run(toy, sched, 64)
    assert [c.start for c in sched.copies] == [32]
    ran = len(toy.calls)
    ending = sched.finish()
    assert ending["from_step"] == 32 and toy.calls[ran:] == list(range(32, 64))
    assert "the last 32 steps rerun" in ending["why"]
    with pytest.raises(InputError, match="continue_at\\(40\\) leaves no room for the raced ending: the copy is taken "
                                         "at step 32"):
        s2 = LookaheadSchedule(toy.params, toy.opt, toy.train_step, toy.held_out,
                               lookahead_from({"lr": 0.08, "lookahead_horizon_steps": 8}, taken=(40, 0.08),
                                              ending_steps=32), total_steps=64)
        s2.before(0)
        s2.continue_at(40)


@pytest.mark.parametrize("kw, match", [({"ending_steps": 0}, "ending_steps must be a whole number of steps >= 1"),
                                        ({"ending_steps": 8, "ending": "to_zero"}, "races nothing")])
def test_a_raced_ending_length_that_cannot_be_is_one_sentence(kw, match):
    with pytest.raises(InputError, match=match):
        lookahead_from({"lr": 1e-3}, **kw)


def test_a_non_finite_loss_in_the_runs_loop_rolls_the_schedule_back_at_half_the_rate():
    """Through the run's one loop, the LookaheadSchedule's Watch takes a non-finite step loss as a
    rollback without a read: the best check put back, the rate halved, the run going on."""
    import torch

    from leadline.run.loop import guarded_steps

    w = torch.zeros(4, requires_grad=True)
    opt = torch.optim.Adam([w])

    def step(s: int) -> float:
        loss = ((w - 0.01) ** 2).mean()
        loss.backward()
        return float("nan") if s == 5 else loss.item()

    held = lambda: ((w - 0.01) ** 2).tolist()  # noqa: E731
    sched = LookaheadSchedule([w], opt, step, held, lookahead_from({"lr": 0.0025}), total_steps=12)
    done = guarded_steps(opt, step, range(12), watch=sched.watch, before=sched.before)
    assert done.diverged_at is None and done.steps == 11  # step 5 not taken, the others were
    i = next(i for i, c in enumerate(sched.checks) if c["loss"] == float("inf"))
    assert sched.checks[i]["action"] == "rollback" and sched.checks[i]["step"] == 5
    assert sched.checks[i]["lr"] == sched.checks[i - 1]["lr"] / 2  # halved from the rate it was at
    assert any(r.get("why") == "non-finite step loss" for r in sched.guard.records)
    sched.finish()


def test_without_a_guard_a_non_finite_loss_ends_the_loop_where_it_happened():
    import torch

    from leadline.run.loop import guarded_steps

    w = torch.zeros(2, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)

    def step(s: int) -> float:
        (w.sum() * 0 + 1).backward()
        return float("inf") if s == 3 else 1.0

    done = guarded_steps(opt, step, range(10))
    assert (done.diverged_at, done.steps, len(done.curve)) == (3, 3, 3)
