"""The estimator as pure math: known answers first, no torch."""

import math
import subprocess
import sys

import numpy as np
import pytest

from leadline.errors import InputError
from leadline.lookahead.noise.estimator import Draw, NoiseSums, mccandlish_two_batch, noise_scale_from_draws


def draws_of(gs, ts):
    """The scalars a driver streams: innovation, |m|² after, and the cross term."""
    m, total, out = np.zeros_like(gs[0]), 0.0, []
    for g, t in zip(gs, ts):
        d = g - m
        cross = float(d @ m)
        total += t
        m = m + (t / total) * d
        out.append(Draw(float(t), float(d @ d), float(m @ m), cross))
    return out


def source(rng, b_noise, dim, ts, spread=10.0):
    """g_i = G + sqrt(λ) z / sqrt(t_i): E|g_i|² = |G|² + S/t_i, S = Σλ, B_noise = S/|G|² exactly."""
    lam = np.logspace(0, math.log10(spread), dim)
    g = rng.normal(size=dim)
    big_g = g * math.sqrt(lam.sum() / b_noise) / np.linalg.norm(g)
    gs = [big_g + np.sqrt(lam) * rng.normal(size=dim) / math.sqrt(t) for t in ts]
    return gs, lam.sum(), float(big_g @ big_g)


def test_equal_tokens_is_exactly_mccandlish_two_batch():
    rng = np.random.default_rng(0)
    ts = [64.0] * 10
    gs, _, _ = source(rng, 300.0, 50, ts)
    est = noise_scale_from_draws(draws_of(gs, ts))
    small = np.mean([g @ g for g in gs])
    big = np.mean(gs, axis=0)
    g2, s = mccandlish_two_batch(small, 64.0, big @ big, 640.0)
    assert est.g2 == pytest.approx(g2, rel=1e-10)
    assert est.s == pytest.approx(s, rel=1e-10)
    assert est.b_noise_tokens == pytest.approx(s / g2, rel=1e-10)


def test_unequal_tokens_match_the_token_weighted_formulas():
    rng = np.random.default_rng(1)
    ts = rng.integers(5, 500, size=12).astype(float)
    gs, _, _ = source(rng, 800.0, 40, ts)
    total = ts.sum()
    m = sum(t * g for t, g in zip(ts, gs)) / total
    s = sum(t * (g - m) @ (g - m) for t, g in zip(ts, gs)) / (len(ts) - 1)
    g2 = m @ m - s / total
    draws = draws_of(gs, ts)
    est = noise_scale_from_draws(draws)
    assert (est.s, est.g2, est.tokens, est.draws) == pytest.approx((s, g2, total, 12), rel=1e-10)
    # the cross term derived from the norms (what the monitor streams) gives the same estimate
    bare = noise_scale_from_draws([Draw(d.tokens, d.innovation_sq, d.mean_sq) for d in draws])
    assert bare.b_noise_tokens == pytest.approx(est.b_noise_tokens, rel=1e-9)
    assert bare.se_tokens == pytest.approx(est.se_tokens, rel=1e-6)


def test_unbiased_with_unequal_tokens_where_the_equal_token_shortcut_is_not():
    rng = np.random.default_rng(2)
    true_b, ours_s, ours_g2, pub_s, pub_g2 = 400.0, [], [], [], []
    for _ in range(300):
        ts = rng.choice([8.0, 600.0], size=8)
        gs, trace, g2_true = source(rng, true_b, 20, ts)
        est = noise_scale_from_draws(draws_of(gs, ts))
        ours_s.append(est.s / trace)
        ours_g2.append(est.g2 / g2_true)
        # the published shortcut: every micro-batch taken as the mean size
        m = sum(t * g for t, g in zip(ts, gs)) / ts.sum()
        g2, s = mccandlish_two_batch(np.mean([g @ g for g in gs]), ts.mean(), m @ m, ts.sum())
        pub_s.append(s / trace)
        pub_g2.append(g2 / g2_true)
    for xs in (ours_s, ours_g2):
        assert abs(np.mean(xs) - 1) < 3 * np.std(xs) / math.sqrt(len(xs))
    assert abs(np.mean(pub_s) - 1) > 10 * np.std(pub_s) / math.sqrt(len(pub_s))
    assert abs(np.mean(pub_g2) - 1) > 10 * np.std(pub_g2) / math.sqrt(len(pub_g2))


