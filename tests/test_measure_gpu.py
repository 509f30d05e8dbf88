"""The GPU tool: datasheet lookup, the verdict's rules, the plan's step, the measuring path."""

import json
import math

import pytest

from leadline import Plan, Value
from leadline.errors import LeadlineError
from leadline.measure.gpu import datasheet_for, judge, measure_gpu, step_times_from_plan, verdict_of


@pytest.mark.parametrize(
    ("name", "sheet", "tflops", "tbs"),
    [
        ("NVIDIA H200", "H200 SXM", 989, 4.8),
        ("NVIDIA H200 NVL", "H200 NVL", 835, 4.8),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989, 3.35),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756, 2.0),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 312, 2.039),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 312, 1.935),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB", 312, 1.555),
        ("NVIDIA A10", "A10", 125, 0.6),
        ("NVIDIA L4", "L4", 121, 0.3),
        ("NVIDIA L40S", "L40S", 362, 0.864),
        ("NVIDIA RTX A6000", "RTX A6000", 154.8, 0.768),
    ],
)
def test_datasheet_lookup(name, sheet, tflops, tbs):
    d = datasheet_for(name)
    assert d is not None and d.name == sheet
    assert d.bf16_dense_tflops == tflops and d.memory_tb_per_s == tbs


def test_unknown_cards_have_no_datasheet():
    assert datasheet_for("NVIDIA GH200 480GB") is None
    assert datasheet_for("Tesla T4") is None
    assert datasheet_for("NVIDIA GeForce GTX 1060 6GB") is None


def test_seed_rented_a6000_lies_by_asymmetry_and_launches():
    # a rented card: D2H 457 MB/s against H2D 1502 (3.4x) and 55 µs launches on a rented card
    f = judge(shared_card=False, launch_us=55.0, h2d_gb_per_s=1.502, d2h_gb_per_s=0.457, mem_get_info_seconds=1.5, pinning_gain=1.02)
    by = {x.what: x for x in f}
    assert by["direction asymmetry"].lies and by["direction asymmetry"].reading == pytest.approx(3.2866, rel=1e-3)
    assert "device-to-host" in by["direction asymmetry"].sentence
    assert by["launch latency"].lies and by["mem_get_info cost"].lies
    assert not by["pinning buys nothing"].lies
    ok, sentence = verdict_of(f)
    assert not ok and "direction asymmetry" in sentence and "launch latency" in sentence


def test_local_card_is_trusted_and_a_vgpu_never_is():
    f = judge(shared_card=False, launch_us=4.0, h2d_gb_per_s=55.0, d2h_gb_per_s=52.0, mem_get_info_seconds=2e-5)
    assert verdict_of(f)[0] is True
    f = judge(shared_card=True, launch_us=4.0, h2d_gb_per_s=55.0, d2h_gb_per_s=52.0, mem_get_info_seconds=2e-5)
    ok, sentence = verdict_of(f)
    assert not ok and "vGPU" in sentence


def test_unknown_virtualisation_is_said_not_hidden():
    f = judge(shared_card=None, launch_us=4.0, h2d_gb_per_s=55.0, d2h_gb_per_s=52.0, mem_get_info_seconds=2e-5)
    note = next(x for x in f if x.what == "virtualisation unknown")
    assert not note.lies and "cannot be ruled out" in note.sentence


