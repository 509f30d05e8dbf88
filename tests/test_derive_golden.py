"""The golden plans: derive() on fixed recorded inputs gives the same values, kinds and sources
as the plans stored in tests/data/derive_golden.json.

The inputs are fakes whose every number is known: a training step whose timings the test sets,
a gradient source with a known noise scale (:class:`~leadline.lookahead.noise.synthetic.KnownNoise`), a
least-squares loss whose best rate the optimizer finds, and a clock that moves only when a fake
piece runs (a train step 50 ms a micro-batch, a held-out read 20 ms, a gradient draw 10 ms, a ramp rung its
own seconds), so a ``max_seconds`` cut falls at the same step on every machine. A change that
moves a number, a kind, a source sentence or a note fails here; one that only moves code does not.

To write the file again after a change of behaviour that is meant:
``LEADLINE_WRITE_GOLDEN=1 python -m pytest tests/test_derive_golden.py``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from helpers import DATA, FakeClock, install_clock
from leadline.lookahead.pieces import Corpus, Pieces

GOLDEN = Path(__file__).parent / "data" / "derive_golden.json"
REPO = str(Path(__file__).resolve().parents[1])


def _portable(obj):
    """The record with the checkout's own path written as <repo>, so a clone anywhere compares."""
    return json.loads(json.dumps(obj, allow_nan=True, default=str).replace(REPO, "<repo>"))


Clock = FakeClock  # the fake pieces move it; time.perf_counter and time.monotonic read it


@pytest.fixture
def clock(monkeypatch):
    return install_clock(monkeypatch)


def _pieces(clock: Clock, *, kill_at: int | None = None) -> dict:
    """The fixed inputs: a least-squares toy as the trained weights, KnownNoise as the gradient
    source, a fake step whose rows per second improve to 8 rows, the tokenized test corpus."""
    import torch

    from leadline.lookahead.noise.synthetic import KnownNoise
    from test_memory_fakes import FakeHost, FakeHostStep

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 4))
    xs = torch.randn(64, 4)
    true = torch.randn(8, 4)
    ys = xs @ true.T
    hx = torch.randn(16, 4)
    held = (hx, hx @ true.T)
    opt = torch.optim.AdamW([w], lr=1e-3)
    calls = {"steps": 0}

    def train_step_of(mb, accum):
        def step(t):
            calls["steps"] += 1
            if kill_at is not None and calls["steps"] == kill_at:
                raise KeyboardInterrupt
            clock.advance(0.05 * accum)
            i = (t * mb) % 56
            loss = ((xs[i:i + mb] @ w.T - ys[i:i + mb]) ** 2).mean()
            loss.backward()
            return float(loss)

        return step

    def held_out():
        clock.advance(0.02)
        with torch.no_grad():
            return [float(v) for v in ((held[0] @ w.T - held[1]) ** 2).mean(dim=1)]

    noise = KnownNoise(40.0, dim=256, tokens=(20, 60), seed=3)

    def grad_fn(i):
        clock.advance(0.01)
        return noise(i)

    host = FakeHost(room=10**9)
    fake = FakeHostStep(host, seconds_of=lambda r: 0.04 + 0.01 * min(r, 8) + 0.02 * max(0, r - 8))

    def step_fn(rows, length, repeats=1):
        out = fake(rows, length, repeats=repeats)
        clock.advance(sum(out.micro_seconds))
        return out

    step_fn.device = "cpu"
    return {"corpus": Corpus(str(DATA / "tokenized.jsonl")),
            "pieces": Pieces(step=step_fn, gradients=grad_fn, weights=[("w", w)], trained_as="weights", optimizer=opt,
                             train_step_of=train_step_of, held_out_losses=held_out)}


def _record(plan) -> dict:
    """What the golden file keeps of a plan: each value's value, kind, unit and source, the notes,
    the phases it skipped and its split (the machine's description is left out: it is this host's)."""
    return {"values": {n: {"value": v.value, "kind": v.kind, "unit": v.unit, "source": v.source}
                       for n, v in plan.values.items()},
            "notes": list(plan.notes), "held_out": plan.held_out, "model": plan.model}


