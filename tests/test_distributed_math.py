"""The pure math of leadline.lookahead.distributed: the draws from an all-reduce against the
single-process stream, the scale-out table on hand-computed numbers, the agreement's
sentences, the plan's digest."""

from __future__ import annotations

import math

import pytest

from leadline import InputError, Plan, Value
from leadline.lookahead.distributed.noise_math import world_draws
from leadline.lookahead.distributed.scale_out import comm_seconds, ring_factor, scale_out, scale_out_table


# ---- the draws ----------------------------------------------------------------------------
def _steps(world: int, n_steps: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    signal = torch.randn(40, generator=g, dtype=torch.float64)
    out = []
    for _ in range(n_steps):
        tokens = [int(torch.randint(3, 40, (1,), generator=g)) for _ in range(world)]
        grads = [signal + torch.randn(40, generator=g, dtype=torch.float64) * 3.0 / math.sqrt(t) for t in tokens]
        out.append((tokens, grads))
    return out


def _via_world(steps):
    """What the hook and the driver compute: per-rank scalars against the running mean, then world_draws."""
    import torch

    mean, t_prev, prev_sq, draws = torch.zeros(40, dtype=torch.float64), 0.0, 0.0, []
    for tokens, grads in steps:
        ts = sum(tokens)
        m = sum(t * g for t, g in zip(tokens, grads)) / ts  # DDP's average of the scaled losses
        d = m - mean
        new = world_draws(t_prev, prev_sq, tokens, [float((g - mean) @ (g - mean)) for g in grads],
                          [float((g - mean) @ mean) for g in grads], float(d @ d))
        draws += new
        mean = mean + ts / (t_prev + ts) * d
        t_prev += ts
        prev_sq = new[-1].mean_sq
        assert prev_sq == pytest.approx(float(mean @ mean), rel=1e-12)
    return draws


def _via_stream(items):
    """The single-process probe's stream (leadline.lookahead.noise._stream.MeanStream) on (gradient, tokens)."""
    from leadline.lookahead.noise._stream import MeanStream

    s = MeanStream()
    return [s.add([g], t) for g, t in items]


@pytest.mark.parametrize("world", [1, 2])
def test_on_one_or_two_ranks_the_draws_are_the_probes_draws(world):
    steps = _steps(world, 6, seed=world)
    got = _via_world(steps)
    want = _via_stream([(g, t) for tokens, grads in steps for t, g in zip(tokens, grads)])
    assert len(got) == len(want) == 6 * world
    for a, b in zip(got, want):
        assert a.tokens == b.tokens
        assert a.innovation_sq == pytest.approx(b.innovation_sq, rel=1e-9, abs=1e-12)
        assert a.cross == pytest.approx(b.cross, rel=1e-9, abs=1e-9)
        assert a.mean_sq == pytest.approx(b.mean_sq, rel=1e-9)


def test_on_more_ranks_each_draw_is_the_worlds_step_mean():
    steps = _steps(3, 5, seed=7)
    got = _via_world(steps)
    means = [(sum(t * g for t, g in zip(tokens, grads)) / sum(tokens), sum(tokens)) for tokens, grads in steps]
    want = _via_stream(means)
    assert len(got) == 5
    for a, b in zip(got, want):
        assert (a.tokens, a.innovation_sq, a.cross, a.mean_sq) == pytest.approx((b.tokens, b.innovation_sq, b.cross, b.mean_sq), rel=1e-9, abs=1e-12)


def test_the_estimate_from_the_world_is_the_probes_estimate():
    from leadline.lookahead.noise.estimator import noise_scale_from_draws

    steps = _steps(2, 12, seed=3)
    a = noise_scale_from_draws(_via_world(steps))
    b = noise_scale_from_draws(_via_stream([(g, t) for tokens, grads in steps for t, g in zip(tokens, grads)]))
    assert a.b_noise_tokens == pytest.approx(b.b_noise_tokens, rel=1e-9)
    assert a.se_tokens == pytest.approx(b.se_tokens, rel=1e-9)


def test_world_draws_refuses_what_it_cannot_compute():
    with pytest.raises(InputError, match="at least one token"):
        world_draws(0, 0, [0, 3], [1, 1], [0, 0], 1)
    with pytest.raises(InputError, match="one per rank"):
        world_draws(0, 0, [2, 3], [1], [0, 0], 1)
    with pytest.raises(InputError, match="1 or 2 ranks"):
        world_draws(0, 0, [2, 3, 4], [1, 1, 1], [0, 0, 0], 1, per_rank=True)


# ---- scale-out ----------------------------------------------------------------------------
def test_scale_out_by_hand():
    # B_noise 10,000, m 1,000 tokens a micro-batch, 50 a row, t_micro 0.1 s, t_step 0.01 s, no communication.
    # n = 1: B* = sqrt(1e4 x 1e3 x 0.01 / 0.1) = 1,000; 0.11 s a step; 11 S_min steps; wall 1.21
    # n = 4: B* = 2,000; 2,000/4,000 x 0.1 + 0.01 = 0.06 s; 1 + 5 = 6 steps; wall 0.36; speed-up 3.361
    # n = 16: B* = 4,000; 0.035 s; 3.5 steps; 0.1225; speed-up 9.878 (62%)
    # n = 32: B* = 5,656.9; 0.027678 s; 2.7678 steps; 0.076605; speed-up 15.795 (49%: stops paying)
    # n = 128: B* 11,314 > B_noise: 10,000; 0.0178125 s; 2 steps; 0.035625
    # n = 256: a row per GPU is 12,800 > B_noise: 12,800; 0.015 s; 1.78125 steps
    t = scale_out_table(10_000, 1_000, 50, 0.1, 0.01, gpus=(1, 4, 16, 32, 128, 256))
    one, four, sixteen, thirty_two, big, bigger = t.rows
    assert (one.batch_tokens, one.seconds_per_step, one.steps, one.wall_seconds) == pytest.approx((1_000, 0.11, 11, 1.21))
    assert (four.batch_tokens, four.seconds_per_step, four.steps, four.wall_seconds) == pytest.approx((2_000, 0.06, 6, 0.36))
    assert four.speedup == pytest.approx(1.21 / 0.36) and four.tokens == pytest.approx(12_000)
    assert sixteen.wall_seconds == pytest.approx(0.1225) and sixteen.efficiency == pytest.approx(1.21 / 0.1225 / 16)
    assert thirty_two.batch_tokens == pytest.approx(math.sqrt(32e6))
    assert thirty_two.wall_seconds == pytest.approx((1 + 1e4 / math.sqrt(32e6)) * (math.sqrt(32e6) / 32_000 * 0.1 + 0.01))
    assert (big.batch_tokens, big.steps, big.seconds_per_step) == pytest.approx((10_000, 2, 0.0178125))
    assert big.clamped_by == "noise scale"
    assert (bigger.batch_tokens, bigger.clamped_by, bigger.steps) == (12_800, "a row per GPU", pytest.approx(1.78125))
    assert (t.pays_up_to, t.stops_paying_at, t.knee_gpus) == (16, 32, 10.0)
    assert "pays up to 16 GPUs" in t.table() and "communication unmeasured" in t.table()


def test_the_measured_all_reduce_scales_by_the_ring():
    assert ring_factor(2) == 1.0 and ring_factor(4) == 1.5
    assert comm_seconds(1, 0.02, 2) == 0.0 and comm_seconds(4, 0.02, 2) == pytest.approx(0.03)
    assert comm_seconds(8, None, None) == 0.0
    # n = 2 with 0.02 s of all-reduce: B* = sqrt(1e4 x 2,000 x 0.03 / 0.1) = 2,449.5; 0.15247 s a step; 5.0825 steps
    t = scale_out_table(10_000, 1_000, 50, 0.1, 0.01, gpus=(1, 2), comm_seconds_measured=0.02, comm_world_size=2)
    two = t.row(2)
    assert two.batch_tokens == pytest.approx(math.sqrt(6e6))
    assert two.seconds_per_step == pytest.approx(math.sqrt(6e6) / 2_000 * 0.1 + 0.03)
    assert two.speedup == pytest.approx(1.21 / ((1 + 1e4 / math.sqrt(6e6)) * (math.sqrt(6e6) / 2_000 * 0.1 + 0.03)))
    assert "measured on 2 GPUs" in t.table()


def _plan(**extra):
    p = Plan()
    for name, v in {"noise_scale_tokens": 10_000.0, "rows_fit": 20, "scored_tokens_per_row": 50.0, "t_micro_seconds": 0.1,
                    "t_step_seconds": 0.01, **extra}.items():
        p.set(name, Value(v, "measured", f"{name} for the test"))
    return p


def test_scale_out_reads_the_plan_and_anchors_s_min_on_its_run():
    # the plan's run: 110 steps of 1,000 tokens -> S_min = 110 / (1 + 10) = 10 steps
    t = scale_out(_plan(total_steps=110, tokens_per_step=1_000.0), gpus=(1, 4))
    assert t.absolute and t.s_min == pytest.approx(10.0)
    assert t.row(1).steps == pytest.approx(110.0) and t.row(4).steps == pytest.approx(60.0)
    assert t.row(4).wall_seconds == pytest.approx(60 * 0.06)
    assert any("unmeasured" in a for a in t.assumptions)
    values = t.as_values()
    assert values["scale_out_gpus"].kind == "derived" and values["scale_out_gpus"].evidence["rows"][1]["gpus"] == 4
    rel = scale_out(_plan(), gpus=(1, 2))
    assert not rel.absolute and rel.s_min == 1.0 and "S_min" in rel.table()


def test_scale_out_uses_the_noise_read_past_the_format_when_the_plan_has_it():
    # the step was taken from 10,000 tokens past the format, not 2.5 at step 0: S_min = 110 / (1 + 10)
    plan = _plan(noise_scale_tokens=2.5, noise_scale_past_format_tokens=10_000.0, total_steps=110, tokens_per_step=1_000.0)
    t = scale_out(plan, gpus=(1, 4))
    assert t.s_min == pytest.approx(10.0) and t.row(4).steps == pytest.approx(60.0)
    assert any("read past the answer's format" in a and "not 2.5 at step 0" in a for a in t.assumptions)
    # an unresolved reading past the format (None) leaves the step-0 one
    t0 = scale_out(_plan(noise_scale_tokens=10_000.0, noise_scale_past_format_tokens=None, total_steps=110, tokens_per_step=1_000.0), gpus=(1,))
    assert t0.s_min == pytest.approx(10.0) and not any("past the answer's format" in a for a in t0.assumptions)


def test_with_the_measured_fixed_cost_one_gpu_is_the_plans_step_and_more_gpus_pay_less():
    """A micro-batch mostly fixed cost (a small model): the table takes the plan's cost model, so
    its one-GPU row is the step tokens_per_step chose, and its speed-ups fall below the
    proportional model's, which cannot see that smaller micro-batches per GPU save little."""
    from leadline.lookahead.noise.step import tokens_per_step

    sp = tokens_per_step(218.0, rows_fit=184, tokens_per_micro_batch=368.0, t_step_seconds=0.01, t_micro_seconds=0.446,
                         t_micro_one_row_seconds=0.1848)
    plan = _plan(noise_scale_tokens=218.0, rows_fit=184, scored_tokens_per_row=2.0, t_micro_seconds=0.446,
                 t_step_seconds=0.01, total_steps=37)
    for name, v in sp.as_values().items():
        plan.set(name, v)
    t = scale_out(plan, gpus=(1, 2, 8))
    assert t.row(1).batch_tokens == sp.tokens_per_step and t.row(1).steps == pytest.approx(37.0)
    fixed = sp.inputs["fixed_cost"]
    assert t.row(1).seconds_per_step == pytest.approx(fixed["a_seconds"] + sp.rows_per_step * fixed["c_seconds_per_row"] + 0.01)
    assert any("fixed" in a for a in t.assumptions)
    proportional = scale_out_table(218.0, 368.0, 2.0, 0.446, 0.01, gpus=(1, 2, 8), s_min=t.s_min)
    assert t.row(8).speedup < proportional.row(8).speedup and t.pays_up_to < proportional.pays_up_to


def test_a_sharded_plan_from_two_ranks_is_not_called_a_one_gpu_plan():
    """Under FSDP no all-reduce is timed apart: the collectives are inside t_micro."""
    t = scale_out(_plan(world_size=2), gpus=(1, 2))
    assert any("not timed apart" in a and "2 ranks" in a for a in t.assumptions)
    assert not any("a plan derived on one GPU" in a for a in t.assumptions)
    assert any("a plan derived on one GPU" in a for a in scale_out(_plan(), gpus=(1, 2)).assumptions)


def test_scale_out_names_what_the_plan_lacks():
    p = Plan()
    p.set("noise_scale_tokens", Value(1.0, "measured", "x"))
    with pytest.raises(InputError, match="rows_fit, scored_tokens_per_row, t_micro_seconds, t_step_seconds"):
        scale_out(p)
    with pytest.raises(InputError, match="whole GPU counts"):
        scale_out(_plan(), gpus=(1, 0))
    with pytest.raises(InputError, match="B_noise"):
        scale_out_table(0, 1, 1, 1, 1)


# ---- agreement and the plan's digest --------------------------------------------------------
class FakeWorld:
    """One rank of a job whose other ranks' outcomes are given (no processes)."""

    def __init__(self, rank, statuses, sentences):
        self.rank, self.world_size = rank, len(statuses)
        self.statuses, self.sentences, self.calls = statuses, sentences, []

    def all_gather(self, values):
        self.calls.append("all_gather")
        return [[float(values[0])] if r == self.rank else [float(s)] for r, s in enumerate(self.statuses)]

    def gather_object(self, obj):
        self.calls.append("gather_object")
        return [obj if r == self.rank else s for r, s in enumerate(self.sentences)]


def test_agreement_passes_through_when_every_rank_is_fine():
    from leadline.lookahead.distributed.agree import agreed

    w = FakeWorld(0, [0, 0], [None, None])
    assert agreed(w, lambda: 42, "work") == 42
    assert w.calls == ["all_gather"]  # one collective, no sentences


def test_an_other_ranks_failure_is_raised_here_with_its_sentence():
    from leadline.lookahead.distributed.agree import OUT_OF_MEMORY, RankFailed, agreed

    w = FakeWorld(0, [0, OUT_OF_MEMORY], [None, ("the ramp ran out of memory on rank 1 of 2: no room", True)])
    with pytest.raises(RankFailed, match="ran out of memory on rank 1 of 2") as e:
        agreed(w, lambda: 42, "the ramp")
    assert e.value.out_of_memory and e.value.rank == 1 and e.value.failed_ranks == [1]


def test_this_ranks_failure_becomes_the_sentence_and_an_agreed_one_passes_through():
    import torch

    from leadline.lookahead.distributed.agree import RankFailed, agreed

    def oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")

    w = FakeWorld(1, [0, 0], [None, None])
    with pytest.raises(RankFailed, match="the ramp ran out of memory on rank 1 of 2: OutOfMemoryError: CUDA out of memory") as e:
        agreed(w, oom, "the ramp")
    assert isinstance(e.value.__cause__, torch.OutOfMemoryError)
    w2 = FakeWorld(1, [0, 0], [None, None])
    already = RankFailed("agreed before", 0, False, [0])
    with pytest.raises(RankFailed, match="agreed before"):
        agreed(w2, lambda: (_ for _ in ()).throw(already), "outer")
    assert w2.calls == []  # no collective: every rank raised it at the same agreement


def test_plan_digest_and_disagreements():
    from leadline.lookahead.distributed.sync import disagreements, plan_digest

    p = _plan(lr=1e-4)
    again = Plan.from_json(p.to_json())
    assert plan_digest(p) == plan_digest(again) == plan_digest(p.to_json())
    again.set("lr", Value(2e-4, "measured", "another rate"))
    assert plan_digest(again) != plan_digest(p)
    said = disagreements([{"lr": 1e-4, "micro_batch": 4}, {"lr": 2e-4, "micro_batch": 4}])
    assert said == ["rank 1 derived lr=0.0002 where rank 0 derived 0.0001; rank 0's plan stands"]


class FakeRank:
    """Rank ``rank`` of two, whose collectives answer from what rank 0 would send (no processes)."""

    def __init__(self, rank, from_rank0=None, other_left=None):
        self.rank, self.world_size, self.is_main = rank, 2, rank == 0
        self.from_rank0, self.other_left, self.calls = from_rank0, other_left, []

    def broadcast_object(self, obj, src=0):
        self.calls.append("broadcast_object")
        return obj if self.rank == src else self.from_rank0

    def all_min(self, value):
        self.calls.append("all_min")
        return min(value, self.other_left)

    def all_max(self, value):
        self.calls.append("all_max")
        return max(value, self.other_took if getattr(self, "other_took", None) is not None else value)

    def all_gather(self, values):
        return [list(values), list(values)]


def test_the_agreed_runner_reads_rank_0s_resume_file_and_only_rank_0_writes(tmp_path):
    from leadline.lookahead.distributed.phases import AgreedPhaseRunner
    from leadline.lookahead.runner import PhaseRunner, Values

    resume = tmp_path / "derive.json"
    done = Plan()
    writer = PhaseRunner(done, resume_path=resume)
    writer.run("noise", Values, {"noise_scale_tokens": Value(123.0, "measured", "the probe")})
    main = AgreedPhaseRunner(Plan(), resume_path=resume, world=FakeRank(0))
    assert main.restored == ["noise"] and main.plan.get("noise_scale_tokens") == 123.0
    sent = ("ok", main.finished, main.plan.to_dict(), main.extra)
    other_dir = tmp_path / "rank1"
    other_dir.mkdir()
    other = AgreedPhaseRunner(Plan(), resume_path=other_dir / "derive.json", world=FakeRank(1, from_rank0=sent))
    assert other.restored == ["noise"] and other.plan.get("noise_scale_tokens") == 123.0
    other.run("step", Values, {"tokens_per_step": Value(10.0, "derived", "B*")})
    assert not (other_dir / "derive.json").exists(), "only rank 0 writes the resume file"
    with pytest.raises(InputError, match="not a leadline resume file"):
        AgreedPhaseRunner(Plan(), resume_path=resume, world=FakeRank(1, from_rank0=("error", f"resume file {resume} is not a leadline resume file")))


def test_the_agreed_runner_budget_is_the_least_left_on_any_rank():
    from leadline.lookahead.distributed.phases import AgreedPhaseRunner
    from leadline.lookahead.runner import Values
    from leadline.plan import Skipped

    r = AgreedPhaseRunner(Plan(), max_seconds=100.0, world=FakeRank(1, other_left=-1.0))
    assert r.seconds_left() == -1.0  # the other rank is out of time: so is this one
    assert r.run("anchor", Values, {"x": Value(1, "derived", "x")}) is None
    assert r.plan.skipped == [Skipped("anchor", "not_reached", max_seconds=100.0)]
    unbounded = AgreedPhaseRunner(Plan(), world=FakeRank(1))
    assert unbounded.seconds_left() is None and "all_min" not in unbounded.world.calls


def test_every_rank_stops_before_the_same_read_on_the_slowest_ranks_time():
    from leadline.lookahead.budget import OutOfTime
    from leadline.lookahead.distributed.phases import AgreedPhaseRunner

    world = FakeRank(1, other_left=1e9)
    r = AgreedPhaseRunner(Plan(), max_seconds=100.0, world=world)
    r.ensure(1.0)  # both ranks' last read took about a second: go on
    world.other_took = 90.0  # the other rank's last read took 90 s: 1.5 x 90 > the 100 s left on both
    with pytest.raises(OutOfTime):
        r.ensure(1.0)
    assert world.calls.count("all_max") == 2
    unbounded = AgreedPhaseRunner(Plan(), world=FakeRank(1))
    unbounded.ensure(1e9)  # no budget: no collective, nothing raised
    assert "all_max" not in unbounded.world.calls


def test_the_plan_keeps_no_scale_out_of_its_own():
    """One scale_out: the function of leadline.lookahead.distributed, which the CLI's table prints."""
    from leadline import Plan, Value
    from leadline.cli.derive import plan_scale_out_table
    from leadline.lookahead.distributed.scale_out import scale_out

    p = Plan()
    for n, v in {"noise_scale_tokens": 4000.0, "micro_batch": 4, "grad_accum": 2, "t_micro_seconds": 0.05,
                 "t_step_seconds": 0.01, "scored_tokens_per_row": 100.0, "tokens_per_step": 800.0, "rows_fit": 8}.items():
        p.set(n, Value(v, "measured", "test"))
    assert not hasattr(p, "scale_out")
    assert plan_scale_out_table(p) == scale_out(p).table()
