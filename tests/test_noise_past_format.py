"""The noise read again past the format: a toy where the first gradients share one direction."""

from __future__ import annotations

import pytest
import torch

from leadline.errors import InputError
from leadline.lookahead.digest import tensors_digest
from leadline.lookahead.noise import measure_noise_scale
from leadline.lookahead.noise.past_format import noise_past_format
from leadline.lookahead.noise.step import tokens_per_step

D = 40


def _toy(mu_scale: float = 3.0, seed: int = 0):
    """Rows y_i = mu + N(0, 1); loss 0.5 |w - y_i|^2 per row (one scored token a row). At w = 0
    the mean gradient is -mu, shared by every row (the "format"): B_noise = D / |mu|^2. Once w
    reaches mu, only the per-row noise is left and B_noise grows."""
    g = torch.Generator().manual_seed(seed)
    mu = torch.full((D,), mu_scale)
    ys = mu + torch.randn(4000, D, generator=g)
    w = torch.zeros(D, requires_grad=True)
    opt = torch.optim.Adam([w], lr=1e-3)

    def train_step(t: int) -> float:
        y = ys[(t * 4) % 2000:(t * 4) % 2000 + 4]
        loss = 0.5 * ((w - y) ** 2).sum(1).mean()
        loss.backward()
        return float(loss.detach())

    def grad_fn(i: int):
        if 2 * i + 2 > len(ys):
            return None
        y = ys[2 * i:2 * i + 2]
        return [(w.detach() - y).mean(0)], 2

    return w, opt, train_step, grad_fn


def test_the_noise_grows_once_the_shared_direction_is_learned():
    w, opt, train_step, grad_fn = _toy()
    step0 = measure_noise_scale(lambda i: grad_fn(1000 + i))
    digest = tensors_digest([w])
    pf = noise_past_format([w], opt, train_step, grad_fn, alpha1=0.6, step0=step0, rows_per_step=4, probe_start=1000)
    assert pf.grew, pf.readings
    assert pf.b_noise_tokens > 10 * step0.b_noise_tokens
    assert pf.rate == pytest.approx(0.3) and len(pf.readings) == 1
    # the loss fell while the shared direction was being learned, then stopped falling: the burn-in ended there
    assert len(pf.rounds) >= 2 and pf.rounds[0]["mean_loss"] > 2 * pf.rounds[-1]["mean_loss"]
    assert pf.rounds[-1]["falling_p"] >= 0.05 and all(r["falling_p"] < 0.05 for r in pf.rounds[1:-1])
    assert pf.readings[0]["steps"] == pf.rounds[-1]["steps"]
    assert tensors_digest([w]) == digest and not opt.state and w.grad is None
    v = pf.as_values()["noise_scale_past_format_tokens"]
    assert v.kind == "measured" and "grown" in v.source and v.evidence["readings"]


def test_no_learning_no_growth():
    w, opt, train_step, grad_fn = _toy()
    step0 = measure_noise_scale(lambda i: grad_fn(1000 + i))
    pf = noise_past_format([w], opt, train_step, grad_fn, alpha1=1e-7, step0=step0, rows_per_step=4, probe_start=1000)
    assert not pf.grew
    assert pf.stopped_because.startswith("settled") and len(pf.readings) == 1 and len(pf.rounds) >= 2
    assert "the step-0 reading stands" in pf.as_values()["noise_scale_past_format_tokens"].source


def test_state_is_restored_when_a_step_raises():
    w, opt, train_step, grad_fn = _toy()
    digest = tensors_digest([w])
    calls = []

    def failing(t):
        calls.append(t)
        if t == 3:
            raise RuntimeError("boom")
        return train_step(t)

    with pytest.raises(RuntimeError):
        noise_past_format([w], opt, failing, grad_fn, alpha1=0.6, step0=0.1, rows_per_step=4, probe_start=1000)
    assert tensors_digest([w]) == digest and not opt.state


def test_a_diverging_burn_in_stops_and_keeps_the_step0_reading():
    w, opt, _, grad_fn = _toy()
    pf = noise_past_format([w], opt, lambda t: float("nan"), grad_fn, alpha1=0.6, step0=0.1, rows_per_step=4, probe_start=1000)
    assert pf.stopped_because.startswith("diverged") and pf.b_noise_tokens is None and not pf.grew


def test_the_burn_in_is_bounded_by_its_rounds_and_its_time(fake_clock):
    w, opt, train_step, grad_fn = _toy()
    pf = noise_past_format([w], opt, train_step, grad_fn, alpha1=0.6, step0=0.1, rows_per_step=4, probe_start=1000,
                           max_rounds=1)
    assert len(pf.rounds) == 1 and pf.stopped_because.startswith("1 rounds")
    pf = noise_past_format([w], opt, train_step, grad_fn, alpha1=1e-9, step0=0.1, rows_per_step=4, probe_start=1000,
                           max_steps=25)
    assert [r["steps"] for r in pf.rounds][-1] <= 25 and pf.readings[0]["steps"] <= 25

    def slow(t):
        fake_clock.advance(0.02)
        return train_step(t)

    pf = noise_past_format([w], opt, slow, grad_fn, alpha1=1e-9, step0=0.1, rows_per_step=4, probe_start=1000,
                           budget_s=0.5, max_rounds=50)
    # 10 steps of 0.02 s: a round of 20 more would end at 0.6 s, past the burn-in's 0.7 x 0.5 s
    assert pf.stopped_because.startswith("time") and pf.seconds <= 0.5 and [r["steps"] for r in pf.rounds] == [10]


