"""NoiseMonitor and Controller: the probe's numbers from inside an accumulating loop."""

import math

import pytest
import torch

from leadline.errors import InputError
from leadline.lookahead.noise import Controller, ModelGradFn, NoiseMonitor, measure_noise_scale
from leadline.lookahead.noise import monitor as monitor_module
from leadline.lookahead.noise.estimator import Draw, NoiseSums
from leadline.lookahead.noise.synthetic import KnownNoise

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


class Branchy(torch.nn.Module):
    """A tiny net with a branch only some micro-batches reach and a tensor none reaches (its
    .grad stays None: AdamW's weight decay would move it if the monitor made it zero)."""

    def __init__(self, b_dtype=torch.float32, side_dtype=torch.float32):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(6, 16)
        self.b = torch.nn.Linear(16, 3).to(b_dtype)
        self.side = torch.nn.Linear(6, 3).to(side_dtype)
        self.unused = torch.nn.Parameter(torch.randn(4))

    def forward(self, x, use_side):
        y = self.b(torch.tanh(self.a(x)).to(self.b.weight.dtype)).float()
        return y + self.side(x.to(self.side.weight.dtype)).float() if use_side else y


def _train(model, steps, accum, set_to_none, mon=None):
    """AdamW over ``steps`` steps of ``accum`` micro-batches (unequal token counts); returns the
    .grad before each opt.step() and the .grad after each micro-batch's backward."""
    gen = torch.Generator().manual_seed(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    before_step, snaps = [], []
    for _ in range(steps):
        step_snaps = []
        for j in range(accum):
            x, y = torch.randn(5, 6, generator=gen), torch.randn(5, 3, generator=gen)
            (torch.nn.functional.mse_loss(model(x, use_side=j == 1), y) / accum).backward()
            if mon is not None:
                mon.micro(5 + 2 * j)
            step_snaps.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()])
        snaps.append(step_snaps)
        if mon is not None:
            mon.step()
        before_step.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
    return before_step, snaps


def _reference(snaps, accum):
    """The estimate the straightforward way, in float64: each micro-batch's gradient of its mean
    loss as the difference of .grad after and before its backward, times grad_accum, and the
    token-weighted mean by Welford's rule, one group a step."""
    sums = NoiseSums()
    for step_snaps in snaps:
        sums.new_group()
        prev = mean = None
        tokens = 0.0
        for j, snap in enumerate(step_snaps):
            flat = torch.cat([s.double().reshape(-1) for s in snap])
            g = (flat if prev is None else flat - prev) * accum
            mean = torch.zeros_like(g) if mean is None else mean
            t = 5.0 + 2 * j
            tokens += t
            r = float((g - mean) @ (g - mean))
            mean = mean + (t / tokens) * (g - mean)
            sums.add(Draw(tokens=t, innovation_sq=r, mean_sq=float(mean @ mean)))
            prev = flat
    return sums.estimate()


def _assert_same_estimate(est, ref):
    assert (est.draws, est.groups, est.tokens, est.resolved) == (ref.draws, ref.groups, ref.tokens, ref.resolved)
    assert est.s == pytest.approx(ref.s, rel=1e-5) and est.s_se == pytest.approx(ref.s_se, rel=1e-4)
    assert est.g2 == pytest.approx(ref.g2, rel=1e-4, abs=1e-5 * ref.s / ref.tokens)
    assert est.g2_se == pytest.approx(ref.g2_se, rel=1e-4)
    for got, want in ((est.b_noise_tokens, ref.b_noise_tokens), (est.se_tokens, ref.se_tokens)):
        assert got == pytest.approx(want, rel=1e-4) if want is not None else got is None


@pytest.mark.parametrize("release", [False, True], ids=["kept", "released"])
@pytest.mark.parametrize("set_to_none", [True, False], ids=["set_to_none", "zeroed"])
def test_the_optimizer_steps_bit_for_bit_as_without_the_monitor(monkeypatch, set_to_none, release):
    """.grad becomes a view of the monitor's buffer; autograd accumulates into it in place, so
    every .grad before opt.step() and every weight after are bitwise those of a run without the
    monitor (a tensor no micro-batch reaches keeps .grad None), and the estimate is the one
    read from the same gradients the straightforward way."""
    if release:
        monkeypatch.setattr(monitor_module, "_RELEASE_BYTES", 0)  # let the buffer go between steps
    plain, watched = Branchy(), Branchy()
    before_plain, snaps = _train(plain, steps=4, accum=3, set_to_none=set_to_none)
    mon = NoiseMonitor(watched.parameters(), grad_accum=3)
    before_watched, _ = _train(watched, steps=4, accum=3, set_to_none=set_to_none, mon=mon)
    for a, b in zip(before_plain, before_watched):
        assert [g is None for g in a] == [g is None for g in b]
        assert all(torch.equal(x, y) for x, y in zip(a, b) if x is not None)
    names = [n for n, _ in watched.named_parameters()]
    assert all(grads[names.index("unused")] is None for grads in before_watched)
    for p, q in zip(plain.parameters(), watched.parameters()):
        assert torch.equal(p, q)
    _assert_same_estimate(mon.estimate(), _reference(snaps, accum=3))


