"""The ramp's decisions on a fake allocator: recorded peaks, retries, OOMs, a shrinking card."""

import pytest
import torch.nn.modules.module as torch_module
import torch.optim.optimizer as torch_optimizer

from leadline.lookahead.memory import RampResult, WontFit, ramp
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
    assert mixed.lengths_mix == [5, 3]  # 10 is the full length: it runs after each of them
    kept_mix = [(g.length, g.verdict) for g in mixed.rungs if g.rows == 14 and g.phase == "mix"]
    assert kept_mix == [(5, "fits"), (10, "fits"), (3, "fits"), (10, "fits")]


# The H200 case (benchmarks/results/memory_ramp/lora16_6gb_seq512.json), scaled onto the fake:
# 100 + rows x length bytes against 2400, so 4 rows fit at 512 (2148) and 5 do not (2660).
H200_MIX = [112, 136, 107, 52, 106, 253, 49, 212]  # the corpus lengths the ramp ran there
OLD_CONFIRMATION = [*H200_MIX, 512]  # what it ran after its repeats: 4 rows passed, 50 real steps did not
# the padded lengths of the real run's first 18 micro-batches at 4 rows; on the H200 the allocator
# retried at the 18th (512, its first full-length step), on a cache laid out by the 489 before
RUN_START = [124, 489, 318, 257, 260, 226, 208, 248, 382, 161, 294, 134, 105, 217, 361, 256, 215, 512]


def fragmenting(frag: int, short_below: int = 128, oom: bool = False) -> tuple[FakeAllocator, FakeStep]:
    """A 512-token step right after one shorter than ``short_below`` needs ``frag`` more
    reserved (a retry), or with ``oom`` that much more allocated (an OOM)."""
    mem = FakeAllocator(total=2400, resident=100)

    def after_short(n: int) -> bool:
        return n == 512 and mem.dirty_length is not None and mem.dirty_length < short_below

    def peak_of(r: int, n: int) -> int:
        return 100 + r * n + (frag if oom and after_short(n) else 0)

    def frag_of(r: int, n: int) -> int:
        return frag if not oom and after_short(n) else 0

    return mem, FakeStep(mem, per_token=1, peak_of=peak_of, frag_of=frag_of)


def growing(frag: int = 400) -> tuple[FakeAllocator, FakeStep]:
    """What the H200 showed: a 512-token step needs ``frag`` more reserved when the cache holds
    the blocks of a step within 10% below 512 and none of a 512-token step (from an emptied
    cache, 489 then 512 retried at 4 rows; 3 steps at 512 first, then the run's lengths, did not)."""
    mem = FakeAllocator(total=2400, resident=100)

    def frag_of(r: int, n: int) -> int:
        held = mem.since_empty
        return frag if n == 512 and held and 512 not in held and max(held) >= 0.9 * 512 else 0

    return mem, FakeStep(mem, per_token=1, frag_of=frag_of)


def replay(step: FakeStep, rows: int, lengths: list[int], repeats_first: int = 0) -> list[str]:
    """The verdicts of ``lengths`` run at ``rows`` from an emptied cache (after ``repeats_first``
    steps at 512), the way the old confirmation or a run would run them."""
    step.mem.empty_cache()
    if repeats_first:
        step(rows, 512, repeats_first)
    n0 = len(step.mem.steps)
    for n in lengths:
        step(rows, n, 1)
    return [v for _, _, v in step.mem.steps[n0:]]


def confirmation_calls(step: FakeStep, rows: int) -> list[tuple[int, int]]:
    """(length, repeats) of every call at ``rows`` after its search step: what the confirmation ran."""
    calls = [(n, k) for r, n, k in step.calls if r == rows]
    return calls[1:] if calls and calls[0] == (512, 1) else calls


def interleaved(mix: list[int]) -> list[tuple[int, int]]:
    """The repeats, then each mix length followed by the full length."""
    return [(512, 3)] + [c for n in mix for c in ((n, 1), (512, 1))]