def test_bad_alpha1_is_one_sentence():
    w, opt, train_step, grad_fn = _toy()
    with pytest.raises(InputError, match="alpha1"):
        noise_past_format([w], opt, train_step, grad_fn, alpha1=None, step0=0.1, rows_per_step=4, probe_start=0)


def test_a_launch_bound_card_takes_the_step_the_noise_allows():
    # t_micro flat in rows (0.14 s at 1 row, 0.15 s at 18): the fixed cost dominates, the step goes to B_noise
    flat = tokens_per_step(37, rows_fit=18, tokens_per_micro_batch=36, t_step_seconds=0.008, t_micro_seconds=0.15,
                           t_micro_one_row_seconds=[0.14, 0.141, 0.139])
    assert flat.rows_per_step == 18 and flat.grad_accum == 1
    assert flat.inputs["fixed_cost"]["a_seconds"] == pytest.approx(0.14 - (0.15 - 0.14) / 17, rel=1e-6)
    # the same card read as cost-per-token (no one-row timing) takes a 4-row step
    per_token = tokens_per_step(37, rows_fit=18, tokens_per_micro_batch=36, t_step_seconds=0.008, t_micro_seconds=0.15)
    assert per_token.rows_per_step == 4
    # a card whose time is linear in rows through the origin gives the square-root formula's answer
    linear = tokens_per_step(4000, rows_fit=8, tokens_per_micro_batch=800, t_step_seconds=0.01, t_micro_seconds=0.8,
                             t_micro_one_row_seconds=0.1)
    plain = tokens_per_step(4000, rows_fit=8, tokens_per_micro_batch=800, t_step_seconds=0.01, t_micro_seconds=0.8)
    assert linear.rows_per_step == plain.rows_per_step == 2
    assert "fixed" in linear.as_values()["tokens_per_step"].source


def test_a_lower_bound_counts_when_the_bound_itself_is_above_step0():
    from types import SimpleNamespace

    from leadline.lookahead.noise.past_format import _above

    bound = SimpleNamespace(b_noise_tokens=40.0, se_tokens=None, resolved=False, lower_bound=True)
    assert _above(bound, 3.4, 0.6)
    assert not _above(SimpleNamespace(b_noise_tokens=3.5, se_tokens=None, resolved=False, lower_bound=True), 3.4, 0.6)
    # an unresolved reading that is not a lower bound says nothing
    assert not _above(SimpleNamespace(b_noise_tokens=40.0, se_tokens=None, resolved=False, lower_bound=False), 3.4, 0.6)
    # a resolved one must clear both errors
    assert not _above(SimpleNamespace(b_noise_tokens=5.0, se_tokens=1.0, resolved=True, lower_bound=False), 3.4, 0.6)
    assert _above(SimpleNamespace(b_noise_tokens=6.0, se_tokens=1.0, resolved=True, lower_bound=False), 3.4, 0.6)


def test_the_late_reading_is_bounded_when_the_mean_gradient_stays_lost(monkeypatch):
    import leadline.lookahead.noise.past_format as pfm

    monkeypatch.setattr(pfm, "MAX_LATE_DRAWS", 12)
    w, opt, train_step, _ = _toy()
    g = torch.Generator().manual_seed(1)
    noise_only = lambda i: ([torch.randn(D, generator=g)], 2)  # noqa: E731  (no mean: |G|² never resolves)
    pf = noise_past_format([w], opt, train_step, noise_only, alpha1=0.6, step0=0.1, rows_per_step=4, probe_start=0)
    assert pf.readings[0]["k"] == 12


def test_the_late_reading_draws_each_row_once_and_at_least_its_fewest_draws():
    """No learning (the shared direction stays): the probe's own rule settles within a few draws.
    The reading past the format goes on to LATE_DRAWS and draws no micro-batch twice."""
    from leadline.lookahead.noise.past_format import LATE_DRAWS

    w, opt, train_step, grad_fn = _toy()
    early = measure_noise_scale(lambda i: grad_fn(1000 + i))
    assert early.stopped_because == "settled" and early.k < LATE_DRAWS  # what the reading must go past
    drawn: list[int] = []

    def counted(i: int):
        drawn.append(i)
        return grad_fn(i)

    pf = noise_past_format([w], opt, train_step, counted, alpha1=1e-7, step0=early, rows_per_step=4,
                           probe_start=1000)
    assert pf.readings[0]["k"] >= LATE_DRAWS
    assert len(drawn) == len(set(drawn)) == pf.readings[0]["k"]


def test_the_probe_settles_no_sooner_than_min_k():
    *_, grad_fn = _toy()
    early = measure_noise_scale(lambda i: grad_fn(1000 + i))
    late = measure_noise_scale(lambda i: grad_fn(1000 + i), min_k=early.k + 5)
    assert late.k >= early.k + 5 and late.stopped_because == "settled"
    with pytest.raises(InputError, match="min_k"):
        measure_noise_scale(grad_fn, min_k=0)
