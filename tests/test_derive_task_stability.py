"""The repeated-derive rules of benchmarks/derive_task.py (S4: the step within 20%, S5: the rate
within one grid step), on recorded plans."""

from __future__ import annotations

from helpers import load_benchmark


def _bench():
    return load_benchmark("derive_task")


def test_the_three_gsm_plans_of_one_card_fail_the_step_rule_and_pass_the_rate_rule():
    # three recorded plans of one card (scoreboard_gsm_symbolic.json): 19, 30 and 27 rows a step
    runs = [{"values": {"tokens_per_step": 1821.2, "lr": 2.96e-3}},
            {"values": {"tokens_per_step": 2875.6, "lr": 3.66e-3}},
            {"values": {"tokens_per_step": 2588.1, "lr": 4.57e-4}}]
    got = _bench().stability(runs[:2])
    assert got["S4"] is False and got["S5"] is True
    assert got["tokens_per_step_max_over_min"] == 2875.6 / 1821.2
    assert _bench().stability(runs)["S5"] is False  # the third plan's rate, 6.5x below


def test_plans_within_the_bounds_pass_and_a_missing_plan_is_not_judged():
    bench = _bench()
    got = bench.stability([{"values": {"tokens_per_step": 30.0, "lr": 9.27e-4}},
                           {"values": {"tokens_per_step": 34.0, "lr": 1.3e-3}}, {"rc": 1}])
    assert got["S4"] is True and got["S5"] is True
    assert bench.stability([{"values": {"tokens_per_step": 30.0}}, {"rc": 1}])["S4"] is None


def test_the_steps_range_is_recorded_against_the_noise_readings_error():
    bench = _bench()
    runs = [{"values": {"tokens_per_step": 50.0, "lr": 4.6e-4}, "noise_past_format_se_tokens": 85.0},
            {"values": {"tokens_per_step": 64.0, "lr": 4.6e-4}, "noise_past_format_se_tokens": 90.0}]
    got = bench.stability(runs)
    assert got["tokens_per_step_range_over_noise_se"] == 14.0 / 85.0
    assert got["S4"] is False  # 1.28x: the 20% rule, whatever the noise's error
    assert bench.stability([{"values": {"tokens_per_step": 50.0}}, {"values": {"tokens_per_step": 64.0}}])[
        "tokens_per_step_range_over_noise_se"] is None
