"""The SpillWatch's cost on a step that is all module calls (CPU), side by side with no watch.

Why: on the H200, memory_ramp's watch-cost rule (its R4) cannot resolve 1% (steps spread by more than that, and
its paired steps read 0.95-1.02 with +-8% intervals), while the watch's own reports
(memory_ramp's R4b) time only its readings. The watch holds no global module forward pre-hook: one sends every
module call in the process through ``Module._call_impl``'s slow path and calls Python for each, a
cost R4b does not count. This benchmark measures what R4b cannot,
where it is largest: a step whose time is almost all module dispatch (a 30-layer Llama as
narrow as a test model, SmolLM2-135M's module tree, 1 row of 16 tokens), which is the regime of
a small model's GPU step, whose CPU launches the kernels.

Arms, the same steps (forward + backward + AdamW at lr 0 + zero_grad):
  bare       no hooks
  watch      leadline's SpillWatch, as ``forbid_spill`` installs it (readings of the host's
             memory, throttled to 1% of elapsed time), after its first optimizer step
  global     a global forward pre-hook doing what a watch holding one would (a dict
             lookup per module call), for the contrast
Each rep runs ``--steps`` steps of each arm in a rotating order; the ratio to bare is the
geometric mean over reps of (arm seconds / bare seconds in that rep), with its 2-se interval.

Decision rule, written before the run: the watch PASSES when its interval's upper end is <= 1.01
(its cost on the worst-case step is resolved below 1%), FAILS when the lower end is > 1.01,
otherwise UNRESOLVED. ``global`` is reported, not judged.

    PYTHONPATH=src .venv/bin/python benchmarks/watch_cost_cpu.py --out benchmarks/results/watch_cost_cpu.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any


def build(lora: bool) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=30,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    return model


def measure_case(name: str, lora: bool, args: argparse.Namespace) -> dict[str, Any]:
    """One model: the three arms in rotating order, ``--reps`` times (the module docstring)."""
    import torch
    from torch.nn.modules.module import register_module_forward_pre_hook

    from leadline.memory import SpillWatch
    from leadline.memory_readings import HostMemory
    from leadline.stats import mean_se

    model = build(lora)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=0.0)
    ids = torch.randint(0, 512, (1, 16))
    calls = {"n": 0}

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def old_hook(module: Any, a: Any, kinds: dict[int, bool] = {}) -> None:  # noqa: B006 - the old per-call lookup
        calls["n"] += 1
        if kinds.get(id(module)) is None:
            kinds[id(module)] = True

    watch = SpillWatch(HostMemory())

    def run(arm: str) -> float:
        handle = None
        if arm == "watch":
            watch.install()
            step()  # its discovery and first optimizer step, untimed
        elif arm == "global":
            handle = register_module_forward_pre_hook(old_hook)
        try:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            return time.perf_counter() - t0
        finally:
            watch.remove()
            if handle is not None:
                handle.remove()

    for _ in range(3):
        step()
    arms = ("bare", "watch", "global")
    seconds: dict[str, list[float]] = {a: [] for a in arms}
    for r in range(args.reps):
        for a in arms[r % 3:] + arms[:r % 3]:
            seconds[a].append(run(a))
    calls_per_step = calls["n"] / (args.reps * args.steps)
    case: dict[str, Any] = {"seconds": seconds, "module_calls_per_step": calls_per_step,
                            "step_seconds_bare": sorted(seconds["bare"])[args.reps // 2] / args.steps}
    for a in ("watch", "global"):
        m, se = mean_se([math.log(x / b) for x, b in zip(seconds[a], seconds["bare"])])
        case[a] = {"ratio": math.exp(m), "low": math.exp(m - 2 * se), "high": math.exp(m + 2 * se)}
    w = case["watch"]
    case["verdict"] = "PASS" if w["high"] <= 1.01 else "FAIL" if w["low"] > 1.01 else "UNRESOLVED"
    rep = watch.report()
    case["watch_report"] = {"readings": rep.readings, "skipped_checks": rep.skipped_checks,
                            "reading_seconds": rep.reading_seconds, "hook_errors": rep.hook_errors}
    print(f"{name:7s} step {case['step_seconds_bare'] * 1e3:.2f} ms, {calls_per_step:.0f} module calls: "
          f"watch {w['ratio']:.4f} [{w['low']:.4f}, {w['high']:.4f}] {case['verdict']}; "
          f"global hook {case['global']['ratio']:.4f} [{case['global']['low']:.4f}, {case['global']['high']:.4f}]")
    return case


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    report: dict[str, Any] = {"benchmark": "watch_cost_cpu", "command": sys.argv,
                              "machine": {"platform": platform.platform(), "python": platform.python_version(),
                                          "torch": torch.__version__, "threads": torch.get_num_threads()},
                              "cases": {}}
    for name, lora in (("full", False), ("lora16", True)):
        report["cases"][name] = measure_case(name, lora, args)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
