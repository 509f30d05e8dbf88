"""The WDDM counters' arithmetic on recorded counter sequences (the platform API itself is Windows-only)."""

import sys

import pytest

from leadline.measure import wddm
from leadline.measure.wddm import (
    SpillTracker,
    WddmSample,
    aggregate,
    parse_instance,
    pushed_bytes,
    spilled_bytes,
)

MB = 10**6
CARD = "luid_0x00000000_0x0000C0E8_phys_0"
IGPU = "luid_0x00000000_0x0000D1F0_phys_0"


def test_instance_names():
    assert parse_instance("pid_4242_" + CARD) == (4242, "0x00000000_0x0000c0e8", 0)
    assert parse_instance(CARD) == (None, "0x00000000_0x0000c0e8", 0)
    assert parse_instance("luid_0x0_0x1_phys_2") == (None, "0x0_0x1", 2)
    assert parse_instance("_Total") is None


def test_aggregate_picks_the_card_this_process_uses_most_and_sums_its_adapters():
    proc_d = [("pid_4242_" + CARD, 1800 * MB), ("pid_4242_" + IGPU, 20 * MB), ("pid_777_" + CARD, 400 * MB)]
    proc_s = [("pid_4242_" + CARD, 58 * MB), ("pid_4242_" + IGPU, 5 * MB), ("pid_777_" + CARD, 90 * MB)]
    card_d = [(CARD, 2300 * MB), (IGPU, 100 * MB), ("luid_0x00000000_0x0000C0E8_phys_1", 10 * MB)]
    card_s = [(CARD, 300 * MB), (IGPU, 40 * MB)]
    s = aggregate(proc_d, proc_s, card_d, card_s, pid=4242)
    assert s == WddmSample(1800 * MB, 58 * MB, 2310 * MB, 300 * MB, "0x00000000_0x0000c0e8")
    other = aggregate(proc_d, proc_s, card_d, card_s, pid=4242, luid="0x00000000_0x0000D1F0")
    assert (other.process_dedicated, other.card_shared) == (20 * MB, 40 * MB)
    assert aggregate(proc_d, proc_s, card_d, card_s, pid=1) is None


def test_a_spill_moves_shared_up_and_dedicated_minus_reserved_down_by_the_same_amount():
    # GTX 1060 record: 1,204 MB spilled, 1,206 MB more shared.
    base = WddmSample(5000 * MB, 58 * MB, 6000 * MB, 300 * MB)
    now = WddmSample(5000 * MB, 1264 * MB, 6000 * MB, 1506 * MB)
    assert spilled_bytes(base, now, reserved_base=4800 * MB, reserved_now=6004 * MB) == 1204 * MB


def test_pinned_memory_raises_shared_alone_and_is_not_a_spill():
    base = WddmSample(5000 * MB, 58 * MB, 6000 * MB, 300 * MB)
    pinned = WddmSample(5000 * MB, 558 * MB, 6000 * MB, 800 * MB)
    assert spilled_bytes(base, pinned, 4800 * MB, 4800 * MB) == 0
    assert pushed_bytes(base, pinned, card_free_bytes=0) == 0  # the card's growth is this process's own


def test_pushing_another_program_out_counts_only_at_the_cards_edge():
    base = WddmSample(5000 * MB, 58 * MB, 6000 * MB, 300 * MB)
    now = WddmSample(5400 * MB, 58 * MB, 6100 * MB, 700 * MB)  # dwm demoted 400 MB
    assert pushed_bytes(base, now, card_free_bytes=10 * MB) == 400 * MB
    assert pushed_bytes(base, now, card_free_bytes=1000 * MB) == 0  # there was room: nothing was pushed


def test_the_tracker_keeps_peaks_over_a_recorded_sequence():
    seq = [  # (sample, reserved, card free)
        (WddmSample(5000 * MB, 58 * MB, 6000 * MB, 300 * MB), 4800 * MB, 100 * MB),
        (WddmSample(5000 * MB, 1264 * MB, 6000 * MB, 1508 * MB), 6004 * MB, 0),  # and 2 MB of others pushed
        (WddmSample(5000 * MB, 358 * MB, 6000 * MB, 600 * MB), 5100 * MB, 0),
        (WddmSample(4800 * MB, 58 * MB, 5800 * MB, 300 * MB), 4800 * MB, 200 * MB),
    ]
    tracker = SpillTracker()
    got = [tracker.update(s, r, f) for s, r, f in seq]
    assert got == [(0, 0), (1204 * MB, 2 * MB), (300 * MB, 0), (0, 0)]
    assert tracker.peak_spilled_bytes == 1204 * MB and tracker.peak_pushed_bytes == 2 * MB


@pytest.mark.skipif(sys.platform == "win32", reason="checks the behaviour off Windows")
def test_import_safe_and_unavailable_off_windows():
    assert wddm.available() is False
    with pytest.raises(OSError, match="Windows"):
        wddm.WddmCounters()
