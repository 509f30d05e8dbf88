"""The fixed cost of a micro-batch: one forward+backward against rows, at one length.

A SmolLM2-135M-shaped Llama (built from its config, random weights: the timing depends on the
shapes, not the weights; no download), LoRA r16 on every linear layer (peft), float32, the real
``leadline.memory.TrainingStep`` (AdamW at lr 0, medians of 5 synchronized repeats) at rows
1, 2, 4, ..., ``--max-rows`` and ``--length`` tokens. Then what ``tokens_per_step`` takes for a
noise scale of 3.4, 10 and 37 scored tokens at 2 scored tokens a row (debian_sections), with and
without the one-row timing.

Decision rule, written before the run: the card is "launch-bound" for this model at r rows when
t_micro(r) / t_micro(1) < 1.5 (a micro-batch costs mostly its fixed part), which is the case the
fixed-cost step was built for; the square-root formula's step is then reported beside it.

    PYTHONPATH=src python3 benchmarks/step_fixed_cost.py --out $OUT/step_fixed_cost.json
    PYTHONPATH=src python3 benchmarks/step_fixed_cost.py --tiny --device cpu --out /tmp/sfc.json   # smoke
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--length", type=int, default=232, help="tokens a row (debian_sections' seq_len at 600 characters)")
    ap.add_argument("--max-rows", type=int, default=64)
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model (smoke run)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from leadline.lookahead.noise import tokens_per_step
    from leadline.memory import TrainingStep

    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=2 if a.tiny else 30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(dev)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)

    def loss_of(b: int, n: int) -> torch.Tensor:
        ids = torch.randint(0, cfg.vocab_size, (b, n), device=dev)
        return model(input_ids=ids, labels=ids).loss

    step = TrainingStep(loss_of, opt)
    step(1, a.length, repeats=3)  # warm: kernels, the allocator
    rows, r = [], 1
    while r <= a.max_rows:
        t = step(r, a.length, repeats=5)
        rows.append({"rows": r, "t_micro_seconds": t.t_micro_seconds, "t_step_seconds": t.t_step_seconds,
                     "micro_seconds": t.micro_seconds, "ratio_to_one_row": None})
        print(json.dumps(rows[-1]), flush=True)
        r *= 2
    t1 = rows[0]["t_micro_seconds"]
    for x in rows:
        x["ratio_to_one_row"] = x["t_micro_seconds"] / t1
        x["launch_bound"] = x["ratio_to_one_row"] < 1.5
    big = rows[-1]
    steps = []
    for b_noise in (3.4, 10.0, 37.0):
        kw = dict(rows_fit=big["rows"], tokens_per_micro_batch=2.0 * big["rows"], t_step_seconds=big["t_step_seconds"],
                  t_micro_seconds=big["micro_seconds"])
        plain = tokens_per_step(b_noise, **kw)
        fixed = tokens_per_step(b_noise, **kw, t_micro_one_row_seconds=rows[0]["micro_seconds"])
        steps.append({"b_noise_tokens": b_noise, "sqrt_formula_rows": plain.rows_per_step, "fixed_cost_rows": fixed.rows_per_step,
                      "fixed_cost": fixed.inputs["fixed_cost"]})
        print(json.dumps(steps[-1]), flush=True)
    out = {"benchmark": "step_fixed_cost", "command": sys.argv, "device": dev,
           "device_name": torch.cuda.get_device_name(0) if dev.startswith("cuda") else platform.processor(),
           "versions": {"python": platform.python_version(), "torch": torch.__version__}, "tiny": a.tiny,
           "length": a.length, "rows": rows, "steps": steps,
           "launch_bound_up_to_rows": max((x["rows"] for x in rows if x["launch_bound"]), default=None)}
    Path(a.out).write_text(json.dumps(out, indent=1))
    print("launch-bound up to", out["launch_bound_up_to_rows"], "rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
