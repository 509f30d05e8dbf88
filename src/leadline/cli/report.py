"""``leadline report PLAN [--html report.html] [--why NAME]``; PLAN a plan's folder or file."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", help="a plan: the folder `leadline derive --out DIR` or `leadline run --out DIR` wrote, "
                   "or a plan file (DIR/plan.json, plan.to_json(path))")
    p.add_argument("--html", metavar="PATH", help="also write the self-contained HTML report to PATH (default: none)")
    p.add_argument("--why", metavar="NAME", help="print the whole evidence behind one value (default: the plan's "
                   "values, each with its source)")


def run(args: argparse.Namespace) -> int:
    from leadline.cli._common import check_out_file, read_plan

    check_out_file("--html", args.html)
    plan = read_plan("plan", args.plan)
    if args.why:
        if args.why not in plan:
            from leadline.errors import InputError

            raise InputError(f"the plan {args.plan} has no value {args.why!r}; it has: {', '.join(plan) or 'none'}")
        print(plan.why(args.why))
    else:
        print(plan.report())
    if args.html:
        from leadline.report.html import write_html

        path = write_html(plan, args.html)
        print(f"wrote {path}")
    return 0