@pytest.mark.parametrize(("k", "b_noise"), [(10, 2000.0), (32, 5000.0)])
def test_standard_error_covers_the_truth_at_its_nominal_rate(k, b_noise):
    rng = np.random.default_rng(3)
    within1 = within2 = n = 0
    for _ in range(300):
        ts = rng.integers(50, 400, size=k).astype(float)
        gs, _, _ = source(rng, b_noise, 200, ts)
        est = noise_scale_from_draws(draws_of(gs, ts))
        if not est.resolved:
            continue
        n += 1
        z = abs(est.b_noise_tokens - b_noise) / est.se_tokens
        within1 += z < 1
        within2 += z < 1.96
    assert n > 250
    assert 0.58 <= within1 / n <= 0.78  # nominal 0.683
    assert 0.88 <= within2 / n <= 0.99  # nominal 0.95


def test_lower_bound_when_the_signal_does_not_resolve():
    rng = np.random.default_rng(4)
    ts = [100.0] * 6
    gs, _, _ = source(rng, 1e9, 100, ts)  # |G|² far below the noise at 600 tokens
    est = noise_scale_from_draws(draws_of(gs, ts))
    assert est.lower_bound and not est.resolved and not est.upper_bound and not est.settled
    assert est.se_tokens is None and est.b_noise_tokens is not None and est.b_noise_tokens > 0


def test_upper_bound_when_the_noise_does_not_resolve():
    g = np.ones(10)
    ts = [50.0, 70.0, 90.0, 30.0]
    est = noise_scale_from_draws(draws_of([g] * 4, ts))  # no noise at all
    assert est.upper_bound and not est.resolved and not est.lower_bound
    assert est.b_noise_tokens == pytest.approx(0.0, abs=1e-12)


def test_too_few_draws_say_nothing_and_bad_draws_are_refused():
    assert noise_scale_from_draws([]).b_noise_tokens is None
    one = noise_scale_from_draws([Draw(10, 4.0, 4.0, 0.0)])
    assert one.b_noise_tokens is None and not one.resolved
    two = noise_scale_from_draws(draws_of([np.ones(3), np.zeros(3)], [10.0, 10.0]))
    assert two.se_tokens is None and not two.resolved
    with pytest.raises(InputError, match="scored tokens"):
        NoiseSums().add(Draw(0, 1.0, 1.0))
    with pytest.raises(InputError, match="inf/NaN"):
        NoiseSums().add(Draw(5, float("nan"), 1.0))


def test_groups_pool_to_the_truth_when_the_gradient_moves_between_them():
    """One group per optimizer step, each at its own G with the same noise: S pools, |G|² averages."""
    rng = np.random.default_rng(5)
    ratios = []
    for _ in range(200):
        groups, g2s, trace = [], [], None
        for _ in range(4):
            ts = rng.integers(50, 300, size=4).astype(float)
            gs, trace, g2_true = source(rng, 1000.0, 30, ts)
            groups.append(draws_of(gs, ts))
            g2s.append(g2_true)
        est = noise_scale_from_draws(groups)
        assert est.groups == 4 and est.draws == 16
        ratios.append((est.s / trace, est.g2 / np.mean(g2s)))
    r = np.array(ratios)
    for col in r.T:
        assert abs(col.mean() - 1) < 3 * col.std() / math.sqrt(len(col))


def test_importing_the_noise_package_loads_no_torch():
    code = "import sys, leadline.lookahead.noise; assert 'torch' not in sys.modules, 'torch loaded'"
    subprocess.run([sys.executable, "-c", code], check=True)
