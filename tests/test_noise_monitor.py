"""NoiseMonitor and Controller: the probe's numbers from inside an accumulating loop."""

import math

import pytest
import torch

from leadline.errors import InputError
from leadline.noise import Controller, ModelGradFn, NoiseMonitor, measure_noise_scale
from leadline.noise.synthetic import KnownNoise

SHAPES = [(8, 64), (512,), (4, 8, 16), (512,)]  # 2048 numbers in four tensors


class Linear(torch.nn.Module):
    """loss_i = g_i · w: the gradient of micro-batch i's loss is exactly the known g_i."""

    def __init__(self):
        super().__init__()
        self.ws = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES])

    def loss(self, grads):
        return sum((g * w).sum() for g, w in zip(grads, self.ws))


def run(model, src, mon, steps, accum, start=0):
    """The user's loop: mean loss / grad_accum, backward, micro(); then step() and zero_grad."""
    i = start
    for _ in range(steps):
        for _ in range(accum):
            grads, t = src(i)
            (model.loss(grads) / accum).backward()
            mon.micro(t)
            i += 1
        mon.step()
        model.zero_grad(set_to_none=True)
    return i


def test_the_monitor_equals_the_probe_on_the_same_micro_batches():
    src = KnownNoise(3000, dim=2048, seed=1, split=SHAPES)
    model = Linear()
    mon = NoiseMonitor(model.parameters(), grad_accum=12)
    run(model, src, mon, steps=1, accum=12)
    probe = measure_noise_scale(src, k=12)
    est = mon.estimate()
    assert est.draws == 12 and est.tokens == probe.tokens
    assert est.s == pytest.approx(probe.estimate.s, rel=1e-5)
    assert est.g2 == pytest.approx(probe.estimate.g2, rel=1e-5)
    assert est.b_noise_tokens == pytest.approx(probe.b_noise_tokens, rel=1e-5)
    assert est.se_tokens == pytest.approx(probe.se_tokens, rel=1e-2)  # its cross term comes from norms


