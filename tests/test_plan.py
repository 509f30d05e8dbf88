import json
import math

import pytest

from leadline import InputError, Plan, Value


def _plan():
    p = Plan(machine={"device": "cpu"}, model={"name": "tiny", "trained_parameters": 10}, data={"rows": 3})
    p.set("micro_batch", Value(4, "measured", "the ramp: 4 rows fit twice in a row, 8 raised OOM",
                               evidence={"plot": "ramp", "budget_bytes": 2**30,
                                         "rungs": [{"rows": 4, "peak_bytes": 5 * 2**28, "verdict": "fits", "seconds": 0.1},
                                                   {"rows": 8, "peak_bytes": None, "verdict": "oom", "seconds": 0.2}]},
                               seconds=0.3))
    p.set("lr", Value(1.2345678901234567e-4, "derived", "1.3 x alpha1 from the look-ahead", unit="per step"))
    p.set("divisor", Value(320, "constant", "rewrite/320 for weights, one 135M at 60 steps"))
    p.set("betas", Value((0.9, 0.999), "given", "the optimizer's own"))
    p.held_out = {"train": [0, 2], "held_out": [1], "test": []}
    p.notes.append("max_seconds cut the look-ahead")
    return p


def test_value_needs_a_source_and_a_known_kind():
    with pytest.raises(InputError, match="source"):
        Value(1, "measured", "")
    with pytest.raises(InputError, match="source"):
        Value(1, "measured", "   ")
    with pytest.raises(InputError, match="kind"):
        Value(1, "guessed", "because")
    with pytest.raises(InputError, match="seconds"):
        Value(1, "measured", "x", seconds=-1)
    with pytest.raises(InputError, match="JSON"):
        Value(object(), "measured", "x")


def test_attribute_gives_number_item_gives_value():
    p = _plan()
    assert p.micro_batch == 4
    assert isinstance(p["micro_batch"], Value)
    assert p["micro_batch"].kind == "measured"
    assert p.betas == [0.9, 0.999]  # tuples normalised to what JSON gives back
    with pytest.raises(AttributeError, match="no value 'nope'"):
        _ = p.nope
    with pytest.raises(KeyError, match="micro_batch"):
        _ = p["nope"]


def test_report_why_constants():
    p = _plan()
    rep = p.report()
    assert "micro_batch = 4  [measured] the ramp" in rep
    assert "constants (not measured here, 1): divisor" in rep
    assert "max_seconds cut the look-ahead" in rep
    why = p.why("micro_batch")
    assert '"verdict": "oom"' in why and "cost: 0.3 s" in why
    assert list(p.constants()) == ["divisor"]


def test_json_round_trip_is_exact(tmp_path):
    p = _plan()
    path = tmp_path / "plan.json"
    text = p.to_json(path)
    assert path.read_text().strip() == text
    q = Plan.from_json(path)
    assert q == p
    assert q.lr == 1.2345678901234567e-4  # bit-exact float
    assert q.to_json() == text
    assert Plan.from_json(text) == p
    assert [x.name for x in tmp_path.iterdir()] == ["plan.json"]  # no temp file left


def test_nan_survives_round_trip():
    p = Plan()
    p.set("x", Value(math.nan, "measured", "a probe that did not resolve"))
    assert math.isnan(Plan.from_json(p.to_json()).x)


def test_not_a_plan_is_one_sentence(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(InputError, match="is not a leadline plan"):
        Plan.from_json(bad)
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not JSON"):
        Plan.from_json(bad)
    with pytest.raises(InputError, match="does not exist"):
        Plan.from_json(tmp_path / "missing.json")


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    import leadline._io as io

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(io.os, "replace", boom)
    with pytest.raises(OSError):
        _plan().to_json(tmp_path / "plan.json")
    assert list(tmp_path.iterdir()) == []


def test_html_is_self_contained_and_shows_every_value(tmp_path):
    from leadline.report.html import write_html

    p = _plan()
    out = write_html(p, tmp_path / "r.html")
    page = out.read_text()
    for name in p:
        assert f"id='{name}'" in page
    assert "the ramp: 4 rows fit twice" in page
    assert "<script" not in page and "<link" not in page
    assert 'src="http' not in page and "href=\"http" not in page and "href='http" not in page
    assert "<svg" in page  # matplotlib is in the dev extra: the ramp is drawn inline
