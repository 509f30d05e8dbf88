"""The warmup question of the sweep experiment: the look-ahead's rate run 90 steps under several
warmups, full fine-tune of SmolLM2-135M in float32, from the same weights and the same rows
(gsm_symbolic, 8 a step, ``rate_lookahead.py --experiment sweep``'s set-up), judged on the first
``--judge`` test rows. On the GPU when there is one (TF32 matmuls unless ``--no-tf32``), else the
CPU.

Why: on the H200 the look-ahead's rate (2.09e-4) with the warmup from alpha1 (1.29e-4, 10
steps) read 0.185 on 256 test rows against 0.167 without it (`rate_lookahead/sweep_gsm_full.json`);
on the CPU (float32, no TF32, 128 rows) the same two runs differed by +0.0043 ± 0.0040
(`warmup_cost/gsm_full_cpu.json`). The rate and alpha1 are the H200's (given, not measured here).

Arms (``--arms``): ``constant`` (the rate from step 0); ``warmup`` (from alpha1 over 10 steps,
leadline's); ``warmup5`` / ``warmup20`` (from alpha1 over 5 / 20 steps); ``warmup_zero`` (from 0
over 10 steps: Trainer's ``constant_with_warmup``).
Rule, written before the run: each arm against ``constant`` by the paired difference of
per-row losses; "the warmup costs" when its difference is > 0 at two-sided p < 0.05. With
``--no-tf32`` beside a TF32 run on the same card, a cost that appears only with TF32 is the
card's numerics, not the warmup.

    PYTHONPATH=src python3 benchmarks/warmup_cost.py --model /root/assets/smol_hf --data-dir /root/assets/data \\
        --judge 256 --out $OUT/warmup_cost/gsm_full_tf32.json   (and --no-tf32 --out $OUT/warmup_cost/gsm_full_fp32.json)
    PYTHONPATH=src .venv/bin/python benchmarks/warmup_cost.py --model /tmp/bcpu/smol_hf --data-dir ../shared/data \\
        --judge 128 --arms warmup,constant --out benchmarks/results/warmup_cost/gsm_full_cpu.json

``--compare F1 F2 ... --out OUT`` reads runs already made (each with the constant and warmup
arms): whether the same test rows lose to the warmup in every run (CPU, seconds).

``--order-seed K`` (K > 0) trains on the same rows in another order (shuffled by K). Rule for the
orders, written before they run: the warmup's cost belongs to the schedule, not to one order of the
rows, when "the warmup costs" holds in every order run; when it holds in some orders and not in
others, the cost is the trajectory's, and the full fine-tune's miss of the sweep's second best
(rate_lookahead.py's R2) is one draw of it.
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


def compare(files: list[str], out: str) -> int:
    """Whether the same test rows lose to the warmup in every run: per run, the warmup's per-row
    difference against the constant (mean, median, the share of rows worse, the share of the
    total the 10 worst rows carry), and the Pearson correlation of those differences between runs."""
    import statistics as st

    diffs = {}
    for f in files:
        arms = json.loads(Path(f).read_text())["arms"]
        diffs[Path(f).name] = [w - c for w, c in zip(arms["warmup"]["rows"], arms["constant"]["rows"])]

    def corr(a: list[float], b: list[float]) -> float:
        ma, mb = st.mean(a), st.mean(b)
        num = sum((x - ma) * (y - mb) for x, y in zip(a, b))
        return num / (sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b)) ** 0.5

    names = list(diffs)
    res = {"command": sys.argv, "runs": {n: {"rows": len(d), "mean": st.mean(d), "median": st.median(d),
                                             "share_of_rows_worse": sum(v > 0 for v in d) / len(d),
                                             "share_of_total_in_10_worst": sum(sorted(d, reverse=True)[:10]) / sum(d)}
                                         for n, d in diffs.items()},
           "correlation": {a: {b: corr(diffs[a], diffs[b]) for b in names} for a in names}}
    for n, r in res["runs"].items():
        print(f"{n}: mean {r['mean']:+.4f} median {r['median']:+.4f} rows worse {r['share_of_rows_worse']:.2f} "
              f"10 worst carry {r['share_of_total_in_10_worst']:.2f}")
    pairs = [res["correlation"][a][b] for i, a in enumerate(names) for b in names[i + 1:]]
    if pairs:
        print(f"per-row differences correlate {min(pairs):.2f} to {max(pairs):.2f} between runs")
    Path(out).write_text(json.dumps(res, indent=1))
    return 0


def main() -> int:
    if "--compare" in sys.argv:  # --compare F1 F2 ... --out OUT: the per-row reading of runs already made
        ap = argparse.ArgumentParser()
        ap.add_argument("--compare", nargs="+", required=True)
        ap.add_argument("--out", required=True)
        a = ap.parse_args()
        return compare(a.compare, a.out)
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--judge", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2.0906784646132948e-4, help="the H200 look-ahead's rate on this set-up")
    ap.add_argument("--alpha1", type=float, default=1.2910852417671376e-4, help="the H200's alpha1")
    ap.add_argument("--arms", default="constant,warmup,warmup5,warmup20,warmup_zero")
    ap.add_argument("--steps", type=int, default=90,
                    help="optimizer steps (the sweep experiment's 90; fewer only to smoke-test)")
    ap.add_argument("--order-seed", type=int, default=0,
                    help="0: the sweep experiment's order; K > 0: the same rows shuffled by K")
    ap.add_argument("--no-tf32", action="store_true", help="float32 matmuls on the GPU (TF32 off)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch

    from leadline.lookahead.rate.warmup import warmup_lr
    from leadline.stats import paired_difference

    lr, a1 = args.lr, args.alpha1
    schedules = {
        "constant": lambda t: lr,
        "warmup": lambda t: warmup_lr(t, lr, a1, 10),
        "warmup5": lambda t: warmup_lr(t, lr, a1, 5),
        "warmup20": lambda t: warmup_lr(t, lr, a1, 20),
        "warmup_zero": lambda t: lr * min(1.0, t / 10),
    }
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in schedules]
    if unknown:
        raise SystemExit(f"--arms: unknown {unknown}; pick from {sorted(schedules)}")
    s = R.Setup(argparse.Namespace(model=args.model, smoke=False))
    if args.no_tf32:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    steps, per_step = args.steps, 8
    raw = R.read_jsonl(Path(args.data_dir) / "gsm_symbolic_train.jsonl")
    random.Random(0).shuffle(raw)

    def enc(r):
        return R.encode(s.tok, r["question"] + "\n", r["answer_cot"], 256)

    train = [enc(r) for r in raw[: steps * per_step]]
    if args.order_seed:
        random.Random(args.order_seed).shuffle(train)
    judge = [enc(r) for r in R.read_jsonl(Path(args.data_dir) / "gsm_symbolic_test.jsonl")[: args.judge]]
    ts = R.make_train_step(s.model, train, per_step, s.pad, s.device)
    out: dict = {"benchmark": "warmup_cost", "command": sys.argv, "versions": R.versions(), "device": str(s.device),
                 "tf32": bool(s.device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32),
                 "threads": torch.get_num_threads(), "lr": lr, "alpha1": a1, "order_seed": args.order_seed, "arms": {}}
    for name in arms:
        t0 = time.perf_counter()
        opt = s.opt(s.full())
        R.train(opt, ts, steps, schedules[name])
        rows = R.row_losses(s.model, judge, s.pad, s.device)
        out["arms"][name] = {"loss": R.mean_se(rows), "rows": rows, "seconds": time.perf_counter() - t0}
        print(name, out["arms"][name]["loss"], flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
    a = out["arms"]
    if "constant" in a:
        out["versus_constant"] = {}
        for name in a:
            if name != "constant":
                d = paired_difference(a[name]["rows"], a["constant"]["rows"]).as_dict()
                d["the warmup costs"] = d["mean"] > 0 and d["p_two_sided"] < 0.05
                out["versus_constant"][name] = d
                print(f"{name} - constant: {d['mean']:+.4f} ± {d['se']:.4f} (p = {d['p_two_sided']:.3g})")
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
