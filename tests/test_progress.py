"""The phase bar: numbers at 3 significant digits, text cut at a word, a total that matches
the phases that ran, and derive_for's bar from Python."""

from __future__ import annotations

import io

from leadline.lookahead.progress import PhaseBar, clip, reformat, sig3


def test_numbers_read_at_three_significant_digits():
    assert sig3(2.3180050292765326) == "2.32"
    assert sig3(0.0004567376925283153) == "4.57e-04"
    assert sig3(40.404573869435545) == "40.4"
    assert sig3(9941) == "9,941" and sig3(0) == "0" and sig3(None) == "None"
    assert (
        reformat("noise_scale_tokens=2.3180050292765326; rows_fit=2; ending=linear")
        == "noise_scale_tokens=2.32, rows_fit=2, ending=linear"
    )


def test_text_is_cut_at_a_word_not_inside_one():
    text = "past_format: done (noise_scale_past_format_tokens=40.4, rows=12, something else entirely)"
    cut = clip(text, 60)
    assert len(cut) <= 60 and cut.endswith("…")
    assert text.startswith(cut[:-1]) and text[len(cut) - 1] in " ,;)"
    assert clip("short", 60) == "short"


def _events(names, skipped=()):
    for i, n in enumerate(names):
        yield {"phase": n, "status": "start", "elapsed_s": 0.0, **({"phases": list(names)} if i == 0 else {})}
        if n in skipped:
            yield {"phase": n, "status": "skipped", "elapsed_s": 1.0, "reason": "max_seconds"}
        else:
            yield {"phase": n, "status": "done", "elapsed_s": 1.0, "summary": f"{n}_value=1.23456789"}


def test_the_bar_knows_its_total_from_the_first_event_and_ends_full():
    out = io.StringIO()
    bar = PhaseBar(out, bar=True)
    events = list(_events(["corpus", "noise", "memory", "warmup"], skipped={"memory"}))
    bar(events[0])
    assert bar.bar.total == 4 and bar.bar.n == 0
    for ev in events[1:3]:  # corpus done, noise started
        bar(ev)
    assert bar.bar.n == 1 and "1/4 phases" in out.getvalue().replace("\r", "\n").splitlines()[-1]
    assert "noise: measuring" in out.getvalue()
    for ev in events[3:]:
        bar(ev)
    assert bar.bar is not None and bar.bar.n == 4
    bar.close()
    last = out.getvalue().replace("\r", "\n").strip().splitlines()[-1]
    assert "4/4 phases" in last and "derive: done" in last


def test_without_a_terminal_one_line_a_finished_phase():
    out = io.StringIO()
    bar = PhaseBar(out)  # a StringIO is no terminal: lines, not a bar
    for ev in _events(["corpus", "noise"], skipped={"noise"}):
        bar(ev)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("1/2 corpus: done (corpus_value=1.23)")
    assert lines[1].endswith("2/2 noise: skipped — max_seconds")
    quiet = io.StringIO()
    PhaseBar(quiet, quiet=True)({"phase": "corpus", "status": "done"})
    assert quiet.getvalue() == ""


def test_derive_for_shows_the_bar_when_asked_and_is_silent_when_not(tiny_model, tokenizer, capsys):
    from helpers import DATA
    from leadline.hf import DeriveOptions, derive_for

    events: list[dict] = []
    derive_for(
        tiny_model,
        tokenizer,
        str(DATA / "prompt_completion.jsonl"),
        total_steps=4,
        effort="full",
        progress=True,
        options=DeriveOptions(on_progress=events.append),
    )
    err = capsys.readouterr().err
    assert "corpus: done" in err and "warmup: done" in err
    # the first event names every phase derive calls, in order: the total the bar shows
    finished = [e["phase"] for e in events if e["status"] in ("done", "skipped", "resumed")]
    assert events[0]["phases"] == finished and len(finished) >= 8
    n = len(finished)
    lines = err.strip().splitlines()
    assert len(lines) == n and lines[0].split("]")[1].strip().startswith(f"1/{n} corpus")
    assert lines[-1].split("]")[1].strip().startswith(f"{n}/{n} warmup")
    derive_for(tiny_model, tokenizer, str(DATA / "prompt_completion.jsonl"), total_steps=4, effort="full",
               progress=False)
    assert "corpus: done" not in capsys.readouterr().err
