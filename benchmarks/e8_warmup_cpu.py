"""E8's warmup question on the CPU: the look-ahead's rate run 90 steps with and without the
warmup from alpha1, full fine-tune of SmolLM2-135M in float32 (no TF32), from the same weights,
the same rows (gsm_symbolic, 8 a step, rate_lookahead.py's E8 set-up), judged on the first
``judge`` test rows.

Why: on the H200 the look-ahead's rate (2.09e-4) with the warmup from alpha1 (1.29e-4, 10
steps) read 0.185 on 256 test rows against 0.167 without it (session 8, `rate_e8_full_s8.json`).
This asks whether the same gap shows without the card's numerics. The rate and alpha1 are the
H200's (given, not measured here). No pass/fail: the paired difference is reported.

    PYTHONPATH=src .venv/bin/python benchmarks/e8_warmup_cpu.py --model /tmp/bcpu/smol_hf \
        --data-dir ../shared/data --judge 128 --out benchmarks/results/e8_warmup_cpu.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import rate_lookahead as R


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--judge", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2.0906784646132948e-4, help="the H200 look-ahead's rate (session 7)")
    ap.add_argument("--alpha1", type=float, default=1.2910852417671376e-4, help="the H200's alpha1")
    ap.add_argument("--arms", default="warmup,constant")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch

    from leadline.rate.warmup import warmup_lr
    from leadline.stats import paired_difference

    s = R.Setup(argparse.Namespace(model=args.model, smoke=False))
    steps, per_step = 90, 8
    raw = R.read_jsonl(Path(args.data_dir) / "gsm_symbolic_train.jsonl")
    random.Random(0).shuffle(raw)

    def enc(r):
        return R.encode(s.tok, r["question"] + "\n", r["answer_cot"], 256)

    train = [enc(r) for r in raw[: steps * per_step]]
    judge = [enc(r) for r in R.read_jsonl(Path(args.data_dir) / "gsm_symbolic_test.jsonl")[: args.judge]]
    ts = R.make_train_step(s.model, train, per_step, s.pad, s.device)
    schedules = {"constant": lambda t: args.lr, "warmup": lambda t: warmup_lr(t, args.lr, args.alpha1, 10)}
    out: dict = {"benchmark": "e8_warmup_cpu", "command": sys.argv, "versions": R.versions(),
                 "threads": torch.get_num_threads(), "lr": args.lr, "alpha1": args.alpha1, "arms": {}}
    for name in args.arms.split(","):
        t0 = time.perf_counter()
        opt = s.opt(s.full())
        R.train(opt, ts, steps, schedules[name])
        rows = R.row_losses(s.model, judge, s.pad, s.device)
        out["arms"][name] = {"loss": R.mean_se(rows), "rows": rows, "seconds": time.perf_counter() - t0}
        print(name, out["arms"][name]["loss"], flush=True)
    a = out["arms"]
    if "warmup" in a and "constant" in a:
        out["warmup_minus_constant"] = paired_difference(a["warmup"]["rows"], a["constant"]["rows"]).as_dict()
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