def test_the_scale_does_not_change_when_grad_accum_does():
    """|G|² and S come out in the mean-loss gradient's units at any grad_accum (the published
    monitor read the increments scaled by 1/k, and its |G|² by 1/k²)."""
    src = KnownNoise(2000, dim=2048, seed=2, split=SHAPES)
    g2_true, s_true = float(src.G @ src.G), src.trace
    readings = {}
    for accum in (2, 8):
        model = Linear()
        mon = NoiseMonitor(model.parameters(), grad_accum=accum, window=64)
        run(model, src, mon, steps=64 // accum, accum=accum)
        readings[accum] = mon.estimate()
    for est in readings.values():
        assert est.draws == 64 and est.resolved
        assert abs(est.g2 - g2_true) < 3 * est.g2_se
        assert abs(est.s - s_true) < 3 * est.s_se
        assert abs(est.b_noise_tokens - 2000) < 3 * est.se_tokens
    # across a change inside the window, still one scale
    model = Linear()
    mon = NoiseMonitor(model.parameters(), grad_accum=2, window=64)
    i = run(model, src, mon, steps=8, accum=2)
    mon.grad_accum = 8
    run(model, src, mon, steps=6, accum=8, start=i)
    mixed = mon.estimate()
    assert mixed.draws == 64 and abs(mixed.b_noise_tokens - 2000) < 3 * mixed.se_tokens


def test_micro_reads_nothing_back_and_step_synchronises_once(monkeypatch):
    src = KnownNoise(500, dim=2048, seed=3, split=SHAPES)
    model = Linear()
    mon = NoiseMonitor(model.parameters(), grad_accum=4)
    reads = []
    for name in ("cpu", "item", "tolist", "__bool__", "__float__", "__int__"):
        orig = getattr(torch.Tensor, name)

        def counted(self, *a, _orig=orig, _name=name, **kw):
            reads.append(_name)
            return _orig(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, counted)
    for i in range(4):
        grads, t = src(i)
        (model.loss(grads) / 4).backward()
        reads.clear()
        mon.micro(t)
        assert reads == []
    reads.clear()
    mon.step()
    assert reads.count("cpu") == 1 and "item" not in reads


def test_on_a_real_model_the_monitor_reads_what_model_grad_fn_reads(tiny_model):
    gen = torch.Generator().manual_seed(0)
    data = []
    for i in range(6):
        ids = torch.randint(1, tiny_model.config.vocab_size, (2, 10), generator=gen)
        labels = ids.clone()
        labels[:, : 2 + i] = -100
        data.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    probe = measure_noise_scale(ModelGradFn(tiny_model, lambda i: data[i]), k=6)
    mon = NoiseMonitor(tiny_model.parameters(), grad_accum=6)
    for b in data:
        (tiny_model(**b).loss / 6).backward()
        mon.micro(int((b["labels"][:, 1:] != -100).sum()))
    est = mon.step()
    assert est.s == pytest.approx(probe.estimate.s, rel=1e-4)
    assert est.g2 == pytest.approx(probe.estimate.g2, rel=1e-3, abs=1e-3 * probe.estimate.s / probe.tokens)


def test_one_micro_batch_a_step_reads_no_noise_and_suggest_says_why():
    src = KnownNoise(500, dim=2048, seed=4, split=SHAPES)
    model = Linear()
    mon = NoiseMonitor(model.parameters(), grad_accum=1, tokens_per_micro_batch=800)
    run(model, src, mon, steps=5, accum=1)
    sug = mon.suggest()
    assert sug.grad_accum is None and sug.lr is None and "resolve" in sug.reason
    with pytest.raises(InputError, match="tokens_per_micro_batch"):
        NoiseMonitor(model.parameters()).suggest()


def test_suggest_gives_b_star_and_the_square_root_rate():
    src = KnownNoise(20_000, dim=2048, tokens=(800, 800), seed=5, split=SHAPES)
    model = Linear()
    mon = NoiseMonitor(model.parameters(), grad_accum=8)
    run(model, src, mon, steps=8, accum=8)
    sug = mon.suggest(tokens_per_micro_batch=800, t_micro_seconds=0.1, t_step_seconds=0.05, anchor_lr=1e-3)
    b = sug.estimate.b_noise_tokens
    b_star = math.sqrt(b * 800 * 0.05 / 0.1)
    assert sug.tokens_per_step == pytest.approx(b_star)
    assert sug.grad_accum == round(b_star / 800)
    assert sug.lr == pytest.approx(1e-3 * math.sqrt(sug.grad_accum * 800 / b))
    knee = mon.suggest(tokens_per_micro_batch=800)  # no times: aim at the knee
    assert knee.tokens_per_step == pytest.approx(b)


def test_controller_moves_grad_accum_sets_the_rate_and_puts_it_back_on_exit():
    src = KnownNoise(8000, dim=2048, tokens=(400, 400), seed=6, split=SHAPES)
    model = Linear()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    i = 0
    with pytest.raises(RuntimeError, match="boom"), Controller(model.parameters(), opt, anchor_lr=1e-2, tokens_per_micro=400, grad_accum=2) as ctl:
        for step in range(12):
            accum = ctl.grad_accum
            for _ in range(accum):
                grads, t = src(i)
                (model.loss(grads) / accum).backward()
                ctl.micro(t)
                i += 1
            sug = ctl.step()
            if sug.grad_accum is not None:
                b = sug.estimate.b_noise_tokens
                assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 * min(1.0, math.sqrt(accum * 400 / b)))
            opt.zero_grad(set_to_none=True)  # lr stays 0-effect: the weights do not feed the gradient
            if step == 11:
                raise RuntimeError("boom")
    assert ctl.decisions[-1]["grad_accum"] == pytest.approx(8000 / 400, rel=0.3)  # moved to the knee
    assert opt.param_groups[0]["lr"] == 0.5
