"""``leadline gpu``: what this GPU really delivers, and whether its timings can be trusted.

Exit codes: 0 the timings can be trusted, 1 the verdict names what would make them lie,
2 no CUDA device (the virtualisation is still printed) or bad input.
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="the CUDA device (default: the current one)")
    p.add_argument("--plan", default=None,
                   help="a plan JSON whose t_micro / t_step / grad_accum values turn costs into shares of a step")
    p.add_argument("--launches-per-step", type=int, default=None,
                   help="kernel launches in one optimizer step, to judge launch latency as a share of it")
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (seconds instead of a minute)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def run(args: argparse.Namespace) -> int:
    from leadline.errors import LeadlineError
    from leadline.measure.gpu import measure_gpu, step_times_from_plan
    from leadline.measure.virt import virtualisation
    from leadline.plan import Plan

    plan = Plan.from_json(args.plan) if args.plan else None
    if not _has_cuda():
        v = virtualisation()
        print(json.dumps({"cuda": None, "virtualisation": v.to_dict()}, indent=1) if args.json else v.text())
        raise LeadlineError("there is no CUDA device here (torch sees none), so only the virtualisation above was "
                            "read; run leadline gpu on a machine with an NVIDIA GPU and a CUDA build of torch")
    if plan is not None and step_times_from_plan(plan) is None:
        print(f"leadline gpu: {args.plan} has no t_micro value, so costs are judged against raw thresholds, not shares "
              "of a step", file=sys.stderr)
    report = measure_gpu(
        args.device,
        plan=plan,
        launches_per_step=args.launches_per_step,
        quick=args.quick,
        on_progress=lambda m: print(f"leadline gpu: {m}", file=sys.stderr, flush=True),
    )
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.text())
    return 0 if report.trustworthy else 1