def test_with_a_plan_costs_are_shares_of_the_step():
    plan = Plan()
    plan.set("t_micro_seconds", Value(2.0, "measured", "median of 5 synchronized repeats"))
    plan.set("t_step_seconds", Value(0.5, "measured", "median of 5 synchronized repeats"))
    plan.set("grad_accum", Value(4, "derived", "tokens per step over tokens per micro-batch"))
    step = step_times_from_plan(plan)
    assert step.step_seconds == pytest.approx(8.5)
    # 20 µs launches are over the raw limit, but 10,000 of them are 2.4% of an 8.5 s step
    f = {x.what: x for x in judge(shared_card=False, launch_us=20.0, h2d_gb_per_s=50, d2h_gb_per_s=50, mem_get_info_seconds=0.03, step=step, launches_per_step=10_000)}
    assert f["launch latency"].share_of_step == pytest.approx(10_000 * 20e-6 / 8.5)
    assert not f["launch latency"].lies
    # one 30 ms mem_get_info per 2 s micro-batch is 1.5%: over the SpillWatch's 1%
    assert f["mem_get_info cost"].share_of_step == pytest.approx(0.015) and f["mem_get_info cost"].lies
    # without a launch count the raw limit stands, and the sentence says where 5% is reached
    f = {x.what: x for x in judge(shared_card=False, launch_us=20.0, h2d_gb_per_s=50, d2h_gb_per_s=50, mem_get_info_seconds=None, step=step)}
    assert f["launch latency"].lies and "21,250 per step" in f["launch latency"].sentence


def test_plan_without_step_times():
    plan = Plan()
    plan.set("micro_batch", Value(4, "measured", "the ramp"))
    assert step_times_from_plan(plan) is None
    plan.set("t_micro", Value(0.25, "measured", "median"))
    assert step_times_from_plan(plan).step_seconds == pytest.approx(0.25)


def test_measuring_path_runs_end_to_end_on_cpu():
    """Every driver except pinning and mem_get_info, on the CPU with tiny sizes."""
    r = measure_gpu("cpu", quick=True, _allow_cpu=True)
    assert r.launch_us > 0 and r.launch_sync_us > 0 and r.copy_gb_per_s > 0 and r.matmul_tflops > 0
    assert {(t.direction, t.memory) for t in r.transfers} == {("h2d", "pageable"), ("d2h", "pageable")}
    assert all(math.isfinite(row["gb_per_s"]) and row["gb_per_s"] > 0 for t in r.transfers for row in t.sizes)
    assert r.mem_get_info_seconds is None and r.datasheet is None
    assert {v.kind for v in r.as_values().values()} == {"measured"}
    json.dumps(r.to_dict())
    assert "verdict:" in r.text()


def test_no_cuda_is_one_sentence():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(LeadlineError, match="no CUDA device"):
        measure_gpu()


@pytest.mark.gpu
def test_on_the_card_every_arm_and_matmul_below_the_datasheet():
    r = measure_gpu(quick=True)
    assert {(t.direction, t.memory) for t in r.transfers} == {(d, m) for d in ("h2d", "d2h") for m in ("pinned", "pageable")}
    assert 0 < r.launch_us < 1000 and r.mem_get_info_seconds is not None
    if r.datasheet is not None:
        assert r.matmul_tflops < 1.1 * r.datasheet.bf16_dense_tflops
        assert r.copy_gb_per_s < 1.1 * r.datasheet.memory_tb_per_s * 1000


def test_the_measured_card_is_matched_to_nvidia_smi_by_pci_bus():
    from types import SimpleNamespace

    from leadline.measure.gpu import _smi_card
    from leadline.measure.virt import parse_nvidia_smi
    from test_measure_virt import BARE_H800, VGPU_GUEST_TWO_CARDS

    def fake_torch(bus):
        props = SimpleNamespace(pci_bus_id=bus, pci_domain_id=0, pci_device_id=0)
        return SimpleNamespace(cuda=SimpleNamespace(get_device_properties=lambda dev: props))

    cuda = SimpleNamespace(type="cuda")
    two = parse_nvidia_smi(VGPU_GUEST_TWO_CARDS)
    assert _smi_card(fake_torch(3), cuda, two).bus_id == "00000000:03:00.0"
    assert _smi_card(fake_torch(9), cuda, two) is None  # no guessing between two cards
    one = parse_nvidia_smi(BARE_H800)
    assert _smi_card(fake_torch(9), cuda, one) is one[0]  # the only card
    assert _smi_card(fake_torch(3), SimpleNamespace(type="cpu"), two) is None
