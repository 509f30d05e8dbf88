"""On the card: snapshots stay there when there is room, go to the host under a tight cap, and
come back bit-exactly either way (skipped without CUDA)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


def _params(n: int) -> tuple[list, torch.optim.Optimizer]:
    p = torch.nn.Parameter(torch.randn(n, device="cuda"))
    opt = torch.optim.AdamW([p], lr=1e-3)
    p.grad = torch.randn_like(p)
    opt.step()
    return [p], opt


def test_snapshots_live_on_the_card_when_there_is_room_and_restore_exactly():
    from leadline.rate.state import Snapshot

    params, opt = _params(1 << 20)
    snap = Snapshot.take(params, opt)
    assert snap.on_card
    before = params[0].detach().clone()
    with torch.no_grad():
        params[0].add_(1.0)
    snap.load(params, opt)
    assert torch.equal(params[0], before)


def test_under_a_tight_cap_snapshots_go_to_the_host():
    from leadline.rate.state import Snapshot

    params, opt = _params(64 << 20)  # 256 MB of weights, 768 MB with Adam's state
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.empty_cache()
    cap = torch.cuda.memory_allocated() + (512 << 20)
    torch.cuda.set_per_process_memory_fraction(cap / total)
    try:
        snap = Snapshot.take(params, opt)
        assert not snap.on_card and str(snap.device) == "cpu"
        before = params[0].detach().clone()
        with torch.no_grad():
            params[0].mul_(2.0)
        snap.load(params, opt)
        assert torch.equal(params[0], before)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


def test_a_lookahead_on_the_card_leaves_no_trace():
    from leadline.lookahead.rate import lookahead_lr

    g = torch.Generator(device="cuda").manual_seed(0)
    w_star = 0.1 * torch.randn(32, device="cuda", generator=g)
    xs = torch.randn(256, 8, 32, device="cuda", generator=g)
    ys = xs @ w_star + 0.1 * torch.randn(256, 8, device="cuda", generator=g)
    xh = torch.randn(128, 32, device="cuda", generator=g)
    yh = xh @ w_star
    w = torch.nn.Parameter(torch.zeros(32, device="cuda"))
    opt = torch.optim.Adam([w], lr=1e-3)

    def step(t: int) -> None:
        ((xs[t] @ w - ys[t]) ** 2).mean().backward()

    def held() -> list[float]:
        with torch.no_grad():
            return ((xh @ w - yh) ** 2).tolist()

    rng = torch.cuda.get_rng_state()
    la = lookahead_lr([w], opt, step, held, 0.01, total_steps=64)
    assert la.snapshots["on_card"] is True
    assert torch.equal(w, torch.zeros_like(w)) and not opt.state and w.grad is None
    assert torch.equal(torch.cuda.get_rng_state(), rng)


def test_a_run_after_the_measurement_phases_is_the_run_from_a_fresh_start_on_the_card():
    """A tiny Llama, every weight trained (tied embeddings included), AdamW on CUDA: 12 steps
    with a warmup after measure_first_step + lookahead_lr land where 12 steps from a fresh
    optimizer land (the same kernels in the same order: equal to float32 round-off)."""
    from helpers import make_model
    from leadline.lookahead.rate import lookahead_lr, measure_first_step
    from leadline.lookahead.rate.warmup import warmup_lr

    torch.backends.cuda.matmul.allow_tf32 = False
    model = make_model(seed=0).cuda()
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 384, (4, 16), generator=g).cuda() for _ in range(32)]
    held_rows = [torch.randint(0, 384, (1, 16), generator=g).cuda() for _ in range(16)]
    params = [p for p in model.parameters() if p.requires_grad]
    start = [p.detach().clone() for p in params]

    def train_step(t: int) -> float:
        x = rows[t % len(rows)]
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        return float(loss)

    def held() -> list[float]:
        with torch.no_grad():
            return [float(model(input_ids=x, labels=x).loss) for x in held_rows]

    def run(opt: torch.optim.Optimizer, lr: float, alpha1: float) -> list[torch.Tensor]:
        for t in range(12):
            for group in opt.param_groups:
                group["lr"] = warmup_lr(t, lr, alpha1, 10)
            opt.zero_grad(set_to_none=True)
            train_step(t)
            opt.step()
        return [p.detach().clone() for p in params]

    fresh = run(torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0), 2e-3, 1e-3)
    with torch.no_grad():
        for p, s in zip(params, start):
            p.copy_(s)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    fs = measure_first_step(params, opt, train_step, held)
    lookahead_lr(params, opt, train_step, held, fs, total_steps=24)
    assert not opt.state and all(torch.equal(p, s) for p, s in zip(params, start))
    after = run(opt, 2e-3, 1e-3)
    worst = max(float((a - b).abs().max()) for a, b in zip(after, fresh))
    assert worst <= 1e-6, f"the run after the phases drifted from a fresh one by {worst:g}"
