"""The ramp's pure decisions, with known answers (no torch)."""

import pytest

from leadline.lookahead.memory.decide import RampSearch, ThroughputSearch, extrapolate_peak
from leadline.memory.probe import confirmation_lengths, largest_passing, length_candidates, verdict_of


def drive(search: RampSearch, fits_try, fits_confirm=lambda r: True):
    moves = []
    while (move := search.next()) is not None:
        kind, rows = move
        ok = fits_try(rows) if kind == "try" else fits_confirm(rows)
        moves.append((kind, rows, ok))
        search.record(kind, rows, ok)
    return moves


def test_verdicts():
    assert verdict_of(False, 0) == "fits"
    assert verdict_of(False, 2) == "squeezed"
    assert verdict_of(True, 0) == "oom"
    assert verdict_of(True, 3) == "oom"


def test_doubling_then_bisection_to_one_row():
    s = RampSearch()
    moves = drive(s, lambda r: r <= 18)
    assert [(k, r) for k, r, _ in moves] == [
        ("try", 1), ("try", 2), ("try", 4), ("try", 8), ("try", 16), ("try", 32),
        ("try", 24), ("try", 20), ("try", 18), ("try", 19), ("confirm", 18),
    ]
    assert s.kept == 18 and s.stopped_because == "19 rows did not fit"


def test_failed_confirmation_moves_down_and_bisects_again():
    s = RampSearch()
    moves = drive(s, lambda r: r <= 18, fits_confirm=lambda r: r <= 13)
    confirms = [(r, ok) for k, r, ok in moves if k == "confirm"]
    assert confirms == [(18, False), (17, False), (16, False), (15, False), (14, False), (13, True)]
    assert s.kept == 13
    assert s.failed_confirmation == [18, 17, 16, 15, 14]


def test_upper_limit_is_never_passed():
    s = RampSearch(max_rows=5)
    moves = drive(s, lambda r: True)
    assert [r for _, r, _ in moves] == [1, 2, 4, 5, 5]
    assert s.kept == 5 and "upper limit of 5" in s.stopped_because
    s = RampSearch(max_rows=1)
    assert [r for _, r, _ in drive(s, lambda r: True)] == [1, 1]


def test_nothing_fits():
    s = RampSearch()
    moves = drive(s, lambda r: False)
    assert moves == [("try", 1, False)]
    assert s.kept == 0 and "not even 1 row" in s.stopped_because
    s = RampSearch(start_rows=4)
    assert [r for _, r, _ in drive(s, lambda r: r <= 2)] == [4, 2, 3, 2]
    assert s.kept == 2


def test_bad_search_arguments():
    with pytest.raises(ValueError):
        RampSearch(max_rows=0)
    with pytest.raises(ValueError):
        RampSearch(start_rows=0)


def test_extrapolate_peak_known_answers():
    assert extrapolate_peak([(1, 150), (2, 200)], 8) == 500
    assert extrapolate_peak([(4, 300)], 8) == 600  # proportional without a baseline
    assert extrapolate_peak([(4, 300)], 8, baseline_bytes=100) == 500
    assert extrapolate_peak([(2, 200), (4, 180)], 8) == 180  # a falling line is held flat
    with pytest.raises(ValueError):
        extrapolate_peak([], 2)


def test_throughput_rule_stops_below_five_percent_gain():
    rps = {1: 10.0, 2: 19.0, 4: 30.0, 8: 31.0, 16: 50.0}
    s = ThroughputSearch()
    tried = []
    while (rows := s.next()) is not None:
        tried.append(rows)
        s.record(rows, rps[rows], 100)
    assert tried == [1, 2, 4, 8]
    assert s.kept == 4 and "+3.3%" in s.stopped_because


def test_throughput_rule_exactly_five_percent_goes_on():
    rps = {1: 100.0, 2: 105.0, 4: 104.0}
    s = ThroughputSearch()
    while (rows := s.next()) is not None:
        s.record(rows, rps[rows], 100)
    assert s.kept == 2


def test_throughput_rule_stops_before_the_ram_room():
    # peak = 100 + 50 rows; room 500: 8 rows peak at 500 (allowed), 16 would need 900.
    s = ThroughputSearch(room_bytes=500, baseline_bytes=100)
    tried = []
    while (rows := s.next()) is not None:
        tried.append(rows)
        s.record(rows, 10.0 * rows, 100 + 50 * rows)
    assert tried == [1, 2, 4, 8]
    assert s.kept == 8 and "RAM room" in s.stopped_because


