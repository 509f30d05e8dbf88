"""``leadline train``: the reference run with a plan and the look-ahead schedule."""

from __future__ import annotations

import argparse
from pathlib import Path

from leadline.cli._common import add_model_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--plan", required=True, help="the plan `leadline derive --out` wrote for this model and data")
    p.add_argument("--out", required=True, metavar="DIR", help="where to save the adapter (or weights) and run.json")
    p.add_argument("--steps", type=int, metavar="N", help="optimizer steps (default: the plan's total_steps)")
    p.add_argument("--no-schedule", action="store_true", help="train at the plan's rate without the LookaheadSchedule (not advised)")


def run(args: argparse.Namespace) -> int:
    import sys

    from leadline.cli._common import load_for_training
    from leadline.errors import InputError
    from leadline.plan import Plan
    from leadline.run import train_with_plan

    plan = Plan.from_json(args.plan)
    if not Path(args.data).is_file():
        raise InputError(f"--data {args.data} does not exist; pass the jsonl the plan was derived on")
    if Path(args.out).exists() and any(Path(args.out).iterdir()):
        raise InputError(f"--out {args.out} exists and is not empty; choose a new folder")
    model, tok = load_for_training(args)

    def show(rec: dict) -> None:
        if rec["step"] % 10 == 0:
            print(f"step {rec['step']:5d}  loss {rec['loss']:.4f}  lr {rec['lr']:.3g}  {rec['seconds']:.1f}s", file=sys.stderr)

    res = train_with_plan(model, tok, args.data, plan, out_dir=args.out, total_steps=args.steps,
                          schedule=not args.no_schedule, on_step=show)
    rollbacks = sum(1 for c in (res.get("schedule") or {}).get("checks", []) if c.get("action") == "rollback")
    print(f"trained {res['steps']} steps in {res['seconds']:.1f} s; schedule rollbacks: {rollbacks}")
    if "test_loss_after" in res:
        b, a = res["test_loss_before"], res["test_loss_after"]
        print(f"test loss on {res['test_rows']} rows no decision used: {b['mean']:.4f} ± {b['se']:.4f} before, {a['mean']:.4f} ± {a['se']:.4f} after")
    print(f"saved to {args.out}")
    return 0
