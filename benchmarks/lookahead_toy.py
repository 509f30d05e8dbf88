"""The look-ahead on a CPU toy whose best constant rate falls with the run's length.

Noisy linear regression (64 inputs, 4 outputs, targets with unit noise, 8 rows a step, Adam,
w from zero): a higher rate learns faster and settles on a higher noise floor, so the best
constant rate for T steps falls as T grows — the effect the look-ahead's trend carry exists
for. Per T: a sweep of 12 constant rates 2^-k (k = 0..11), each run T steps, judged by the mean
held-out loss on 256 rows; then measure_first_step + lookahead_lr(total_steps=T)
from the same start, and a T-step run at its rate.

Decision rule, written before this file's first recorded run (an exploratory run of the same
code came first, with the same outcome):
  R1  at every T the look-ahead's rate is within 2x of the sweep's best grid rate.
Reported beside it, no pass/fail: the loss at the look-ahead's rate against the sweep's best,
and the horizons it read with their trend slopes. One seed; the toy is deterministic.

    PYTHONPATH=src python benchmarks/lookahead_toy.py --steps 90,400,1600 --out benchmarks/results/lookahead_toy_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="90,400,1600")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch

    from leadline.lookahead.rate import lookahead_lr, measure_first_step

    torch.set_num_threads(1)
    d, n, b = 64, 8192, 8
    g = torch.Generator().manual_seed(0)
    w_true = torch.randn(4, d, generator=g)
    x = torch.randn(n, d, generator=g)
    y = x @ w_true.T + torch.randn(n, 4, generator=g)
    xh = torch.randn(256, d, generator=g)
    yh = xh @ w_true.T + torch.randn(256, 4, generator=g)

    def setup() -> tuple[Any, Any, Any, Any]:
        w = torch.nn.Parameter(torch.zeros(4, d))
        opt = torch.optim.Adam([w], lr=1e-3)

        def train_step(t: int) -> float:
            i = (t * b) % n
            loss = ((x[i:i + b] @ w.T - y[i:i + b]) ** 2).mean()
            loss.backward()
            return float(loss.detach())

        def held() -> list[float]:
            with torch.no_grad():
                return [float(v) for v in ((xh @ w.T - yh) ** 2).mean(dim=1)]

        return w, opt, train_step, held

    def run(lr: float, steps: int) -> float:
        _w, opt, train_step, held = setup()
        for g_ in opt.param_groups:
            g_["lr"] = lr
        for t in range(steps):
            opt.zero_grad()
            train_step(t)
            opt.step()
        h = held()
        return sum(h) / len(h)

    result: dict[str, Any] = {
        "benchmark": "lookahead_toy", "command": " ".join(sys.argv),
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__},
        "rule": "R1: the look-ahead's rate within 2x of the sweep's best grid rate at every T", "runs": [],
    }
    t0 = time.perf_counter()
    for steps in (int(s) for s in args.steps.split(",")):
        sweep = [{"lr": 0.5 ** k, "loss": run(0.5 ** k, steps)} for k in range(12)]
        best = min(sweep, key=lambda r: r["loss"])
        w, opt, train_step, held = setup()
        fs = measure_first_step([w], opt, train_step, held)
        la = lookahead_lr([w], opt, train_step, held, fs, total_steps=steps)
        at = run(la.lr, steps)
        ratio = la.lr / best["lr"]
        result["runs"].append({
            "steps": steps, "sweep": sweep, "best_lr": best["lr"], "best_loss": best["loss"], "alpha1": fs.alpha1,
            "lookahead_lr": la.lr, "ratio_to_best": ratio, "loss_at_lookahead": at, "steps_used": la.steps_used,
            "stopped_because": la.stopped_because,
            "horizons": [{"steps": h["steps"], "best_lr": h["best_lr"], "estimate": h.get("estimate"), "trend_slope": h.get("trend_slope")}
                         for h in la.evidence()["horizons"]],
            "R1": 0.5 <= ratio <= 2.0,
        })
        print(f"T={steps}: best {best['lr']:.4g} ({best['loss']:.4f}); look-ahead {la.lr:.4g} ({ratio:.2f}x, {at:.4f}); R1 {0.5 <= ratio <= 2.0}", flush=True)
    result["seconds"] = time.perf_counter() - t0
    result["R1"] = all(r["R1"] for r in result["runs"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
