"""The rewrite scale, the constant divisors, Adam's square-root cut, the LoRA-init caveat,
warmup and weight decay — known numbers, no model needed; and the package stays light."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from leadline.errors import InputError
from leadline.lookahead.rate.anchor import (
    LORA_NONZERO_B,
    LORA_ZERO_B,
    adam_sqrt_cut,
    anchor_from_scale,
    anchor_rate,
    lora_caveat,
    rewrite_scale,
)
from leadline.lookahead.rate.warmup import linear_decay_lr, warmup_lr, warmup_steps_for, warmup_values
from leadline.plan import Plan


def test_rewrite_scale_is_the_rms_entry_of_the_binding_tensor():
    # ||W||_F / sqrt(numel): 6/sqrt(9) = 2, 4/sqrt(16) = 1, B all zero is skipped
    rs = rewrite_scale({"a": (6.0, 9), "b": (4.0, 16), "lora_B": (0.0, 100)})
    assert rs.scale == pytest.approx(1.0) and rs.binding == "b"
    assert rs.per_tensor == {"a": pytest.approx(2.0), "b": pytest.approx(1.0)}
    assert rs.zero_tensors == ["lora_B"]
    with pytest.raises(InputError, match="every trained tensor is zero"):
        rewrite_scale({"b": (0.0, 4)})


def test_anchor_rate_reads_norms_given_in_place_of_the_tensors():
    """A sharded model's norms, summed over the ranks, stand in for the shards it holds."""
    import torch

    named = [("a", torch.zeros(1)), ("lora_B", torch.zeros(1))]  # this rank's shards: they are not read
    res = anchor_rate(named, "weights", norms={"a": (6.0, 9), "lora_B": (0.0, 100)})
    assert res.rewrite.scale == pytest.approx(2.0) and res.rewrite.binding == "a"
    assert res.lr == pytest.approx(2.0 / 320)
    assert res.caveat == lora_caveat([("a", False), ("lora_B", True)])


def test_the_anchor_divides_by_the_constant_and_never_rises_above_it():
    rs = rewrite_scale({"w": (32.0, 1024)})  # rewrite = 1.0
    weights = anchor_from_scale(rs, "weights")
    assert weights.lr == pytest.approx(1 / 320) and weights.cut == 1.0
    factors = anchor_from_scale(rs, "factors", batch_tokens=1000, b_noise_tokens=16000)
    assert factors.cut == pytest.approx(0.25) and factors.lr == pytest.approx(0.25 / 32)
    above = anchor_from_scale(rs, "factors", batch_tokens=64000, b_noise_tokens=16000)
    assert above.lr == pytest.approx(1 / 32)  # a batch above the noise scale does not raise it
    assert adam_sqrt_cut(None, 5.0) == 1.0
    with pytest.raises(InputError, match="trained_as"):
        anchor_from_scale(rs, "adapter")
    values = factors.as_values()
    assert values["rate_divisor"].kind == "constant" and "LoRA r32 runs on SmolLM2-135M" in values["rate_divisor"].source
    assert values["lr_anchor"].kind == "constant" and "constant divisor" in values["lr_anchor"].source
    assert values["rewrite_scale"].kind == "derived"
    plan = Plan(values=values)
    assert list(plan.constants()) == ["rate_divisor", "lr_anchor"]


def test_the_lora_init_caveat_reads_whether_b_starts_at_zero():
    assert lora_caveat([("q.lora_A.default.weight", False), ("q.lora_B.default.weight", True)]) == LORA_ZERO_B
    assert lora_caveat([("q.lora_B.default.weight", False)]) == LORA_NONZERO_B
    assert lora_caveat([("model.layers.0.weight", False)]) is None


def test_anchor_rate_on_a_peft_lora_names_the_caveat_in_the_source():
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(48, 16)

        def forward(self, x):
            return self.fc(x)

    from leadline.lookahead.rate import anchor_rate

    torch.manual_seed(0)
    model = peft.get_peft_model(Net(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["fc"]))
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    a = anchor_rate(list(trained.items()), "factors")
    assert a.caveat == LORA_ZERO_B and "lora_A" in a.rewrite.binding
    # PEFT's A: kaiming-uniform(a=sqrt(5)), rms 1/sqrt(3 fan_in)
    assert a.rewrite.scale == pytest.approx(1 / math.sqrt(3 * 48), rel=0.15)
    assert "B starts at zero" in a.as_values()["lr_anchor"].source


def test_warmup_from_alpha1_and_the_linear_ending():
    assert warmup_steps_for(0.9) == 10 and warmup_steps_for(0.95) == 20 and warmup_steps_for(0.0) == 1
    assert warmup_lr(0, 1e-3, 1e-4, 10) == pytest.approx(1e-4)
    assert warmup_lr(5, 1e-3, 1e-4, 10) == pytest.approx(5.5e-4)
    assert warmup_lr(10, 1e-3, 1e-4, 10) == 1e-3
    assert warmup_lr(0, 1e-5, 1e-4, 10) == 1e-5  # a rate below alpha1 has nothing to warm
    assert [linear_decay_lr(t, 8, 12, 1.0) for t in range(8, 12)] == [1.0, 0.75, 0.5, 0.25]
    v = warmup_values(alpha1=1e-4, lr=2e-4, betas=(0.9, 0.999))
    # a rate above alpha1: no warmup either, a constant resting on the paired runs that measured it (docs/rate.md)
    w = v["warmup_steps"]
    assert w.value == 0 and w.kind == "constant" and "5 of 5" in w.source and "= 10 steps" in w.source
    assert "not raced on this run" in w.source
    assert w.evidence["full_finetune_paired_runs_lost"] == "5 of 5" and "warmup_cost.py" in w.evidence["decide_again"]
    assert "= 20 steps" in warmup_values(alpha1=1e-4, lr=2e-4, beta1=0.95)["warmup_steps"].source
    # a rate at or below alpha1 has nothing to warm: 0 steps, so Trainer's warmup from zero adds none
    low = warmup_values(alpha1=1e-4, lr=5e-5, betas=(0.9, 0.999))["warmup_steps"]
    assert low.value == 0 and low.source.startswith("none: the rate 5e-05 is at or below alpha1")
    assert v["weight_decay"].value == 0.0 and v["weight_decay"].kind == "constant" and "docs/rate.md" in v["weight_decay"].source


def test_import_leadline_rate_and_the_look_ahead_rate_loads_no_torch():
    code = ("import sys, leadline.rate, leadline.lookahead.rate as r; r.lookahead_lr; r.LookaheadSchedule; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_report_draws_the_rate_evidence():
    pytest.importorskip("matplotlib")
    from leadline.report.plots import render_svg

    first = {"plot": "first_step", "walk": [{"lr": 1e-4, "loss": 2.0}, {"lr": 4e-4, "loss": 1.9}], "base_loss": 2.1, "alpha1": 4e-4}
    look = {"plot": "lookahead", "horizons": [{"steps": 10, "candidates": [{"lr": 1e-4, "loss": 1.9, "se": 0.01}]}], "chosen_lr": 1e-4}
    sched = {"plot": "schedule", "checks": [{"step": 0, "loss": 2.0, "lr": 1e-4, "action": "best"}, {"step": 8, "loss": 2.5, "lr": 5e-5, "action": "rollback"}]}
    for ev in (first, look, sched):
        assert render_svg(ev).startswith("<svg")