def test_the_long_step_after_a_short_one_is_confirmed_and_lowers_the_batch_to_three():
    # the old confirmation on this fake: 4 rows pass it (212, before its one 512, is not short)
    _, step = fragmenting(frag=400)
    assert replay(step, 4, OLD_CONFIRMATION, repeats_first=3) == ["fits"] * 9

    # the new one, longest first: the 512-token step after 112 retries at 4 rows
    # (2148 + 400 > 2400), not at 3 rows (1636 + 400 <= 2400)
    mem, step = fragmenting(frag=400)
    r = ramp(step, 512, lengths=H200_MIX, memory=mem)
    assert r.micro_batch == 3
    assert search_rows(r) == [1, 2, 4, 8, 6, 5, 3]
    longest_first = [253, 212, 136, 112, 107, 106, 52, 49]
    assert confirmation_calls(step, 4) == interleaved([253, 212, 136, 112])  # stopped at the retry
    assert confirmation_calls(step, 3) == interleaved(longest_first)
    mix4 = [(g.length, g.verdict, g.retries) for g in r.rungs if g.rows == 4 and g.phase == "mix"]
    assert mix4[-2:] == [(112, "fits", 0), (512, "squeezed", 1)]
    mix3 = [(g.length, g.verdict) for g in r.rungs if g.rows == 3 and g.phase == "mix"]
    assert mix3 == [(n, "fits") for m in longest_first for n in (m, 512)]
    assert r.lengths_mix == longest_first
    assert "longest first, with the full length after each" in r.source()


def test_a_full_length_step_on_a_cache_laid_out_by_a_slightly_shorter_one_lowers_the_batch():
    _, step = growing()
    # the fake does what the H200 did: the run's own start retries at its first 512 at 4 rows
    assert replay(step, 4, RUN_START) == ["fits"] * 17 + ["squeezed"]
    assert replay(step, 3, RUN_START) == ["fits"] * 18
    # and the confirmations that missed it on the card miss it here: the old one (a 512-token
    # layout from the repeats first), and short-then-long pairs in the corpus's own order
    assert "squeezed" not in replay(step, 4, RUN_START, repeats_first=3)
    assert "squeezed" not in replay(step, 4, [n for m in RUN_START[:8] for n in (m, 512)])

    mem, step = growing()
    r = ramp(step, 512, lengths=RUN_START, memory=mem)
    assert r.micro_batch == 3
    # the cache is emptied after the repeats, then the longest length below 512 goes first
    assert confirmation_calls(step, 4) == [(512, 3), (489, 1), (512, 1)]
    assert [(g.length, g.verdict) for g in r.rungs if g.rows == 4 and g.phase == "mix"] == [(489, "fits"), (512, "squeezed")]
    assert r.lengths_mix == [489, 361, 260, 256, 226, 215, 134, 105]
    assert confirmation_calls(step, 3) == interleaved(r.lengths_mix)


def test_a_failed_confirmation_steps_down_and_the_lower_rung_runs_the_whole_confirmation():
    # only the step after 49 (the last of the 8 mix lengths) fragments, by 1000: 4 and 3 rows
    # retry there (2148 + 1000, 1636 + 1000 > 2400), 2 rows do not (1124 + 1000)
    mem, step = fragmenting(frag=1000, short_below=50)
    r = ramp(step, 512, lengths=H200_MIX, memory=mem)
    assert r.micro_batch == 2
    confirms = [(g.rows, g.verdict) for g in r.rungs if g.phase == "confirm"]
    assert confirms == [(4, "fits"), (3, "fits"), (2, "fits")]  # the repeats alone pass them all
    longest_first = sorted(H200_MIX, reverse=True)
    for rows in (4, 3, 2):  # every candidate ran every step, to the last
        assert confirmation_calls(step, rows) == interleaved(longest_first)
    last = {rows: [g for g in r.rungs if g.rows == rows and g.phase == "mix"][-1] for rows in (4, 3, 2)}
    assert (last[4].length, last[4].verdict) == (last[3].length, last[3].verdict) == (512, "squeezed")
    assert (last[2].length, last[2].verdict) == (512, "fits")
    assert mem.cap is None


def test_an_oom_at_the_interleaved_long_step_fails_the_rung():
    mem, step = fragmenting(frag=400, oom=True)  # 2148 + 400 allocated > 2400: refused at 4 rows
    r = ramp(step, 512, lengths=H200_MIX, memory=mem)
    assert r.micro_batch == 3
    mix4 = [(g.length, g.verdict) for g in r.rungs if g.rows == 4 and g.phase == "mix"]
    assert mix4[-2:] == [(112, "fits"), (512, "oom")]
    assert confirmation_calls(step, 3) == interleaved(sorted(H200_MIX, reverse=True))