def test_throughput_rule_measured_over_room_keeps_the_rung_before():
    s = ThroughputSearch(room_bytes=500)
    s.record(1, 10, 200)
    s.record(2, 20, 600)
    assert s.next() is None and s.kept == 1


def test_throughput_rule_upper_limit():
    s = ThroughputSearch(max_rows=6)
    tried = []
    while (rows := s.next()) is not None:
        tried.append(rows)
        s.record(rows, 10.0 * rows, 100)
    assert tried == [1, 2, 4, 6] and s.kept == 6


def test_confirmation_lengths_longest_first_each_followed_by_the_full_length():
    assert confirmation_lengths(512, None) == []
    assert confirmation_lengths(512, [100, 300], mix_steps=0) == []
    # lengths at the full length or over are not picked: the interleaved steps run it already
    assert confirmation_lengths(512, [100, 900, 300]) == [300, 512, 100, 512]
    assert confirmation_lengths(512, [512, 100, 512]) == [100, 512]
    assert confirmation_lengths(512, [512, 700]) == []
    mix = list(range(100, 0, -1)) + list(range(1, 101))  # the picks go by rank, not by position
    assert confirmation_lengths(512, mix, mix_steps=8) == [100, 512, 67, 512, 34, 512, 1, 512]
    assert confirmation_lengths(512, mix, mix_steps=9) == [100, 512, 67, 512, 34, 512, 1, 512]
    assert confirmation_lengths(512, mix, mix_steps=1) == [100, 512]  # one pair at least: the longest
    assert confirmation_lengths(512, mix, mix_steps=2) == [100, 512]


def test_confirmation_lengths_default_is_sixteen_steps_on_the_h200_mix():
    # the corpus lengths the H200 ramp ran (benchmarks/results/memory_ramp/lora16_6gb_seq512.json)
    h200 = [112, 136, 107, 52, 106, 253, 49, 212]
    got = confirmation_lengths(512, h200)
    assert got == [253, 512, 212, 512, 136, 512, 112, 512, 107, 512, 106, 512, 52, 512, 49, 512]
    long_corpus = [16 + (i * 37) % 600 for i in range(4096)]
    got = confirmation_lengths(512, long_corpus)
    assert len(got) == 16
    assert got[1::2] == [512] * 8 and got[0::2] == sorted(got[0::2], reverse=True)
    assert got[0] == 511 and got[-2] == 16  # the longest below the full length first, the shortest last


def test_largest_passing_and_length_grid():
    calls = []

    def passes(c):
        calls.append(c)
        return c <= 37

    best, tried = largest_passing(range(1, 101), passes)
    assert best == 37 and len(tried) == len(calls) <= 7
    best, tried = largest_passing([4, 8], lambda c: False)
    assert best is None and tried[-1] == (4, False)
    assert length_candidates(64) == list(range(2, 64, 2))
    assert length_candidates(10, resolution=4) == [4, 8]


def test_a_hurried_search_confirms_the_most_rows_a_try_fitted():
    s = RampSearch()
    moves = []
    while (move := s.next()) is not None:
        kind, rows = move
        ok = rows <= 18 if kind == "try" else rows <= 4
        moves.append((kind, rows))
        s.record(kind, rows, ok)
        if (kind, rows) == ("try", 8):
            s.hurry("max_seconds")  # after 1, 2, 4, 8 fitted: confirm 8, not bisect toward 18
    assert moves == [("try", 1), ("try", 2), ("try", 4), ("try", 8), ("confirm", 8), ("confirm", 4)]
    assert s.kept == 4 and s.stopped_because.startswith("max_seconds: the most rows a step fitted so far")


def test_a_search_hurried_before_anything_fitted_goes_on_until_something_does():
    s = RampSearch(start_rows=4)
    s.hurry("max_seconds")
    moves = drive(s, lambda r: r <= 2)
    assert [(k, r) for k, r, _ in moves] == [("try", 4), ("try", 2), ("try", 3), ("confirm", 2)]
    assert s.kept == 2


def test_a_hurried_throughput_search_keeps_the_best_rows_per_second_so_far():
    s = ThroughputSearch()
    for rows, rps in ((1, 10.0), (2, 18.0), (4, 17.0)):
        assert s.next() == rows
        s.record(rows, rps, 0)
    s.hurry("max_seconds")
    assert s.next() is None and s.kept == 2 and s.stopped_because.startswith("max_seconds")
