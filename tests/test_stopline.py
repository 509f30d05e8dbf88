"""The stop line's decisions on an in-process store (torch's HashStore), the ranks played by
hand: no processes, no collectives. The 2-process test of the whole path (an OOM on one rank
inside a sharded forward) is in test_distributed_job.py."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

import leadline.lookahead.distributed.stopline as sl


@pytest.fixture()
def store():
    import torch.distributed as dist

    return dist.HashStore()


def _line(store, rank, aborts, world_size=2):
    world = SimpleNamespace(rank=rank, world_size=world_size)
    return sl.StopLine(world, store=store, abort=lambda: aborts.append(rank))


def _pair(store, aborts):
    """Rank 0's and rank 1's lines of the same phase (the same prefix, as on two processes)."""
    a = _line(store, 0, aborts)
    b = _line(store, 1, aborts)
    b.prefix = a.prefix
    return a, b


def _no_waiting(*a):
    raise AssertionError("the stop line waited")


def test_a_rank_that_did_not_fail_only_marks_and_never_waits(store, monkeypatch):
    monkeypatch.setattr(sl, "STOP_WAIT_S", 30.0)
    monkeypatch.setattr(sl, "time", SimpleNamespace(monotonic=time.monotonic, sleep=_no_waiting))
    aborts: list[int] = []
    a, _ = _pair(store, aborts)
    a.left(False, lambda inside: "unused", oom=False)
    assert store.check([f"{a.prefix}/left/0/0"])
    assert aborts == [] and a.stopped() is None


def test_a_failed_rank_whose_peers_came_out_goes_on_to_the_agreement(store, monkeypatch):
    import threading

    monkeypatch.setattr(sl, "STOP_WAIT_S", 30.0)
    aborts: list[int] = []
    a, b = _pair(store, aborts)
    # both ranks failed at the same point (the same OOM on identical cards), a moment apart; one
    # that waited its 30 s out would abort (and rank 0's would raise WorldAborted here)
    other = threading.Thread(target=lambda: b.left(True, lambda inside: "unused", oom=True))
    other.start()
    time.sleep(0.1)
    a.left(True, lambda inside: "unused", oom=True)
    other.join()
    assert aborts == [], "each must find the other's mark, not wait it out"
    # a rank that failed after the last collective, while its peer came out clean
    a.left(False, lambda inside: "unused", oom=False)
    b.left(True, lambda inside: "unused", oom=False)
    assert aborts == [] and a.stopped() is None and b.stopped() is None
    assert a.stage == b.stage == 2  # each stretch has its own marks


def test_a_failed_rank_whose_peer_stayed_inside_stops_the_job_and_the_peer_reads_the_same_sentence(store, monkeypatch):
    from helpers import FakeClock

    clock = FakeClock()  # its wait for rank 0's mark (5 s) passes on a clock its sleeps move
    monkeypatch.setattr(sl, "time", SimpleNamespace(monotonic=clock, sleep=clock.advance))
    aborts: list[int] = []
    a, b = _pair(store, aborts)
    with pytest.raises(sl.WorldAborted) as got:
        b.left(True, lambda inside: f"rank 1 ran out of memory; inside: {inside}", oom=True)
    assert str(got.value) == "rank 1 ran out of memory; inside: [0]"
    assert got.value.rank == 1 and got.value.out_of_memory is True and aborts == [1]
    seen = a.stopped()  # rank 0, its collective ended by the abort, reads why
    assert isinstance(seen, sl.WorldAborted) and str(seen) == str(got.value) and seen.rank == 1


def test_the_watch_aborts_this_rank_when_the_stop_key_appears_and_not_before(store, monkeypatch):
    import threading

    monkeypatch.setattr(sl, "POLL_S", 0.01)
    aborts: list[int] = []
    aborted = threading.Event()
    a = sl.StopLine(SimpleNamespace(rank=0, world_size=2), store=store,
                    abort=lambda: (aborts.append(0), aborted.set()))
    b = _line(store, 1, aborts)
    b.prefix = a.prefix
    with a.watching():
        time.sleep(0.1)
        assert aborts == [] and not a.fired
        store.set(b._stop_key(), '{"sentence": "s", "rank": 1, "oom": false}')
        aborted.wait(timeout=60)  # at the watch's next poll; the timeout only keeps a broken watch from hanging
    assert aborts == [0] and a.fired


def test_the_watch_thread_ends_with_its_block(store, monkeypatch):
    import threading

    monkeypatch.setattr(sl, "POLL_S", 0.01)
    a, _ = _pair(store, [])
    with a.watching():
        assert any(t.name == "leadline-stopline" for t in threading.enumerate())
    assert not any(t.name == "leadline-stopline" and t.is_alive() for t in threading.enumerate())


def test_without_a_store_the_line_does_nothing_and_a_failure_passes_unchanged():
    aborts: list[int] = []
    line = sl.StopLine(SimpleNamespace(rank=0, world_size=2), store=None, abort=lambda: aborts.append(0))
    line.store = None  # as when the job's group has no store leadline can reach
    line.left(True, lambda inside: "unused", oom=True)  # no wait, no stop
    assert line.stopped() is None
    with pytest.raises(ValueError, match="as it was"):
        with line.guard("a step"):
            raise ValueError("as it was")
    assert aborts == []
