"""The ramp's decisions on a fake allocator: recorded peaks, retries, OOMs, a shrinking card."""

import pytest
import torch.nn.modules.module as torch_module
import torch.optim.optimizer as torch_optimizer

from leadline.memory import RampResult, WontFit, ramp
from test_memory_fakes import FakeAllocator, FakeHost, FakeHostStep, FakeStep


def hooks():
    return len(torch_module._global_forward_pre_hooks), len(torch_optimizer._global_optimizer_post_hooks)


def search_rows(result: RampResult):
    return [r.rows for r in result.rungs if r.phase == "search"]


def test_known_answer_doubling_bisection_and_ooms_are_rungs():
    before = hooks()
    mem = FakeAllocator(total=1000, resident=100)
    step = FakeStep(mem, per_token=5)  # 50 bytes a row at 10 tokens: 100 + 50 r <= 1000 -> 18
    r = ramp(step, 10, memory=mem)
    assert r.micro_batch == 18
    assert search_rows(r) == [1, 2, 4, 8, 16, 32, 24, 20, 18, 19]
    verdicts = {g.rows: g.verdict for g in r.rungs if g.phase == "search"}
    assert verdicts[32] == verdicts[24] == verdicts[20] == verdicts[19] == "oom"
    assert verdicts[18] == "fits"
    confirm = [g for g in r.rungs if g.phase == "confirm"]
    assert [(g.rows, g.repeats, g.verdict) for g in confirm] == [(18, 3, "fits")]
    assert r.budget_bytes == 1000 and r.rule == "allocator"
    assert r.t_micro_seconds == pytest.approx(0.18) and r.t_step_seconds == pytest.approx(0.001)
    assert mem.cap is None and hooks() == before  # the cap it set is lifted, the hooks are gone


def test_a_batch_that_squeezes_in_on_the_second_step_is_not_kept():
    mem = FakeAllocator(total=1000, resident=100)
    # a dirty cache adds 30 bytes: 18 rows fit once (1000) but need a retry the second time (1030)
    step = FakeStep(mem, per_token=5, frag_of=lambda r, n: 30)
    r = ramp(step, 10, memory=mem)
    assert r.micro_batch == 17
    confirm = [(g.rows, g.verdict, g.retries) for g in r.rungs if g.phase == "confirm"]
    assert confirm == [(18, "squeezed", 2), (17, "fits", 0)]  # the 2nd and 3rd steps retried


def test_a_rung_that_needed_the_allocators_retry_is_not_kept():
    mem = FakeAllocator(total=1000, resident=100, squeeze_margin=100)  # > 900 bytes needs a retry
    r = ramp(FakeStep(mem, per_token=5), 10, memory=mem)
    verdicts = {g.rows: (g.verdict, g.retries) for g in r.rungs if g.phase == "search"}
    assert verdicts[18] == ("squeezed", 1) and verdicts[17] == ("squeezed", 1)
    assert r.micro_batch == 16


def test_the_length_mix_fragments_the_cache_and_lowers_the_batch():
    def run(lengths):
        mem = FakeAllocator(total=1000, resident=100)
        step = FakeStep(mem, per_token=5, frag_of=lambda r, n: 200 if mem.dirty_length not in (None, n) else 0)
        return ramp(step, 10, memory=mem, lengths=lengths)

    assert run(None).micro_batch == 18
    mixed = run([5, 10, 3])
    # back at 10 tokens after 3, a fragmented cache adds 200: 100 + 50 r + 200 <= 1000 -> 14
    assert mixed.micro_batch == 14
    assert mixed.lengths_mix == [5, 10, 3]
    kept_mix = [(g.length, g.verdict) for g in mixed.rungs if g.rows == 14 and g.phase == "mix"]
    assert kept_mix == [(5, "fits"), (10, "fits"), (3, "fits"), (10, "fits")]


def test_memory_outside_the_allocator_growing_lowers_the_cap():
    mem = FakeAllocator(total=1000, resident=100)

    def kernels_load(step, rows, length):
        if len(step.calls) == 1:
            mem.other += 200  # the CUDA context grows on the first step

    r = ramp(FakeStep(mem, per_token=5, after_call=kernels_load), 10, memory=mem)
    assert r.micro_batch == 14  # 100 + 50 r <= 800
    assert r.start_room_bytes == 1000 and r.budget_bytes == 800 and r.outside_growth_bytes == 200
    assert any(m["from_bytes"] == 1000 and m["to_bytes"] == 800 for m in r.cap_moves)
    assert mem.cap is None


