"""The spill cap and its watch on a fake allocator: set, moved, throttled, restored on every exit."""

import pytest
import torch
import torch.nn.modules.module as torch_module
import torch.optim.optimizer as torch_optimizer

from leadline.measure.wddm import WddmSample
from leadline.memory import RoomShrank, SpillWatch, forbid_spill, lift_cap, watched
from leadline.memory.cap import current_watch
from test_memory_fakes import FakeAllocator, FakeClock


def hooks():
    return len(torch_module._global_forward_pre_hooks), len(torch_optimizer._global_optimizer_post_hooks)


class Nested(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))

    def forward(self, x):
        return self.inner(x)


def test_function_form_caps_at_free_plus_held_and_lift_restores():
    before = hooks()
    mem = FakeAllocator(total=1000, resident=100, other=250, device="cuda:7")
    handle = forbid_spill(memory=mem)
    assert mem.cap == 750  # free 650 + held 100
    assert hooks() == (before[0] + 1, before[1] + 1)
    assert handle.active and current_watch("cuda:7") is handle.watch
    report = lift_cap("cuda:7")
    assert mem.cap is None and hooks() == before
    assert report.active is False and report.start_room_bytes == 750
    assert watched("cuda:7").readings == report.readings >= 1


def test_context_manager_restores_an_earlier_cap_after_an_exception():
    before = hooks()
    mem = FakeAllocator(total=1000, resident=100, device="cuda:6")
    mem.cap = 600
    with pytest.raises(KeyError, match="boom"), forbid_spill(memory=mem):
        assert mem.cap == 600  # never raised above a tighter cap set before
        assert hooks() != before
        raise KeyError("boom")
    assert mem.cap == 600 and hooks() == before
    assert current_watch("cuda:6") is None


def test_an_oom_inside_the_block_becomes_one_sentence():
    before = hooks()
    mem = FakeAllocator(total=1000, resident=100, device="cuda:5")
    with pytest.raises(RoomShrank) as e, forbid_spill(memory=mem):
        mem.other = 300  # another process took 300 bytes
        raise torch.OutOfMemoryError("CUDA out of memory")
    text = str(e.value)
    assert "ran out of memory" in text and "cuda:5" in text and "was 1000 MB" not in text
    assert "taken since the watch started" in text
    assert isinstance(e.value.__cause__, torch.OutOfMemoryError)
    assert hooks() == before and mem.cap is None


def test_nested_calls_do_not_lift_the_outer_cap():
    mem = FakeAllocator(total=1000, resident=100, device="cuda:4")
    with forbid_spill(memory=mem) as outer:
        with forbid_spill(memory=mem) as inner:
            assert outer.owner and not inner.owner
        assert outer.active and mem.cap == 1000
    assert mem.cap is None


def test_the_watch_follows_other_processes_before_the_next_forward():
    mem = FakeAllocator(total=1000, resident=100, device="cuda:3")
    model = Nested()
    with forbid_spill(memory=mem, max_overhead=1.0) as cap:
        cap.watch.clock, cap.watch._next_due = FakeClock(), 0.0  # readings cost nothing: every outermost forward reads
        n0 = watched("cuda:3").readings
        model(torch.ones(1, 4))
        assert watched("cuda:3").readings == n0 + 1  # one reading per outermost forward, none for inner modules
        mem.other = 300
        model(torch.ones(1, 4))
        assert mem.cap == 700
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 4)).sum().backward()
        mem.other = 100
        opt.step()
        assert mem.cap == 900
        rep = watched("cuda:3")
        assert rep.readings == n0 + 4
        assert [(m["from_bytes"], m["to_bytes"], m["reason"]) for m in rep.cap_moves[1:]] == [
            (1000, 700, "forward"), (700, 900, "optimizer step")]
        assert rep.least_room_bytes == 700
    assert mem.cap is None


def test_readings_are_throttled_by_their_own_cost():
    clock = FakeClock(100.0)
    mem = FakeAllocator(device="cuda:2", clock=clock)  # every reading costs 1 ms on this clock
    watch = SpillWatch(mem, max_overhead=0.01, clock=clock)
    watch.read()
    assert watch.report().readings == 1
    clock.advance(0.05)  # 50 ms later: a 1 ms reading is due only 100 ms after the last
    watch._maybe_read("forward")
    assert watch.report().readings == 1 and watch.report().skipped_checks == 1
    clock.advance(0.051)
    watch._maybe_read("forward")
    rep = watch.report()
    assert rep.readings == 2 and rep.reading_seconds == pytest.approx(0.002)


def test_a_failing_reading_never_breaks_the_users_forward():
    mem = FakeAllocator(device="cuda:1")
    with forbid_spill(memory=mem, max_overhead=1.0) as cap:
        cap.watch.clock, cap.watch._next_due = FakeClock(), 0.0
        mem.fail_reads = True
        out = Nested()(torch.ones(1, 4))
        assert out.shape == (1, 2)
        assert watched("cuda:1").hook_errors == 1
        mem.fail_reads = False


def test_wddm_spill_lowers_the_cap_and_empties_the_cache():
    mem = FakeAllocator(total=6000, resident=1000, device="cuda:0")
    mb = 1
    samples = iter([
        WddmSample(1000 * mb, 58 * mb, 5000 * mb, 200 * mb),
        WddmSample(1000 * mb - 300, 58 * mb + 300, 5000 * mb, 200 * mb + 300),  # 300 bytes demoted
    ])
    watch = SpillWatch(mem, counters=lambda: next(samples))
    watch.read()
    assert mem.cap == 6000
    empties = mem.empties
    watch.read()
    assert mem.cap == 6000 - 300 and mem.empties == empties + 1
    rep = watch.report()
    assert rep.peak_spilled_bytes == 300 and rep.peak_pushed_bytes == 0 and rep.wddm


def test_off_cuda_there_is_nothing_to_cap():
    before = hooks()
    with forbid_spill("cpu") as handle:
        assert handle.watch is None and not handle.active
        assert hooks() == before
    assert lift_cap("cpu").readings == 0
    assert watched("cpu").active is False
