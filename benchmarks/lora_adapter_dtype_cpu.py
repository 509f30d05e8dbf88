"""What a training step keeps for its backward: a full fine-tune against LoRA r16 with PEFT's
float32 adapters and with the adapters in the model's bfloat16 — SmolLM2-135M in bfloat16, on
the CPU (the bytes the autograd graph saves do not depend on the device).

Why: on the H200 (`memory_ramp/lora16_24gb_seq2048.json` against
`memory_ramp/full_24gb_seq2048.json`) LoRA r16 kept 4 rows at 2048 tokens where the full
fine-tune kept 5, though it holds ~2 GB less of weights, gradients and optimizer state.
PEFT keeps the adapters in float32 on a bfloat16 model by default and casts each adapted
layer's input to float32, so this counts the tensors saved for the backward (each storage once,
through ``torch.autograd.graph.saved_tensors_hooks``), by dtype.

Rule, written before the run: the float32 adapters explain the gap when LoRA with them saves
more than the full fine-tune and LoRA with bfloat16 adapters saves less than the full fine-tune.

    PYTHONPATH=src .venv/bin/python benchmarks/lora_adapter_dtype_cpu.py --model /tmp/bcpu/smol_hf \
        --out benchmarks/results/lora_adapter_dtype_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def saved(model, ids) -> dict:
    import torch

    seen: dict = {}

    def pack(t):
        key = (t.untyped_storage().data_ptr(), t.dtype)
        seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    trained = {id(p) for p in model.parameters() if p.requires_grad}
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    by: dict = {}
    for (ptr, dt), n in seen.items():
        if ptr in params:
            continue  # the weights themselves: resident anyway, not activations
        by[str(dt).replace("torch.", "")] = by.get(str(dt).replace("torch.", ""), 0) + n
    model.zero_grad(set_to_none=True)
    return {"activation_bytes": sum(by.values()), "by_dtype": by, "trained_tensors": len(trained)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import peft
    import torch
    import transformers

    from leadline.hf.loading import load_model
    from leadline.memory.model_step import add_lora, cast_adapters, full_finetune, remove_lora

    model = load_model(args.model, dtype=torch.bfloat16, device="cpu")
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (args.rows, args.seq), generator=torch.Generator().manual_seed(0))
    arms = {"full": saved(full_finetune(model), ids)}
    for p in model.parameters():
        p.requires_grad_(False)
    lora = add_lora(model, 16)
    arms["lora16_float32_adapters"] = saved(lora, ids)
    restore = cast_adapters(lora, torch.bfloat16)
    arms["lora16_bfloat16_adapters"] = saved(lora, ids)
    restore()
    remove_lora(lora)
    full = arms["full"]["activation_bytes"]
    for a in arms.values():
        a["over_full"] = a["activation_bytes"] / full
    explained = arms["lora16_float32_adapters"]["over_full"] > 1 and arms["lora16_bfloat16_adapters"]["over_full"] < 1
    out = {"benchmark": "lora_adapter_dtype_cpu", "command": sys.argv, "rows": args.rows, "seq": args.seq,
           "machine": {"platform": platform.platform(), "python": platform.python_version()},
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__},
           "arms": arms, "rule": "float32 adapters explain the gap", "verdict": "PASS" if explained else "FAIL"}
    Path(args.out).write_text(json.dumps(out, indent=1))
    for k, a in arms.items():
        print(f"{k}: {a['activation_bytes'] / 1e6:.1f} MB saved ({a['over_full']:.3f}x full) {a['by_dtype']}")
    print(out["verdict"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
