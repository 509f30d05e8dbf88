"""Do the rate phases leave the run where a fresh start would? (the sweep's full-mode gap)

The sweep experiment's full fine-tune on the H200 (``rate_lookahead.py --experiment sweep``): the
look-ahead's rate, run after the phases with its warmup from alpha1, lost 0.016-0.018 of held-out
loss to the same rate run from a fresh optimizer. This script asks the narrower question directly,
on the real model: N training steps with a warmup, once from a fresh AdamW and once on the optimizer
that ``measure_first_step`` and ``lookahead_lr`` have just used (every weight trained, tied
embeddings included), from the same weights, on the same rows.

Decision rule, written before the run: PASS when the two runs' weights after N steps are
bit-identical (on CUDA: max |difference| <= 1e-6 with TF32 off, the same kernels in the same
order), and after the phases the weights equal the start, the optimizer holds no state and
every .grad is None or as before.

    PYTHONPATH=src python3 benchmarks/phases_leave_no_trace.py --model /root/assets/smol_hf --out $OUT/phases_leave_no_trace_cuda.json
    PYTHONPATH=src .venv/bin/python benchmarks/phases_leave_no_trace.py --model <folder> --device cpu --out benchmarks/results/phases_leave_no_trace_cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a HF folder (benchmarks/gguf_to_folder.py writes one)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--steps", type=int, default=4, help="the run compared, in optimizer steps")
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--lookahead-steps", type=int, default=12, help="the look-ahead's total_steps (its budget is twice that)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch

    from leadline.hf.loading import load_model
    from leadline.lookahead.rate import lookahead_lr, measure_first_step
    from leadline.lookahead.rate.warmup import warmup_lr
    from leadline.measure.machine import describe_machine

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = load_model(args.model, dtype=torch.float32, device=device)
    for p in model.parameters():
        p.requires_grad_(True)
    params = [p for p in model.parameters() if p.requires_grad]
    start = [p.detach().clone() for p in params]
    vocab = int(model.config.vocab_size)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, vocab, (args.rows, args.tokens), generator=g).to(device) for _ in range(32)]
    held_rows = [torch.randint(0, vocab, (1, args.tokens), generator=g).to(device) for _ in range(8)]

    def train_step(t: int) -> float:
        x = rows[t % len(rows)]
        loss = model(input_ids=x, labels=x, use_cache=False).loss
        loss.backward()
        return float(loss.detach())

    def held() -> list[float]:
        with torch.no_grad():
            return [float(model(input_ids=x, labels=x, use_cache=False).loss) for x in held_rows]

    def run(opt: Any, lr: float, alpha1: float) -> list[Any]:
        for t in range(args.steps):
            for group in opt.param_groups:
                group["lr"] = warmup_lr(t, lr, alpha1, 10)
            opt.zero_grad(set_to_none=True)
            train_step(t)
            opt.step()
        return [p.detach().clone() for p in params]

    lr, a1 = 2e-4, 1.3e-4
    fresh = run(torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0), lr, a1)
    with torch.no_grad():
        for p, s in zip(params, start):
            p.copy_(s)
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    t1 = time.perf_counter()
    fs = measure_first_step(params, opt, train_step, held)
    la = lookahead_lr(params, opt, train_step, held, fs, total_steps=args.lookahead_steps, grid=(-1, 0, 1))
    phases_s = time.perf_counter() - t1
    state = {"weights_equal_start": all(torch.equal(p, s) for p, s in zip(params, start)),
             "optimizer_state_entries": len(opt.state), "grads_none": all(p.grad is None for p in params)}
    after = run(opt, lr, a1)
    diffs = [float((a - b).abs().max()) for a, b in zip(after, fresh)]
    identical = all(torch.equal(a, b) for a, b in zip(after, fresh))
    tol = 0.0 if device == "cpu" else 1e-6
    result = {
        "benchmark": "phases_leave_no_trace", "command": " ".join(sys.argv), "machine": describe_machine(device),
        "versions": {"torch": torch.__version__}, "args": vars(args),
        "model": {"params": sum(p.numel() for p in params), "tensors": len(params),
                  "tied_embeddings": model.get_input_embeddings().weight is model.get_output_embeddings().weight},
        "phases": {"alpha1": fs.alpha1, "lookahead_lr": la.lr, "lookahead_steps": la.steps_used, "seconds": phases_s},
        "state_after_phases": state, "runs_identical": identical, "max_abs_difference": max(diffs),
        "rule": f"PASS when the runs match (max |difference| <= {tol:g}) and the state after the phases is the start's",
        "verdict": "PASS" if max(diffs) <= tol and state["weights_equal_start"] and state["optimizer_state_entries"] == 0 else "FAIL",
        "seconds": time.perf_counter() - t0,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(f"{result['verdict']}: runs identical {identical}, max |diff| {max(diffs):g}; state after the phases {state}; {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