def test_the_confirmation_stays_bounded_on_a_long_corpus():
    corpus = [16 + (i * 37) % 600 for i in range(4096)]  # 4096 rows, some over 512 (not picked)
    mem = FakeAllocator(total=2400, resident=100)
    step = FakeStep(mem, per_token=1)
    r = ramp(step, 512, lengths=corpus, memory=mem)
    assert r.micro_batch == 4
    real_steps = sum(k for _, _, k in step.calls)
    assert real_steps == len(search_rows(r)) + 3 + 16  # one step a search rung, 3 repeats, 16 mix steps
    mix = [g.length for g in r.rungs if g.phase == "mix"]
    assert len(mix) == 16 and mix[1::2] == [512] * 8
    assert mix[0::2] == sorted(mix[0::2], reverse=True) and mix[0] == 511 and mix[-2] == 16
    assert r.lengths_mix == mix[0::2]
    mem = FakeAllocator(total=2400, resident=100)
    r = ramp(FakeStep(mem, per_token=1), 512, lengths=corpus, memory=mem, mix_steps=4)
    assert [g.length for g in r.rungs if g.phase == "mix"] == [511, 512, 16, 512]


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


def test_the_fit_preflight_runs_the_same_confirmation_and_refuses_what_the_run_would_retry():
    from leadline.memory import measure_fit

    # two steps at 512 let 4 rows through (what the H200 benchmark's R5 found); through the mix they retry
    mem, step = growing()
    plain = measure_fit(step, 4, 512, memory=mem, suggest=False)
    assert plain.fits
    mem, step = growing()
    mixed = measure_fit(step, 4, 512, memory=mem, suggest=False, lengths=RUN_START)
    assert mixed.verdict == "squeezed" and mixed.retries >= 1
    assert [(g.length, g.verdict) for g in mixed.rungs if g.phase == "mix"] == [(489, "fits"), (512, "squeezed")]
    assert "through the corpus's length mix" in mixed.sentence and "at a step of 512 tokens" in mixed.sentence
    mem, step = growing()
    assert measure_fit(step, 3, 512, memory=mem, suggest=False, lengths=RUN_START).fits
    assert mem.cap is None


def test_should_stop_ends_the_search_and_keeps_what_it_confirmed():
    mem = FakeAllocator(total=1000, resident=100)
    step = FakeStep(mem, per_token=5)  # 18 rows is the truth
    r = ramp(step, 10, memory=mem, should_stop=lambda rung: rung.rows >= 4)
    assert r.micro_batch == 4 and search_rows(r) == [1, 2, 4]
    assert r.stopped_because.startswith("max_seconds")
    assert [g.rows for g in r.rungs if g.phase == "confirm"] == [4] and mem.cap is None
    host = FakeHost(room=10**9)
    hstep = FakeHostStep(host, seconds_of=lambda rows: 0.1 + 0.01 * rows)
    h = ramp(hstep, 16, memory=host, should_stop=lambda rung: rung.rows >= 8)
    assert h.micro_batch == 8 and hstep.calls == [1, 1, 2, 4, 8] and h.stopped_because.startswith("max_seconds")


