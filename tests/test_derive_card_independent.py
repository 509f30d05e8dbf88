"""A plan that does not depend on the card: on the same measurements, a card whose memory holds
fewer rows gets the same tokens per step, alpha1, noise reading past the format, rate, warmup and
length — only micro_batch and grad_accum differ (the small card accumulates).

The fakes: a least-squares toy whose training step of ``micro_batch x grad_accum`` rows reads the
same rows in the same order however they are split, a gradient source with a known noise scale,
and a fake step that runs out of memory above ``fits`` rows, so a smaller card ends the ramp at
fewer rows; its seconds are the same law on both cards (a fixed cost and a cost a row)."""

from __future__ import annotations

import pytest

from leadline.lookahead.pieces import Corpus, Pieces
from test_derive_golden import clock  # noqa: F401  (the fixture)

SAME = ("tokens_per_step", "alpha1", "noise_scale_tokens", "noise_scale_past_format_tokens", "lr", "lr_anchor",
        "warmup_steps", "total_steps", "weight_decay")


def _pieces(clock, fits: int) -> dict:  # noqa: F811
    import torch

    from helpers import DATA
    from leadline.lookahead.noise.synthetic import KnownNoise
    from test_memory_fakes import FakeHost, FakeHostStep

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 4))
    xs, true = torch.randn(64, 4), torch.randn(8, 4)
    ys = xs @ true.T
    hx = torch.randn(16, 4)
    held = (hx, hx @ true.T)
    opt = torch.optim.AdamW([w], lr=1e-3)

    def train_step_of(mb, accum):
        def step(t):
            clock.advance(0.05 * accum)
            rows, total = mb * accum, 0.0
            for k in range(accum):  # the step's rows in order, a micro-batch at a time
                idx = [(t * rows + k * mb + j) % 64 for j in range(mb)]
                loss = ((xs[idx] @ w.T - ys[idx]) ** 2).mean() / accum
                loss.backward()
                total += float(loss.detach())
            return total

        return step

    def held_out():
        clock.advance(0.02)
        with torch.no_grad():
            return [float(v) for v in ((held[0] @ w.T - held[1]) ** 2).mean(dim=1)]

    noise = KnownNoise(60.0, dim=256, tokens=(20, 60), seed=3)  # a step of 6 rows: 2 micro-batches of 3 on 4

    def grad_fn(i):
        clock.advance(0.01)
        return noise(i)

    fake = FakeHostStep(FakeHost(room=10**9), seconds_of=lambda r: 0.04 + 0.01 * r)

    def step_fn(rows, length, repeats=1):
        if rows > fits:
            raise torch.OutOfMemoryError(f"fake: {rows} rows, {fits} fit")
        out = fake(rows, length, repeats=repeats)
        clock.advance(sum(out.micro_seconds))
        return out

    step_fn.device = "cpu"
    return {"corpus": Corpus(str(DATA / "tokenized.jsonl")),
            "pieces": Pieces(step=step_fn, gradients=grad_fn, weights=[("w", w)], trained_as="weights", optimizer=opt,
                             train_step_of=train_step_of, held_out_losses=held_out)}


def test_a_card_that_holds_fewer_rows_gets_the_same_plan_up_to_the_split(clock):  # noqa: F811
    from leadline.lookahead.derive import derive

    big = derive(**_pieces(clock, fits=10**6), total_steps=40, effort="full")
    small = derive(**_pieces(clock, fits=2), total_steps=40, effort="full")
    assert small.rows_fit < big.rows_fit, (small.rows_fit, big.rows_fit)  # the room did force fewer rows
    assert small.grad_accum > big.grad_accum  # and the small card accumulates to the same step
    assert small.micro_batch * small.grad_accum == big.micro_batch * big.grad_accum
    for name in SAME:
        assert name in big, name
        assert small.get(name) == pytest.approx(big.get(name), rel=1e-6), name
    pf_big, pf_small = (p["noise_scale_past_format_tokens"].evidence for p in (big, small))
    assert pf_small["rows_per_step"] == pf_big["rows_per_step"]  # the burn-in trained the same rows a step