def test_tensors_of_several_dtypes_are_read_from_one_buffer_each():
    """fp32, bf16 and fp64 tensors: a buffer per dtype, .grad bitwise as without the monitor,
    the estimate as read from the same .grad."""
    plain, watched = Branchy(torch.float64, torch.bfloat16), Branchy(torch.float64, torch.bfloat16)
    before_plain, snaps = _train(plain, steps=3, accum=3, set_to_none=True)
    mon = NoiseMonitor(watched.parameters(), grad_accum=3)
    before_watched, _ = _train(watched, steps=3, accum=3, set_to_none=True, mon=mon)
    assert sorted(str(grp.grad.dtype) for grp in mon._groups) == ["torch.bfloat16", "torch.float32", "torch.float64"]
    for a, b in zip(before_plain, before_watched):
        assert all((x is None and y is None) or torch.equal(x, y) for x, y in zip(a, b))
    for p, q in zip(plain.parameters(), watched.parameters()):
        assert p.dtype == q.dtype and torch.equal(p, q)
    _assert_same_estimate(mon.estimate(), _reference(snaps, accum=3))


@pytest.mark.parametrize("set_to_none", [True, False], ids=["set_to_none", "zeroed"])
def test_after_the_first_micro_batch_of_a_step_micro_touches_no_list_of_tensors(monkeypatch, set_to_none):
    """From the first micro() of a step every .grad is a view of one flat buffer, and the
    micro()s after it call no torch._foreach_* (those go over every tensor); with
    zero_grad(set_to_none=False) not even the first of the next step does."""
    calls = []
    for name in ("_foreach_copy_", "_foreach_zero_", "_foreach_sub_", "_foreach_add_"):
        orig = getattr(torch, name)

        def counted(*a, _orig=orig, _name=name, **kw):
            calls.append(_name)
            return _orig(*a, **kw)

        monkeypatch.setattr(torch, name, counted)
    src = KnownNoise(500, dim=2048, seed=7, split=SHAPES)
    model = Linear()
    mon = NoiseMonitor(model.parameters(), grad_accum=3)
    for step in range(3):
        for j in range(3):
            grads, t = src(3 * step + j)
            (model.loss(grads) / 3).backward()
            calls.clear()
            mon.micro(t)
            bases = {p.grad._base for p in model.ws}
            assert len(bases) == 1 and bases.pop().numel() == 2048
            if j > 0 or (step > 0 and not set_to_none):
                assert calls == []
            else:
                assert calls == ["_foreach_copy_"]
        mon.step()
        model.zero_grad(set_to_none=set_to_none)


@pytest.mark.parametrize("release", [False, True], ids=["kept", "released"])
def test_zero_grad_set_to_none_frees_a_large_buffer_and_keeps_a_small_one(monkeypatch, release):
    import gc
    import weakref

    if release:
        monkeypatch.setattr(monitor_module, "_RELEASE_BYTES", 0)
    src = KnownNoise(500, dim=2048, seed=8, split=SHAPES)
    model = Linear()
    mon = NoiseMonitor(model.parameters(), grad_accum=2)
    run(model, src, mon, steps=1, accum=2)  # ends with zero_grad(set_to_none=True)
    grads, t = src(2)
    (model.loss(grads) / 2).backward()
    mon.micro(t)
    buffer = weakref.ref(model.ws[0].grad._base)
    mon.step()
    model.zero_grad(set_to_none=True)
    gc.collect()
    assert (buffer() is None) == release
    run(model, src, mon, steps=2, accum=2, start=3)  # and reads on as before
    assert mon.estimate().draws == 7


def test_sharded_parameters_are_refused_with_a_sentence():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        mesh = init_device_mesh("cpu", (1,))
        p = torch.nn.Parameter(distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)]))
        with pytest.raises(InputError, match="sharded"):
            NoiseMonitor([p], grad_accum=2)
    finally:
        dist.destroy_process_group()