def test_too_long_does_not_start_a_host_rung_that_cannot_finish(monkeypatch):
    import sys
    import types

    ramp_mod = sys.modules["leadline.lookahead.memory.ramp"]  # the module: leadline.lookahead.memory.ramp is also the function
    probe_mod = sys.modules["leadline.memory.probe"]  # each rung's step is timed there

    clock = [0.0]  # the ramp's clock, moved by the fake step as long as its repeats take
    for mod in (ramp_mod, probe_mod):
        monkeypatch.setattr(mod, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    class Timed(FakeHostStep):
        def __call__(self, rows, length, repeats=1):
            t = super().__call__(rows, length, repeats)
            clock[0] += repeats * (t.t_micro_seconds + t.t_step_seconds)
            return t

    host = FakeHost(room=10**9)
    hstep = Timed(host, seconds_of=lambda rows: 0.5 + 1.0 * rows)  # 2 rows beat 1 in rows per second
    asked: list[float] = []

    def too_long(seconds):
        asked.append(seconds)
        return seconds > 12.0  # 2 rows take 7.5 s (3 repeats): 4 rows projected 15 s

    h = ramp(hstep, 16, memory=host, too_long=too_long)
    assert hstep.calls == [1, 1, 2] and h.micro_batch == 2 and h.stopped_because.startswith("max_seconds")
    assert asked[-1] > 12.0


def test_too_long_on_cuda_counts_the_confirmation_and_the_mix_a_try_would_start(monkeypatch):
    """On CUDA a try that fits is confirmed by its repeats and the length mix: on an 8B model
    that is over a minute. too_long is asked for all of it before the try starts."""
    import sys
    import types

    ramp_mod = sys.modules["leadline.lookahead.memory.ramp"]
    clock = [0.0]
    for mod in (ramp_mod, sys.modules["leadline.memory.probe"]):  # the ramp's clock, and each rung's timing
        monkeypatch.setattr(mod, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    mem = FakeAllocator(total=1000, resident=100)  # 18 rows at 10 tokens is the truth

    def seconds_of(rows, length):  # a second a row at the full length, the clock moved by every repeat
        return 1.0 * rows * length / 10

    def after(step, rows, length):
        clock[0] += step.calls[-1][2] * seconds_of(rows, length)

    step = FakeStep(mem, per_token=5, seconds_of=seconds_of, after_call=after)
    asked: list[float] = []

    def too_long(seconds):
        asked.append(seconds)
        return seconds > 20.0

    # a try at 4 rows, a second a row, costs 4 x (1 + 3 repeats + the mix 5, 10 at 1.5) = 22 s
    r = ramp(step, 10, memory=mem, lengths=[5] * 50 + [10], mix_steps=2, too_long=too_long)
    assert search_rows(r) == [1, 2] and r.micro_batch == 2 and r.stopped_because.startswith("max_seconds")
    assert asked == [pytest.approx(2 * 5.5), pytest.approx(4 * 5.5)]
    assert [(g.rows, g.length) for g in r.rungs if g.phase != "search"] == [(2, 10), (2, 5), (2, 10)]
    free = FakeAllocator(total=1000, resident=100)
    unbounded = ramp(FakeStep(free, per_token=5), 10, memory=free)
    assert unbounded.micro_batch == 18  # without too_long the same card keeps the truth


def test_one_row_that_squeezes_through_the_length_mix_is_named_with_the_fragmentation_fix():
    """The H200's 6 GB case at 2048 tokens: 1 row fit at the full length, then needed the
    allocator's retry through the length mix; the sentence names that rung, not the first."""
    mem = FakeAllocator(total=1000, resident=100)
    # 1 row at 10 tokens: 100 + 850 = 950 of 1000; after a shorter step the cache adds 200 (a retry)
    step = FakeStep(mem, per_token=85, frag_of=lambda r, n: 200 if mem.dirty_length not in (None, n) else 0)
    with pytest.raises(WontFit) as e:
        ramp(step, 10, memory=mem, lengths=[5, 10, 3])
    msg = str(e.value)
    assert msg.startswith("not even 1 row at 10 tokens fits on cuda:0")
    assert "through the corpus's length mix" in msg and "retried" in msg and "expandable_segments" in msg
    assert e.value.result.micro_batch == 0


def test_a_candidates_seconds_are_the_line_through_the_last_two_fitted_rungs():
    from leadline.lookahead.memory.ramp import candidate_seconds
    from leadline.memory.probe import Rung

    def rung(rows, seconds, verdict="fits", length=10, phase="search"):
        return Rung(rows, length, 0, 0, 0, verdict, seconds, phase, 1)

    assert candidate_seconds([rung(1, 2.0, "oom")], 2, 10, 3, []) is None  # nothing fitted: no forecast
    one = candidate_seconds([rung(2, 3.0)], 4, 10, 3, [5, 10])  # one rung: 1.5 s a row, no fixed cost
    assert one == pytest.approx(6.0 * 4 + 1.5 * 4 * 1.5)
    # 1 s fixed + 1 s a row: a try at 4 rows is 5 s a step, 4 steps, and the mix's 5 and 10 tokens
    two = candidate_seconds([rung(1, 2.0), rung(2, 3.0), rung(4, 99.0, "oom"), rung(2, 50.0, phase="confirm")],
                            4, 10, 3, [5, 10])
    assert two == pytest.approx(5.0 * 4 + (1 + 4 * 0.5) + (1 + 4 * 1.0)) and two < one
    # a step that got faster with more rows (noise) is never forecast below the last rung's seconds
    assert candidate_seconds([rung(1, 3.0), rung(2, 2.0)], 4, 10, 0, []) == pytest.approx(2.0)
