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


def _demo_like_plan():
    """A plan with long sentences, a dict value, a long list, a name of 30 characters and a value
    nobody resolved."""
    p = Plan()
    long_source = "the anchor, not measured: nothing could be run for the rate; " * 6
    p.set("rows", Value(32, "measured", "rows read from the rows given"))
    p.set("noise_scale_past_format_tokens", Value(None, "derived", "not read: too few rows", unit="scored tokens"))
    p.set("rates_read", Value([0.000227, 0.000455, 0.00091, 0.00182, 0.003639], "derived", long_source))
    p.set("precision", Value({"dtype": "float32", "quantization": "gguf", "compute_dtype": "float32",
                              "checkpointing": False, "adapter": True}, "given", long_source))
    p.set("lr", Value(0.000445, "constant", long_source, unit="per step"))
    p.set("micro_batch", Value(1, "derived", long_source, unit="rows"))
    p.set("total_steps", Value(26, "derived", long_source, unit="steps"))
    p.notes.append("derive took 71.3 s; " + long_source)
    return p


def test_table_opens_with_the_numbers_to_train_with_each_line_under_100_columns():
    p = _demo_like_plan()
    text = p.report(long=False, path="run/plan.json")
    lines = text.splitlines()
    assert lines[:10] == [
        "train with:",
        "  micro_batch                     1 row                                 derived",
        "  lr                              0.000445 per step                     constant",
        "  total_steps                     26 steps                              derived",
        "and the numbers behind them:",
        "  rows                            32                                    measured",
        "  noise_scale_past_format_tokens  not resolved                          derived",
        "  rates_read                      (0.000227, 0.000455, 0.00091, …       derived",  # cut after a whole item
        "  precision                       dtype float32, quantization gguf, …   given",
        "leadline report run/plan.json --why NAME prints the sentence and evidence behind a value",
    ]
    assert all(len(ln) < 100 for ln in lines), max(lines, key=len)  # the notes wrapped too
    assert "anchor, not measured" not in "\n".join(lines[:10])  # no value's sentence in the table
    assert lines[11] == "constants (not measured here, 1): lr"
    assert lines[12].startswith("note: derive took 71.3 s; the anchor") and lines[13].startswith("  ")


def test_table_names_plan_only_where_the_path_would_pass_the_width():
    p = _demo_like_plan()
    assert p.table("a/" * 60 + "plan.json").splitlines()[-1].startswith("leadline report PLAN --why NAME")
    assert p.table().splitlines()[-1].startswith("leadline report PLAN --why NAME")


def test_report_keeps_its_long_form_by_default():
    p = _demo_like_plan()
    assert p.report() == p.report(long=True)
    assert p.report().splitlines()[0] == "rows = 32  [measured] rows read from the rows given"
    assert "train with:" not in p.report()


def test_why_with_a_width_wraps_the_sentence_and_keeps_the_evidence():
    p = _plan()
    lines = p.why("micro_batch", width=40).splitlines()
    assert lines[:4] == ["micro_batch = 4  [measured]", "the ramp: 4 rows fit twice in a row, 8", "raised OOM",
                         "cost: 0.3 s"]
    assert '      "verdict": "oom",' in lines  # a record wider than 40 columns opened a level deeper
    wide = p.why("micro_batch", width=80).splitlines()
    assert '    {"rows": 8, "peak_bytes": null, "verdict": "oom", "seconds": 0.2}' in wide  # one that fits: one line
    assert all(len(ln) <= 80 for ln in wide), max(wide, key=len)
    assert p.why("micro_batch").splitlines()[0] == p["micro_batch"].line("micro_batch")  # unchanged without it


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


def test_the_guards_reads_are_the_runs_work_not_derives():
    """The guard's checks and verdict belong to the run: derive's line counts the race's reads alone,
    and the run's line names the guard's."""
    from leadline.plan import PhaseTime

    plan = Plan(phases=[PhaseTime("rate", 15.4, 2, (), step_seconds=8.9, reads=2, read_seconds=6.5),
                        PhaseTime("run", 72.7, 20, step_seconds=72.7),
                        PhaseTime("guard", 25.5, 0, ("guard",), reads=3, read_seconds=25.5)])
    plan.derive_seconds = 15.4
    table = plan.phase_table()
    assert "2 held-out reads (6.5 s)" in table.split("derive:")[1].split("\n")[1]
    assert "the guard's checks and verdict 25.5 s (3 held-out reads)" in table
