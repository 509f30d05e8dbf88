"""``leadline report plan.json [--html out.html] [--why NAME]``."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", help="a plan file written by `leadline derive --out` or plan.to_json(path)")
    p.add_argument("--html", metavar="OUT", help="also write the self-contained HTML report here")
    p.add_argument("--why", metavar="NAME", help="print the whole evidence behind one value")


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
