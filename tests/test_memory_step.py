"""TrainingStep on a tiny real model: what is in the peak, weights unmoved, optimizer handed back fresh."""

import pytest
import torch

from helpers import make_model
from leadline.errors import InputError
from leadline.memory import StepTiming, TrainingStep


def tiny():
    torch.manual_seed(0)
    model = make_model(vocab_size=64, hidden=16, layers=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    return model, opt


def loss_fn(model):
    def loss_of(rows, length):
        ids = torch.randint(0, 64, (rows, length), generator=torch.Generator().manual_seed(1))
        return model(input_ids=ids, labels=ids).loss
    return loss_of


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_fresh(model, opt, before, lr=3e-3):
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "weights moved"
    assert len(opt.state) == 0
    assert [g["lr"] for g in opt.param_groups] == [lr]
    assert all(p.grad is None for p in model.parameters())


def test_step_runs_times_and_hands_the_optimizer_back_fresh():
    model, opt = tiny()
    before = snapshot(model)
    seen = {}

    def loss_of(rows, length):
        # what is on the device while the forward runs: gradient buffers and the optimizer state
        params = list(model.parameters())
        seen["grads"] = all(p.grad is not None for p in params)
        seen["state"] = len(opt.state) == len(params) and all("exp_avg" in opt.state[p] for p in params)
        seen["lr"] = [g["lr"] for g in opt.param_groups]
        return loss_fn(model)(rows, length)

    t = TrainingStep(loss_of, opt)(2, 8, repeats=3)
    assert isinstance(t, StepTiming) and (t.rows, t.length) == (2, 8)
    assert len(t.micro_seconds) == 3 and len(t.step_seconds) == 3
    assert t.t_micro_seconds == sorted(t.micro_seconds)[1] and t.t_micro_seconds > 0
    assert seen == {"grads": True, "state": True, "lr": [0.0]}
    assert_fresh(model, opt, before)


def test_the_optimizer_comes_back_fresh_after_an_exception():
    model, opt = tiny()
    before = snapshot(model)
    calls = []

    def loss_of(rows, length):
        calls.append(rows)
        if len(calls) == 2:
            raise RuntimeError("the data loader broke")
        return loss_fn(model)(rows, length)

    with pytest.raises(RuntimeError, match="data loader broke"):
        TrainingStep(loss_of, opt)(2, 8, repeats=3)
    assert_fresh(model, opt, before)


def test_per_step_loss_runs_once_per_step_and_resident_is_counted():
    model, opt = tiny()
    fisher = torch.ones(1000)
    n = []

    def penalty():
        n.append(1)
        return sum((p * p).sum() for p in model.parameters()) * 1e-3

    step = TrainingStep(loss_fn(model), opt, per_step_loss=penalty, resident=(fisher,))
    step(1, 4, repeats=2)
    assert len(n) == 2
    assert sum(t.numel() * t.element_size() for t in step.resident) == 4000 and step.device == "cpu"


def test_a_tensor_learning_rate_is_restored_as_the_same_tensor():
    model, _ = tiny()
    lr = torch.tensor(0.01)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    before = snapshot(model)
    TrainingStep(loss_fn(model), opt)(1, 4)
    assert opt.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.01)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_bad_inputs_are_one_sentence():
    model, opt = tiny()
    with pytest.raises(InputError, match="callable"):
        TrainingStep("not a function", opt)
    with pytest.raises(InputError, match="torch optimizer"):
        TrainingStep(loss_fn(model), object())
    step = TrainingStep(lambda b, n: torch.ones(3, requires_grad=True), opt)
    with pytest.raises(InputError, match="scalar loss tensor"):
        step(1, 4)
    assert len(opt.state) == 0
    nan = TrainingStep(lambda b, n: loss_fn(model)(b, n) * float("nan"), opt)
    with pytest.raises(InputError, match="nan at 2 rows x 4 tokens"):
        nan(2, 4)
    p = next(model.parameters())
    opt.state[p]["step"] = torch.tensor(1.0)
    with pytest.raises(InputError, match="fresh optimizer"):
        TrainingStep(loss_fn(model), opt)(1, 4)
    with pytest.raises(InputError, match="rows >= 1"):
        TrainingStep(loss_fn(model), torch.optim.SGD(model.parameters(), lr=0.1))(0, 4)


def test_ramp_on_the_cpu_with_a_real_step_leaves_no_trace():
    from leadline import Plan
    from leadline.lookahead.memory import ramp

    model, opt = tiny()
    before = snapshot(model)
    r = ramp(TrainingStep(loss_fn(model), opt), 8, max_rows=4, repeats=2)
    assert 1 <= r.micro_batch <= 4 and r.rule == "throughput" and r.device == "cpu"
    assert all(g.rows_per_second and g.peak_bytes for g in r.rungs)
    assert r.t_micro_seconds > 0 and r.budget_bytes > 0
    assert_fresh(model, opt, before)
    plan = Plan()
    for name, value in r.as_values().items():
        plan.set(name, value)
    assert Plan.from_json(plan.to_json()) == plan
    assert "the most rows" not in plan["micro_batch"].source and "rows per second" in plan["micro_batch"].source