def test_upper_limit_stops_the_ramp():
    mem = FakeAllocator(total=10**9, resident=100)
    step = FakeStep(mem, per_token=5)
    r = ramp(step, 10, memory=mem, max_rows=5)
    assert r.micro_batch == 5 and "upper limit of 5" in r.stopped_because
    assert max(rows for rows, _, _ in step.calls) == 5


def test_an_earlier_tighter_cap_is_respected_and_restored():
    mem = FakeAllocator(total=1000, resident=100)
    mem.cap = 700
    r = ramp(FakeStep(mem, per_token=5), 10, memory=mem)
    assert r.micro_batch == 12 and r.budget_bytes == 700
    assert mem.cap == 700


def test_nothing_fits_is_one_sentence_with_the_measurement():
    mem = FakeAllocator(total=1000, resident=100)
    with pytest.raises(WontFit, match="not even 1 row at 10 tokens fits on cuda:0") as e:
        ramp(FakeStep(mem, per_token=200), 10, memory=mem)
    assert e.value.result.rungs[0].verdict == "oom"
    assert mem.cap is None


def test_an_error_that_is_not_an_oom_rises_and_the_cap_is_lifted():
    before = hooks()
    mem = FakeAllocator(total=1000, resident=100)

    def broken(step, rows, length):
        if rows == 4:
            raise ValueError("the user's loss_of broke")

    with pytest.raises(ValueError, match="loss_of broke"):
        ramp(FakeStep(mem, per_token=5, after_call=broken), 10, memory=mem)
    assert mem.cap is None and hooks() == before


def test_evidence_follows_the_ramp_plot_shape():
    mem = FakeAllocator(total=1000, resident=100)
    values = ramp(FakeStep(mem, per_token=5), 10, memory=mem).as_values()
    mb = values["micro_batch"]
    assert mb.kind == "measured" and mb.value == 18 and mb.unit == "rows"
    ev = mb.evidence
    assert ev["plot"] == "ramp" and ev["budget_bytes"] == 1000
    for rung in ev["rungs"]:
        assert {"rows", "length", "peak_bytes", "reserved_bytes", "retries", "verdict", "seconds"} <= set(rung)
        assert rung["verdict"] in ("fits", "squeezed", "oom")
    assert values["t_micro_seconds"].value == pytest.approx(0.18)
    assert "median of 3" in values["t_micro_seconds"].source


def test_off_cuda_the_ramp_keeps_where_rows_per_second_stop_improving():
    host = FakeHost(room=10**9)
    step = FakeHostStep(host, seconds_of=lambda r: 0.1 + 0.01 * r)  # rows/s saturates at 100
    r = ramp(step, 16, memory=host)
    # rows/s: 64 -> 86.5, 128 -> 92.8 (+7.2%), 256 -> 96.2 (+3.8%): keep 128
    assert r.micro_batch == 128 and r.rule == "throughput"
    assert step.calls == [1, 1, 2, 4, 8, 16, 32, 64, 128, 256]  # a warm-up step, then the rungs
    assert r.rungs[0].phase == "warmup"
    assert "less than 5%" in r.stopped_because
    assert r.t_micro_seconds == pytest.approx(1.38)


def test_off_cuda_the_ramp_is_bounded_by_ram():
    host = FakeHost(room=1000, baseline=100)
    step = FakeHostStep(host, seconds_of=lambda r: 0.01, peak_of=lambda r, n: 100 + 50 * r)
    r = ramp(step, 16, memory=host)
    assert r.micro_batch == 16 and max(step.calls) == 16  # 32 rows would need 1700 of 1000
    assert "RAM room" in r.stopped_because


def test_bad_arguments_are_one_sentence():
    mem = FakeAllocator()
    with pytest.raises(ValueError, match="length >= 1"):
        ramp(FakeStep(mem), 0, memory=mem)
    with pytest.raises(ValueError, match="max_rows"):
        ramp(FakeStep(mem), 8, memory=mem, max_rows=0)
