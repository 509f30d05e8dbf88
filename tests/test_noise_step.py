"""Tokens per step on hand-computed numbers; the micro-batch cut to the step; determinism."""

import math

import pytest

from leadline.errors import InputError
from leadline.lookahead.noise import (
    NoiseScale,
    steps_and_tokens,
    time_optimal_tokens,
    tokens_per_step,
)
from leadline.lookahead.noise.estimator import noise_scale_from_draws


def test_b_star_by_hand_and_grad_accum_follows():
    # B* = sqrt(40,000 × 2,000 × 0.05 / 0.2) = sqrt(2e7) = 4,472.1 tokens; a row scores 125,
    # so 36 rows a step; 16 fit, so 3 micro-batches of 12.
    plan = tokens_per_step(40_000, rows_fit=16, tokens_per_micro_batch=2_000, t_step_seconds=0.05, t_micro_seconds=0.2)
    assert plan.b_star_tokens == pytest.approx(math.sqrt(2e7))
    assert plan.tokens_per_step == pytest.approx(4472.13595499958)
    assert (plan.grad_accum, plan.micro_batch, plan.rows_per_step, plan.clamped_by) == (3, 12, 36, None)
    assert plan.cut


def test_the_micro_batch_is_cut_to_the_step_on_a_big_card():
    # pichak 0.4.1 kept 242 rows (60 scored each) as the step; here B* = sqrt(6,000 × 14,520 × 0.02/1.0) = 1,320 tokens = 22 rows
    plan = tokens_per_step(6_000, rows_fit=242, tokens_per_micro_batch=242 * 60, t_step_seconds=0.02, t_micro_seconds=1.0)
    assert plan.b_star_tokens == pytest.approx(math.sqrt(6_000 * 14_520 * 0.02))
    assert (plan.micro_batch, plan.grad_accum, plan.cut) == (22, 1, True)
    values = plan.as_values()
    assert values["micro_batch"].value == 22 and "cut from the 242 rows" in values["micro_batch"].source
    assert {v.kind for v in values.values()} == {"derived"}


def test_the_clamps():
    knee = tokens_per_step(1_000, rows_fit=8, tokens_per_micro_batch=800, t_step_seconds=10.0, t_micro_seconds=0.1)
    assert (knee.tokens_per_step, knee.clamped_by, knee.micro_batch, knee.grad_accum) == (1_000, "noise scale", 5, 2)
    row = tokens_per_step(4, rows_fit=8, tokens_per_micro_batch=800, t_step_seconds=0.001, t_micro_seconds=1.0)
    assert (row.tokens_per_step, row.clamped_by, row.micro_batch, row.grad_accum) == (100, "one row", 1, 1)
    corpus = tokens_per_step(1e6, rows_fit=8, tokens_per_micro_batch=800, t_step_seconds=1.0, t_micro_seconds=0.1, corpus_scored_tokens=5_000)
    # 50 rows do not split evenly over 8-row micro-batches: 7 of 7 rows, the nearest even split
    assert (corpus.tokens_per_step, corpus.clamped_by, corpus.grad_accum, corpus.micro_batch) == (5_000, "corpus", 7, 7)


def test_the_same_measurements_give_the_same_plan():
    kw = {"rows_fit": 24, "tokens_per_micro_batch": 3_100.0, "corpus_scored_tokens": 9e5}
    a = tokens_per_step(12_345.6, t_step_seconds=[0.031, 0.029, 0.030, 0.120], t_micro_seconds=[0.41, 0.40, 0.44], **kw)
    b = tokens_per_step(12_345.6, t_step_seconds=[0.120, 0.030, 0.029, 0.031], t_micro_seconds=[0.44, 0.41, 0.40], **kw)
    again = tokens_per_step(12_345.6, t_step_seconds=[0.031, 0.029, 0.030, 0.120], t_micro_seconds=[0.41, 0.40, 0.44], **kw)
    assert again.as_values() == a.as_values()  # the evidence included
    assert (a.tokens_per_step, a.micro_batch, a.grad_accum) == (b.tokens_per_step, b.micro_batch, b.grad_accum)
    assert a.inputs["t_step_seconds"] == pytest.approx(0.0305)  # the median, not the outlier


def test_takes_a_noise_scale_result_and_refuses_what_is_not_measured():
    est = noise_scale_from_draws([])
    unresolved = NoiseScale(None, None, None, 0, [], False, False, False, False, "data", est)
    with pytest.raises(InputError, match="measure_noise_scale"):
        tokens_per_step(unresolved, rows_fit=4, tokens_per_micro_batch=100, t_step_seconds=0.1, t_micro_seconds=0.1)
    ok = NoiseScale(900.0, 50.0, 900.0, 9, [100] * 9, True, True, False, False, "settled", est)
    plan = tokens_per_step(ok, rows_fit=4, tokens_per_micro_batch=100, t_step_seconds=0.1, t_micro_seconds=0.1)
    assert plan.tokens_per_step == pytest.approx(300.0) and plan.inputs["confirmed_tokens"] == 900.0
    with pytest.raises(InputError, match="rows_fit"):
        tokens_per_step(900, rows_fit=0, tokens_per_micro_batch=100, t_step_seconds=0.1, t_micro_seconds=0.1)
    with pytest.raises(InputError, match="t_micro_seconds"):
        tokens_per_step(900, rows_fit=4, tokens_per_micro_batch=100, t_step_seconds=0.1, t_micro_seconds=[])


def test_steps_and_tokens_at_batch_b():
    assert steps_and_tokens(5_000, 5_000) == (2.0, 2.0)  # at the knee both are twice their minimum
    assert steps_and_tokens(1_000, 4_000, s_min=100, e_min=1e6) == (500.0, 1.25e6)
    assert steps_and_tokens(8_000, 8_000)[0] / steps_and_tokens(32_000, 8_000)[0] == pytest.approx(2 / 1.25)
    assert time_optimal_tokens(40_000, 2_000, 0.05, 0.2) == pytest.approx(4472.13595499958)


def test_a_step_the_caller_fixes_is_kept_exactly_and_the_card_splits_it():
    kw = {"tokens_per_micro_batch": 600.0, "t_step_seconds": 0.01, "t_micro_seconds": 0.5}
    measured = tokens_per_step(6_000.0, rows_fit=6, **kw)
    given = tokens_per_step(6_000.0, rows_fit=6, rows_per_step=16, **kw)
    assert (given.micro_batch, given.grad_accum, given.rows_per_step) == (4, 4, 16)  # 16 exactly, not even_split's 15
    assert given.tokens_per_step == pytest.approx(1_600.0) and given.given_rows == 16
    v = given.as_values()
    assert v["tokens_per_step"].kind == "given" and "16 rows a step, given" in v["tokens_per_step"].source
    assert v["tokens_per_step"].evidence["b_star_tokens"] == pytest.approx(measured.b_star_tokens)
    assert "4 micro-batches of 4 rows" in v["grad_accum"].source
    roomy = tokens_per_step(6_000.0, rows_fit=32, rows_per_step=16, **kw)
    assert (roomy.micro_batch, roomy.grad_accum) == (16, 1)
    prime = tokens_per_step(6_000.0, rows_fit=6, rows_per_step=7, **kw)
    assert (prime.micro_batch, prime.grad_accum) == (1, 7)  # only 1 divides 7 below 6: still exactly 7 rows
    with pytest.raises(InputError, match="rows_per_step"):
        tokens_per_step(6_000.0, rows_fit=6, rows_per_step=0, **kw)
