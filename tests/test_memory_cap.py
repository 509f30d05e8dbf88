"""The spill cap and its watch on a fake allocator: set, moved, throttled, restored on every exit."""

import contextlib

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


def module_hooks(*models):
    return sum(len(m._forward_pre_hooks) for model in models for m in model.modules())


def watch_calls_per_forward(model, x):
    """Python calls into leadline.memory's code during one forward: what the watch costs it."""
    import sys

    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        if event == "call" and "leadline/memory/" in frame.f_code.co_filename.replace("\\", "/"):
            calls += 1

    sys.setprofile(count)
    try:
        model(x)
    finally:
        sys.setprofile(None)
    return calls


def chain(n):
    return torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(n)))


def test_after_the_first_optimizer_step_a_forward_calls_the_watch_once_not_once_per_module():
    before = hooks()
    mem = FakeAllocator(total=1000, resident=100, device="cuda:3")
    small, big = chain(1), chain(8)
    x = torch.ones(1, 4)
    with forbid_spill(memory=mem, max_overhead=1.0) as cap:
        cap.watch.clock, cap.watch._next_due = FakeClock(), 0.0  # readings cost nothing: every call due reads
        small(x), big(x)  # discovered: each gets a hook of its own, its submodules none
        assert module_hooks(small) == module_hooks(big) == 1 and len(big._forward_pre_hooks) == 1
        assert hooks()[0] == before[0] + 1  # the global discovery hook, until the first step
        opt = torch.optim.SGD([*small.parameters(), *big.parameters()], lr=0.1)
        (small(x).sum() + big(x).sum()).backward()
        opt.step()
        assert hooks() == (before[0], before[1] + 1)  # only the step hook is global now
        n0 = watched("cuda:3").readings
        for _ in range(3):
            small(x), big(x)
        assert watched("cuda:3").readings == n0 + 6  # one reading per outermost forward
        # the submodules' calls no longer reach the watch: its cost per forward is the same for 1 and 8 Linears
        assert watch_calls_per_forward(big, x) == watch_calls_per_forward(small, x) > 0
        assert module_hooks(small, big) == 2
    assert hooks() == before and module_hooks(small, big) == 0


def test_before_the_first_step_every_new_model_is_discovered_and_read():
    mem = FakeAllocator(total=1000, resident=100, device="cuda:3")
    first, second, late = Nested(), chain(2), chain(2)
    x = torch.ones(1, 4)
    with forbid_spill(memory=mem, max_overhead=1.0) as cap:
        cap.watch.clock, cap.watch._next_due = FakeClock(), 0.0
        n0 = watched("cuda:3").readings
        first(x)
        second(x)
        assert watched("cuda:3").readings == n0 + 2
        assert len(first._forward_pre_hooks) == len(second._forward_pre_hooks) == 1
        opt = torch.optim.SGD(first.parameters(), lr=0.1)
        first(x).sum().backward()
        opt.step()  # reads, and ends the discovery
        n1 = watched("cuda:3").readings
        assert n1 == n0 + 4
        second(x)
        mem.other = 300
        first(x)
        assert watched("cuda:3").readings == n1 + 2 and mem.cap == 700
        late(x)  # first called after the discovery ended: read only at optimizer steps
        assert watched("cuda:3").readings == n1 + 2 and module_hooks(late) == 0


def test_a_model_called_inside_a_later_one_is_read_once_per_forward():
    mem = FakeAllocator(total=1000, resident=100, device="cuda:3")
    base = chain(2)
    wrapper = torch.nn.Sequential(base, torch.nn.ReLU())
    x = torch.ones(1, 4)
    with forbid_spill(memory=mem, max_overhead=1.0) as cap:
        cap.watch.clock, cap.watch._next_due = FakeClock(), 0.0
        base(x)  # outermost when first called alone
        n0 = watched("cuda:3").readings
        wrapper(x)  # now inner to the wrapper: its own hook goes
        wrapper(x)
        assert watched("cuda:3").readings == n0 + 2
        assert len(wrapper._forward_pre_hooks) == 1 and module_hooks(base) == 0


@pytest.mark.parametrize("exit_by", [None, KeyError, torch.OutOfMemoryError])
def test_every_hook_goes_on_every_exit(exit_by):
    before = hooks()
    mem = FakeAllocator(total=1000, resident=100, device="cuda:3")
    one, two = chain(2), Nested()
    x = torch.ones(1, 4)
    raised = RoomShrank if exit_by is torch.OutOfMemoryError else exit_by
    with pytest.raises(raised) if raised else contextlib.nullcontext(), forbid_spill(memory=mem):
        one(x), two(x)
        assert module_hooks(one, two) == 2 and hooks() != before
        if exit_by is not None:
            raise exit_by("boom")
        opt = torch.optim.SGD(one.parameters(), lr=0.1)
        one(x).sum().backward()
        opt.step()
    assert hooks() == before and module_hooks(one, two) == 0 and mem.cap is None


def test_remove_twice_and_install_again_discovers_afresh():
    before = hooks()
    mem = FakeAllocator(total=1000, resident=100, device="cuda:3")
    model = chain(2)
    x = torch.ones(1, 4)
    watch = SpillWatch(mem, max_overhead=1.0, clock=FakeClock())
    watch.install()
    model(x)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(x).sum().backward()
    opt.step()
    watch.remove()
    watch.remove()
    assert hooks() == before and module_hooks(model) == 0 and not watch.installed
    watch.install()
    assert hooks() == (before[0] + 1, before[1] + 1)  # discovering again
    n0 = watch.report().readings
    model(x)
    assert watch.report().readings == n0 + 1 and module_hooks(model) == 1
    watch.remove()
    assert hooks() == before and module_hooks(model) == 0


def test_a_copy_of_a_watched_model_holds_no_watch():
    import copy
    import pickle

    mem = FakeAllocator(total=1000, resident=100, device="cuda:3")
    model = chain(2)
    x = torch.ones(1, 4)
    with forbid_spill(memory=mem, max_overhead=1.0) as cap:
        cap.watch.clock, cap.watch._next_due = FakeClock(), 0.0
        model(x)
        twin, thawed = copy.deepcopy(model), pickle.loads(pickle.dumps(model))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        n0 = watched("cuda:3").readings
        twin(x), thawed(x)
        assert watched("cuda:3").readings == n0  # inert hooks: the copies are not the watched model
    assert twin(x).shape == (1, 4)
