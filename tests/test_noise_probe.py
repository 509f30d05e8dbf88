"""The probe against a gradient source of KNOWN noise scale, and its stopping rules."""

import json

import pytest
import torch

import leadline.lookahead.noise.probe as probe_mod
from leadline import Plan
from leadline.errors import InputError
from leadline.lookahead.noise import NoiseScale, measure_noise_scale
from leadline.lookahead.noise.synthetic import KnownNoise


@pytest.mark.parametrize("b_noise", [500, 5_000, 50_000, 200_000])
def test_finds_a_known_noise_scale_within_5_percent(b_noise):
    src = KnownNoise(b_noise, dim=16384, tokens=(200, 2000), seed=1)
    r = measure_noise_scale(src)
    assert r.stopped_because == "settled" and r.settled and r.resolved
    assert r.b_noise_tokens == pytest.approx(b_noise, rel=0.05)
    assert abs(r.b_noise_tokens - b_noise) < 3 * r.se_tokens
    assert r.tokens >= r.b_noise_tokens + r.se_tokens  # it saw the scale it reports
    assert r.confirmed_tokens == r.b_noise_tokens
    assert r.k == len(r.micro_tokens) >= probe_mod.MIN_DRAWS


def test_says_coarse_when_held_below_the_scale():
    src = KnownNoise(50_000, dim=4096, tokens=(200, 2000), seed=2)
    r = measure_noise_scale(src, max_tokens=10_000)
    assert r.stopped_because == "tokens" and not r.settled and r.coarse
    assert r.tokens >= 10_000 and r.tokens < 10_000 + 2000
    assert r.confirmed_tokens == r.tokens < 50_000  # the rate may lean only on what it reached
    assert "COARSE" in r.sentence()


def test_a_per_tensor_list_measures_the_same_as_one_flat_tensor():
    shapes = [(16, 32), (512,), (4, 8, 16), (2560,)]
    flat = measure_noise_scale(KnownNoise(3000, dim=4096, seed=3), k=20)
    split = measure_noise_scale(KnownNoise(3000, dim=4096, seed=3, split=shapes), k=20)
    assert split.micro_tokens == flat.micro_tokens
    assert split.b_noise_tokens == pytest.approx(flat.b_noise_tokens, rel=1e-5)
    assert split.se_tokens == pytest.approx(flat.se_tokens, rel=1e-4)


def test_fixed_k_draws_exactly_k_and_max_k_caps():
    src = KnownNoise(500, dim=1024, seed=4)
    assert measure_noise_scale(src, k=13).k == 13
    assert measure_noise_scale(src, k=13).stopped_because == "k"
    capped = measure_noise_scale(KnownNoise(1e6, dim=1024, seed=4), max_k=9)
    assert (capped.k, capped.stopped_because, capped.settled) == (9, "max_k", False)


def test_stops_when_the_data_runs_out_by_none_or_index_error():
    r = measure_noise_scale(KnownNoise(1e6, dim=512, seed=5, micro_batches=6))
    assert (r.k, r.stopped_because) == (6, "data")

    def raising(i):
        if i >= 5:
            raise IndexError(i)
        return torch.ones(3) * (i + 1), 10

    assert measure_noise_scale(raising).stopped_because == "data"


def test_stops_before_a_draw_that_would_pass_the_time_budget(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(probe_mod, "_clock", lambda: now[0])
    src = KnownNoise(1e6, dim=256, seed=6)

    def slow(i):
        now[0] += 1.0  # every draw takes one second
        return src(i)

    r = measure_noise_scale(slow, budget_s=5.5)
    assert (r.k, r.stopped_because) == (5, "time")  # a sixth would end at 6 s
    assert measure_noise_scale(slow, budget_s=0).k == 0


def test_draws_that_score_nothing_are_skipped_and_the_gradient_is_not_written():
    src = KnownNoise(800, dim=1024, seed=7)
    kept = {}

    def fn(i):
        if i % 3 == 0:
            return torch.zeros(1024), 0
        g, t = src(i)
        kept[i] = g.clone()
        fn.last = (i, g)
        return g, t

    r = measure_noise_scale(fn, k=10)
    assert r.k == 10 and r.skipped == 5
    i, g = fn.last
    assert torch.equal(g, kept[i])


def test_bad_grad_fn_answers_name_the_call():
    with pytest.raises(InputError, match=r"grad_fn\(0\) must return"):
        measure_noise_scale(lambda i: torch.ones(3))
    with pytest.raises(InputError, match="scored_tokens=-1"):
        measure_noise_scale(lambda i: (torch.ones(3), -1))
    with pytest.raises(InputError, match="same tensors"):
        measure_noise_scale(lambda i: (torch.ones(3 + i), 5))
    with pytest.raises(InputError, match=r"micro-batch 1 .*inf/NaN"):
        measure_noise_scale(lambda i: (torch.full((3,), float("nan") if i else 1.0), 5))
    with pytest.raises(InputError, match="max_tokens"):
        measure_noise_scale(lambda i: None, max_tokens=-5)


def test_evidence_follows_the_noise_probe_shape_and_round_trips_in_a_plan():
    r = measure_noise_scale(KnownNoise(2000, dim=2048, seed=8))
    assert isinstance(r, NoiseScale)
    ev = r.evidence()
    assert ev["plot"] == "noise_probe" and ev["stopped_because"] == r.stopped_because
    assert [d["k"] for d in ev["draws"]] == list(range(1, r.k + 1))
    assert set(ev["draws"][-1]) == {"k", "tokens", "estimate", "se", "g2", "s"}
    assert ev["draws"][-1]["estimate"] == r.b_noise_tokens and ev["draws"][0]["se"] is None
    values = r.as_values()
    assert values["noise_scale_tokens"].kind == "measured"
    assert values["noise_scale_confirmed_tokens"].kind == "derived"
    plan = Plan(values=values)
    again = Plan.from_json(plan.to_json())
    assert again == plan and json.loads(plan.to_json())
    assert "McCandlish" in again["noise_scale_tokens"].source


def test_rel_se_draws_on_to_the_precision_asked_and_two_draws_then_agree():
    loose = measure_noise_scale(KnownNoise(2_000, dim=256, tokens=(200, 2000), seed=3))
    assert loose.se_tokens > 0.05 * loose.b_noise_tokens  # the default stop is coarser than 5%
    tight = [measure_noise_scale(KnownNoise(2_000, dim=256, tokens=(200, 2000), seed=s), rel_se=0.03) for s in (3, 4)]
    for r in tight:
        assert r.stopped_because == "settled" and r.se_tokens <= 0.03 * r.b_noise_tokens and r.k > loose.k
    a, b = (r.b_noise_tokens for r in tight)
    assert abs(a - b) / ((a + b) / 2) <= 0.10
    with pytest.raises(InputError, match="rel_se"):
        measure_noise_scale(KnownNoise(2_000, dim=256, seed=3), rel_se=1.5)