def _scenarios(clock: Clock, tmp_path: Path) -> dict:
    from leadline.lookahead.derive import derive

    out = {}
    out["full"] = derive(**_pieces(clock), total_steps=40, effort="full")
    out["full_epochs"] = derive(**_pieces(clock), epochs=2.0, effort="full")
    out["full_max_seconds"] = derive(**_pieces(clock), total_steps=400, effort="full", max_seconds=10.0,
                                     started=clock())
    for seconds in (0.5, 3.8, 6.0):  # the cut inside the first step, the burn-in past the format, the rate
        out[f"full_cut_{seconds:g}"] = derive(**_pieces(clock), total_steps=400, effort="full",
                                              max_seconds=seconds, started=clock())
    out["not_started"] = derive(**_pieces(clock), total_steps=20, max_seconds=5.0, started=clock() - 6.0)
    resume = tmp_path / "derive.json"
    with pytest.raises(KeyboardInterrupt):
        derive(**_pieces(clock, kill_at=30), total_steps=40, effort="full", resume=resume)
    out["full_resumed"] = derive(**_pieces(clock), total_steps=40, effort="full", resume=resume)
    out["prior"] = derive(**_pieces(clock), total_steps=40, effort="full", prior=out["full"])
    return {name: _record(plan) for name, plan in out.items()}


def _same(a, b, where: str) -> None:
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        same = (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6, abs=1e-12)
        assert same, f"{where}: {a!r} != {b!r}"
    elif isinstance(a, dict) and isinstance(b, dict):
        assert sorted(a) == sorted(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), f"{where}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def test_derive_gives_the_golden_plans(clock, tmp_path):
    got = _portable(_scenarios(clock, tmp_path))
    if os.environ.get("LEADLINE_WRITE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True, allow_nan=True) + "\n", encoding="utf-8")
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert sorted(got) == sorted(want)
    for name in want:
        _same(got[name], want[name], name)


def test_the_scenarios_reach_what_they_are_for(clock, tmp_path):
    """The golden file is worth keeping only while its scenarios exercise what they name."""
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))
    for name in ("full", "full_epochs", "full_resumed", "prior"):
        assert {"noise_scale_tokens", "rows_fit", "tokens_per_step", "alpha1", "lr", "lr_anchor",
                "warmup_steps", "noise_scale_past_format_tokens"} <= set(want[name]["values"]), name
    assert "lookahead_horizon_steps" in want["full"]["values"]
    assert want["full_resumed"]["values"] == want["full"]["values"]
    assert "prior plan's rate, kept" in want["prior"]["values"]["lr"]["source"]
    assert "max_seconds cut the look-ahead" in want["full_max_seconds"]["values"]["lr"]["source"]
    for name, phase in (("full_cut_0.5", "first_step"), ("full_cut_3.8", "past_format"), ("full_cut_6", "rate")):
        assert any(n.startswith(f"{phase}: cut by max_seconds") for n in want[name]["notes"]), name
    assert "alpha1" not in want["not_started"]["values"]


def test_derive_for_gives_the_golden_plan_on_the_tiny_model(monkeypatch):
    import torch
    from peft import LoraConfig, get_peft_model

    from helpers import make_model, make_tokenizer
    from leadline.hf import derive_for

    install_clock(monkeypatch, FakeClock(tick=0.001))  # 1 ms at every reading
    tok = make_tokenizer()
    torch.manual_seed(0)
    model = get_peft_model(make_model(vocab_size=len(tok)), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                                       lora_dropout=0.0, task_type="CAUSAL_LM"))
    plan = derive_for(model, tok, str(DATA / "prompt_completion.jsonl"), total_steps=12, effort="full")
    got = _portable(_record(plan))
    path = GOLDEN.with_name("derive_for_golden.json")
    if os.environ.get("LEADLINE_WRITE_GOLDEN") == "1":
        path.write_text(json.dumps(got, indent=1, sort_keys=True, allow_nan=True) + "\n", encoding="utf-8")
    want = json.loads(path.read_text(encoding="utf-8"))
    assert {"noise_scale_tokens", "rows_fit", "alpha1", "lr", "lookahead_horizon_steps",
            "noise_scale_past_format_tokens"} <= set(want["values"])
    # derive_for may add values of its own beside derive's (the precision it trains at): every
    # stored value is still there and the same
    got["values"] = {n: v for n, v in got["values"].items() if n in want["values"]}
    _same(got, want, "derive_for")
