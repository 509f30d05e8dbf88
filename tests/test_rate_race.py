"""race(): successive halving inside the run, the winner by a test, the ending raced."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from leadline.rate import race  # noqa: E402
from leadline.rate.race import boundaries  # noqa: E402
from test_rate_toys import Regression, constant_rate_loss  # noqa: E402


def test_boundaries_double_from_the_first_round_below_half_the_run():
    assert boundaries(5, 128, 10) == [10, 20, 40]
    assert boundaries(2, 128, 10) == [10]
    assert boundaries(8, 30, 10) == [10, 15]  # capped at T/2, never repeated


def test_race_picks_a_rate_near_the_known_best_and_ends_on_the_winner():
    steps = 128
    known = min([1e-3 * 2 ** (k / 2) for k in range(12)], key=lambda r: constant_rate_loss(0, r, steps, dim=32))
    toy = Regression(seed=0, dim=32)
    rates = [known / 16, known / 4, known, known * 4, known * 16]
    r = race(toy.params, toy.opt, toy.train_step, toy.held_out, rates, steps)
    assert known / 4 <= r.lr <= known * 4 and r.lr not in (rates[0], rates[-1])
    assert [rd["steps"] for rd in r.rounds] == [10, 20, 40]
    assert [len(rd["candidates"]) for rd in r.rounds] == [5, 3, 2]
    kept = r.ending["kept"]
    assert kept in ("decay", "constant") and r.ending["from_step"] in (steps - 32, steps // 2)
    assert sorted(d["from_step"] for d in r.ending["decays"]) == [steps // 2, steps - 32]  # the last half and 2h
    assert sum(toy.held_out()) / 256 == pytest.approx(r.ending[kept]["loss"])  # the model holds the kept end
    ev = r.evidence()
    assert ev["plot"] == "lookahead" and ev["chosen_lr"] == r.lr
    assert r.as_values()["lr"].kind == "measured"
    assert toy.w.grad is None


def test_a_tie_goes_to_the_lower_rate_not_to_the_bare_mean():
    toy = Regression(seed=1, dim=32)
    noise = torch.Generator().manual_seed(5)

    def noisy_held_out() -> list[float]:  # per-row noise that drowns the difference between rates
        return [x + 5.0 * float(torch.randn((), generator=noise)) ** 2 for x in toy.held_out()]

    r = race(toy.params, toy.opt, toy.train_step, noisy_held_out, [0.01, 0.02], 64)
    # noise drawn afresh at every read can also make a rate's loss "rise" since its last read:
    # then every rate counts as spiked and the lowest goes on — the lower rate either way
    assert r.lr == 0.01 and ("not significantly different" in r.decided_by or "the lowest, 0.01, goes on" in r.decided_by)
    toy = Regression(seed=1, dim=32)  # a hair apart: a tie whatever the paired t says
    r = race(toy.params, toy.opt, toy.train_step, toy.held_out, [0.01, 0.0100001], 64)
    assert r.lr == 0.01 and "not significantly different" in r.decided_by


def test_every_candidate_sees_the_same_dropout():
    """RNG state per candidate: two rates a hair apart read the same held-out loss only if
    each drew the same dropout masks."""
    toy = Regression(seed=2, dim=32, dropout=0.3)
    r = race(toy.params, toy.opt, toy.train_step, toy.held_out, [0.01, 0.01 * (1 + 1e-9)], 64)
    a, b = r.rounds[0]["candidates"]
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)


def test_an_exception_puts_everything_back():
    toy = Regression(seed=3, dim=16, dropout=0.1)
    toy.opt.zero_grad()
    toy.train_step(9)
    toy.opt.step()
    before = toy.state()
    toy.fail_at = 40
    with pytest.raises(RuntimeError, match="planted"):
        race(toy.params, toy.opt, toy.train_step, toy.held_out, [0.005, 0.01, 0.02], 64)
    toy.assert_state(before)


def test_a_rate_whose_loss_rises_is_out_with_every_higher_rate_and_a_lower_one_wins():
    toy = Regression(seed=0, dim=32)
    orig = toy.train_step

    def step(t: int) -> float:  # from step 12 the rate 0.008 kicks the weights: its held-out loss rises
        if t >= 12 and toy.opt.param_groups[0]["lr"] >= 0.008:
            with torch.no_grad():
                toy.w.add_(0.5)
        return orig(t)

    # without the kick 0.008 wins this race (the best mean at step 20)
    r = race(toy.params, toy.opt, step, toy.held_out, [0.001, 0.002, 0.004, 0.008], 64)
    last = {c["lr"]: c["status"] for c in r.rounds[-1]["candidates"]}
    assert last[0.008] == "unstable" and r.lr == 0.004, r.rounds
    clean = Regression(seed=0, dim=32)
    assert race(clean.params, clean.opt, clean.train_step, clean.held_out, [0.001, 0.002, 0.004, 0.008], 64).lr == 0.008


def test_when_every_rate_spikes_the_lowest_goes_on_and_the_run_ends():
    toy = Regression(seed=0, dim=32)
    orig = toy.train_step

    def step(t: int) -> float:  # every rate still running kicks the weights from step 12
        if t >= 12:
            with torch.no_grad():
                toy.w.add_(0.5)
        return orig(t)

    r = race(toy.params, toy.opt, step, toy.held_out, [0.001, 0.002, 0.004, 0.008], 64)
    assert r.lr == 0.004 and "the lowest, 0.004, goes on" in r.decided_by, r.decided_by
    assert r.steps_used >= 64  # the run went on to its end


def test_the_tail_average_is_the_mean_of_the_iterates_it_folded():
    from leadline.rate._run import TailAverage

    w = torch.nn.Parameter(torch.zeros(3))
    avg = TailAverage([w], start=0)
    for v in ([1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [2.0, 5.0, 2.0]):
        with torch.no_grad():
            w.copy_(torch.tensor(v))
        avg.fold([w])
    avg.load([w])
    assert avg.count == 3 and torch.allclose(w.detach(), torch.tensor([2.0, 3.0, 2.0]))


def test_the_averaged_ending_is_raced_without_a_step_and_kept_where_it_reads_lowest():
    """A noisy regression at a rate that keeps the weights bouncing: the iterates of the last half
    averaged read below the constant ending, at no optimizer step, and the model ends on the
    ending kept."""
    steps = 64
    toy = Regression(seed=3, dim=32, noise=2.0)
    r = race(toy.params, toy.opt, toy.train_step, toy.held_out, [0.05], steps, average=True)
    avg = r.ending["average"]
    assert avg["from_step"] == steps // 2 and avg["iterates"] == steps - steps // 2
    assert avg["loss"] < r.ending["constant"]["loss"]
    plain = Regression(seed=3, dim=32, noise=2.0)
    q = race(plain.params, plain.opt, plain.train_step, plain.held_out, [0.05], steps)
    assert r.steps_used == q.steps_used and "average" not in q.ending  # no step more for the average
    assert r.ending["constant"]["loss"] == pytest.approx(q.ending["constant"]["loss"])  # the same run to step T
    kept = r.ending["kept"]
    assert kept in ("average", "decay") and sum(toy.held_out()) / 256 == pytest.approx(
        avg["loss"] if kept == "average" else r.ending["decay"]["loss"])
    assert "averaged over the last 32 steps" in r.ending["why"]


def test_an_average_that_reads_lowest_is_the_model_the_run_ends_on():
    toy = Regression(seed=1, dim=32, noise=2.0)  # a rate that bounces: the average beats both decays
    r = race(toy.params, toy.opt, toy.train_step, toy.held_out, [0.3], 64, average=True)
    assert r.ending["kept"] == "average" and r.as_values()["ending"].value == "average"
    assert r.ending["average"]["loss"] < min(d["loss"] for d in r.ending["decays"])
    assert sum(toy.held_out()) / 256 == pytest.approx(r.ending["average"]["loss"])
    assert "the average kept" in r.ending["why"] and toy.w.grad is None
