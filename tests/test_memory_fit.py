"""The fit pre-flight on a fake allocator: verdicts, the sentences, what would fit, the 4x guard."""

import pytest
import torch
import torch.nn.modules.module as torch_module

from leadline.memory import estimate_step_bytes, measure_fit, rank_to_fit
from test_memory_fakes import FakeAllocator, FakeHost, FakeHostStep, FakeStep

GB = 10**9


def card():
    # a 6 GB card, 1 GB of weights, 250 kB a token: 512 MB a row at 2048 tokens
    mem = FakeAllocator(total=6 * GB, resident=1 * GB)
    return mem, FakeStep(mem, per_token=250_000)


def test_a_shape_that_fits():
    mem, step = card()
    r = measure_fit(step, 8, 2048, memory=mem)
    assert r.fits and r.verdict == "fits" and r.peak_bytes == 1 * GB + 8 * 512_000_000
    assert r.sentence == ("fits: a training step of 8 rows x 2048 tokens measured a peak of 5.10 GB allocated "
                          "(5.10 GB reserved, 0 allocator retries) against 6.00 GB of room on cuda:0; "
                          "a long run should plan on 5.20 GB (+2%, the allocator's drift)")
    assert r.run_peak_bytes == -(-r.peak_bytes * 102 // 100)  # the measured peak plus LONG_RUN_DRIFT
    assert r.as_values()["fit_run_peak_bytes"].value == r.run_peak_bytes
    assert step.calls == [(8, 2048, 2)]  # two steps in a row
    assert mem.cap is None


def test_a_refusal_names_the_peak_the_room_and_what_would_fit_each_measured():
    hooks0 = len(torch_module._global_forward_pre_hooks)
    mem, step = card()
    r = measure_fit(step, 16, 2048, memory=mem)
    assert r.verdict == "oom" and not r.fits
    # known answers: 1 GB + 512 MB x 9 <= 6 GB; 1 GB + 16 x 250 kB x n <= 6 GB -> n <= 1250, on a 64-token grid 1216
    assert [a["text"] for a in r.alternatives] == [
        "9 rows x 2048 tokens (measured 5.61 GB)", "16 rows x 1216 tokens (measured 5.86 GB)"]
    assert r.sentence == (
        "refused: a training step of 16 rows x 2048 tokens ran out of memory at 6.00 GB of room on cuda:0 "
        "(the peak measured before the refusal: 6.00 GB allocated); what would fit: 9 rows x 2048 tokens "
        "(measured 5.61 GB) or 16 rows x 1216 tokens (measured 5.86 GB) (not measured: gradient checkpointing "
        "or a lower LoRA rank)")
    assert mem.cap is None and len(torch_module._global_forward_pre_hooks) == hooks0
    v = r.as_values()
    assert v["fit_verdict"].value == "oom" and v["fit_verdict"].evidence["plot"] == "ramp"
    assert v["fit_verdict"].evidence["budget_bytes"] == 6 * GB


def test_squeezed_is_refused():
    mem, step = card()
    mem.squeeze_margin = 1 * GB  # above 5 GB the allocator has to empty its cache and retry
    r = measure_fit(step, 8, 2048, memory=mem, suggest=False)
    assert r.verdict == "squeezed" and r.retries == 2
    assert "emptied its cache and retried" in r.sentence
    assert r.sentence.endswith("what would fit: fewer rows, a shorter length, gradient checkpointing or a lower LoRA rank (not measured)")


def test_more_than_4x_over_is_refused_before_touching_the_card():
    mem, step = card()

    def estimate(rows, length):
        return 1 * GB + rows * length * 1_000_000

    r = measure_fit(step, 16, 2048, memory=mem, estimate=estimate)
    assert r.verdict == "too_large" and r.peak_bytes is None and r.estimate_bytes == 1 * GB + 16 * 2048 * 10**6
    assert r.as_values()["fit_verdict"].kind == "derived" and "fit_peak_bytes" not in r.as_values()
    assert (16, 2048) not in [(b, n) for b, n, _ in step.calls]
    assert all(estimate(b, n) <= 4 * 6 * GB for b, n, _ in step.calls)  # nothing past the guard ran
    assert r.sentence.startswith("refused before touching the card: a training step of 16 rows x 2048 tokens "
                                 "would need an estimated 33.77 GB, more than 4x the 6.00 GB of room on cuda:0; "
                                 "what would fit: 9 rows x 2048 tokens")


def test_off_cuda_a_shape_over_the_ram_is_refused_from_the_scout_without_running_it():
    host = FakeHost(room=1 * GB, baseline=100_000_000)
    step = FakeHostStep(host, seconds_of=lambda r: 0.01, peak_of=lambda r, n: 100_000_000 + 1_000_000 * r * n)
    r = measure_fit(step, 128, 10, memory=host)
    assert r.verdict == "over" and 128 not in step.calls[:2] and step.calls[:2] == [1, 2]
    assert r.peak_bytes == 100_000_000 + 1_280_000_000
    assert "would peak near 1.38 GB (extrapolated from 1 row x 10 tokens measured at 110 MB and 2 rows x 10 " \
           "tokens measured at 120 MB) against 1.00 GB of RAM room on cpu" in r.sentence
    assert [(a["rows"], a["length"]) for a in r.alternatives] == [(90, 10), (128, 7)]
    length_rungs = [g for g in r.rungs if g.phase == "length"]
    assert step.calls.count(128) == len(length_rungs) and all(g.length <= 7 for g in length_rungs)


def test_rank_to_fit_finds_the_largest_rank_the_memory_holds():
    mem = FakeAllocator(total=6 * GB, resident=1 * GB)
    closed = []

    class RankStep(FakeStep):
        def close(self):
            closed.append(self.rank)

    def step_at_rank(rank):
        s = RankStep(mem, peak_of=lambda rows, n: 1 * GB + rank * 200_000_000)
        s.rank = rank
        return s

    found = rank_to_fit(step_at_rank, 4, 512, ranks=(1, 2, 4, 8, 16, 32, 64), memory=mem)
    assert found.rank == 16  # 1 GB + 0.2 GB x r <= 6 GB -> r <= 25
    assert sorted(closed) == sorted(t["rank"] for t in found.tried)
    v = found.as_values()["lora_rank"]
    assert v.value == 16 and v.kind == "measured" and v.evidence["tried"]


def test_estimate_known_answer():
    class Tiny(torch.nn.Module):
        class config:
            hidden_size, num_hidden_layers, vocab_size = 8, 2, 10

        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(8, 10, bias=False)  # 80 float32 weights, all trained

    # weights 320 + grads 320 + Adam 640 + activations 2 layers x 17 x 4 B x 6 tokens x 8 + logits 6 x 10 x 12
    assert estimate_step_bytes(Tiny(), 2, 3) == 320 + 960 + 2 * 17 * 4 * 6 * 8 + 6 * 10 * 12
    assert estimate_step_bytes(torch.nn.Linear(2, 2), 1, 1) is None


def test_bad_shape():
    mem, step = card()
    with pytest.raises(ValueError, match="rows >= 1"):
        measure_fit(step, 0, 10, memory=mem)


def test_off_cuda_an_estimate_over_the_ram_is_not_run_at_all():
    host = FakeHost(room=1 * GB, baseline=100_000_000)
    step = FakeHostStep(host, seconds_of=lambda r: 0.01, peak_of=lambda r, n: 100_000_000 + 1_000_000 * r * n)
    r = measure_fit(step, 64, 100, memory=host, estimate=lambda b, n: 100_000_000 + 2_000_000 * b * n)
    assert r.verdict == "too_large"
    assert r.sentence.startswith("refused before running (nothing caps the host): a training step of 64 rows x "
                                 "100 tokens would need an estimated 12.90 GB, more than the 1.00 GB of RAM room on cpu")
    assert all(g.rows * g.length * 2_000_000 + 100_000_000 <= 1 * GB for g in r.rungs)  # the guard held at 1x
    assert [(a["rows"], a["length"]) for a in r.alternatives] == [(4, 100), (64, 6)]  # lengths on a 3-token grid
