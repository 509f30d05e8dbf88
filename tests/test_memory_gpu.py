"""The memory phase on a real CUDA card (skipped without one; the lead runs them on the device).

The card is made small with ``card_bytes`` (what this process and every other already use,
plus a little), so the tiny model meets real OOMs and retries in seconds.
"""

import gc
import subprocess
import sys

import pytest
import torch

from helpers import make_model
from leadline.lookahead.memory import WontFit, ramp
from leadline.memory import (
    RoomShrank,
    TrainingStep,
    forbid_spill,
    lift_cap,
    measure_fit,
    watched,
)
from leadline.memory.model_step import ModelStep, full_finetune
from leadline.memory_readings import CudaMemory

pytestmark = pytest.mark.gpu
MB = 2**20


def small_card(extra_bytes: int) -> CudaMemory:
    """A card with ``extra_bytes`` of room beyond what every process holds now (cache emptied)."""
    gc.collect()
    torch.cuda.empty_cache()
    real = CudaMemory("cuda:0")
    free, total = real.real_free_total()
    return CudaMemory("cuda:0", card_bytes=total - free + extra_bytes)


def tiny_step():
    model = full_finetune(make_model(vocab_size=384, hidden=64, layers=2).to("cuda"))
    return model, ModelStep(model)


def test_step_on_cuda_leaves_weights_and_optimizer_as_they_were():
    model, step = tiny_step()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    t = step(4, 128, repeats=3)
    assert t.t_micro_seconds > 0 and t.t_step_seconds > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert len(step.optimizer.state) == 0 and all(p.grad is None for p in model.parameters())


def test_ramp_on_a_small_card_meets_ooms_keeps_a_batch_that_holds_and_lifts_its_cap():
    _, step = tiny_step()
    torch.cuda.set_per_process_memory_fraction(0.9, 0)
    try:
        mem = small_card(256 * MB)
        r = ramp(step, 512, lengths=[64, 512, 200, 480, 32], memory=mem)
        assert r.micro_batch >= 1 and r.rule == "allocator"
        assert any(g.verdict == "oom" for g in r.rungs), "the small card never refused: make it smaller"
        assert r.t_micro_seconds and r.t_step_seconds
        assert torch.cuda.get_per_process_memory_fraction(0) == pytest.approx(0.9)
        # the kept batch holds: 10 more steps in a row under the cap, no OOM, no retry
        with forbid_spill(memory=mem):
            r0 = mem.alloc_retries()
            step(r.micro_batch, 512, repeats=10)
            assert mem.alloc_retries() == r0
        over = next(g.rows for g in r.rungs if g.verdict != "fits" and g.rows > r.micro_batch)
        fit_ok = measure_fit(step, r.micro_batch, 512, memory=mem, suggest=False)
        fit_no = measure_fit(step, over, 512, memory=mem)
        assert fit_ok.fits and not fit_no.fits
        assert "what would fit:" in fit_no.sentence
        rows_alt = next(a for a in fit_no.alternatives if a["what"] == "rows")
        assert rows_alt["fits"] and rows_alt["rows"] >= r.micro_batch  # the ramp is the stricter test
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)


def test_nothing_fits_is_a_sentence_not_an_oom():
    _, step = tiny_step()
    with pytest.raises(WontFit, match="not even 1 row"):
        ramp(step, 512, memory=small_card(1 * MB))


def test_the_watch_follows_another_process_taking_memory():
    model, _ = tiny_step()
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, torch; torch.empty(1, device='cuda'); print('ready', flush=True);"
         " sys.stdin.readline(); x = torch.empty(512 * 2**20, dtype=torch.uint8, device='cuda');"
         " torch.cuda.synchronize(); print('took', flush=True); sys.stdin.readline()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with forbid_spill("cuda:0") as cap:
            start = watched("cuda:0").cap_bytes
            child.stdin.write("take\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "took"
            cap.watch._next_due = 0.0
            model(torch.ones(1, 8, dtype=torch.long, device="cuda"))  # the next outermost forward reads
            rep = watched("cuda:0")
            assert rep.cap_bytes <= start - 512 * MB
            assert rep.cap_moves[-1]["reason"] == "forward"
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    assert lift_cap("cuda:0").active is False
    assert torch.cuda.get_per_process_memory_fraction(0) == pytest.approx(1.0)


def test_an_oom_under_the_cap_is_leadlines_sentence():
    with pytest.raises(RoomShrank, match="ran out of memory at the cap"), forbid_spill(memory=small_card(64 * MB)):
        torch.empty(2**34, dtype=torch.uint8, device="cuda")
    assert torch.cuda.get_per_process_memory_fraction(0) == pytest.approx(1.0)


def test_training_step_direct_on_cuda_counts_optimizer_state_in_the_peak():
    model = make_model(vocab_size=384, hidden=64, layers=2).to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 384, (2, 64), device="cuda")
    step = TrainingStep(lambda b, n: model(input_ids=ids[:b, :n], labels=ids[:b, :n]).loss, opt)
    torch.cuda.synchronize()
    weights = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step(2, 64)
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert torch.cuda.max_memory_allocated() >= weights + 3 * n_bytes  # grads + two Adam states
