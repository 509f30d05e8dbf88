"""``leadline report PLAN [--html report.html] [--why NAME | --long]``; PLAN a plan's folder or file."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from leadline.plan import COLUMNS, Plan


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", help="a plan: the folder `leadline derive --out DIR` or `leadline run --out DIR` wrote, "
                   "or a plan file (DIR/plan.json, plan.to_json(path))")
    p.add_argument("--html", metavar="PATH", help="also write the self-contained HTML report to PATH (default: none)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--why", metavar="NAME", help="print one value's sentence and the whole evidence behind it "
                   "(default: none; the table)")
    g.add_argument("--long", action="store_true",
                   help="print every value with its whole sentence (default: the table of numbers, kinds and units)")


def run(args: argparse.Namespace) -> int:
    from leadline.cli._common import check_out_file, read_plan

    check_out_file("--html", args.html)
    plan = read_plan("plan", args.plan)
    if args.why is not None:
        check_why(args.why, plan, args.plan)
        print(plan.why(args.why, width=COLUMNS - 1))
    else:
        print(plan.report(long=args.long, path=shlex.quote(str(args.plan))))
    if args.html:
        from leadline.report.html import write_html

        path = write_html(plan, args.html, run=run_record(args.plan))
        print(f"wrote {path}")
    return 0


def run_record(plan_path: str) -> dict[str, Any] | None:
    """The run's record, ``run.json`` beside the plan (``leadline run --out DIR`` writes both), for
    its training curve; None where there is none or it does not read as a record."""
    import json

    from leadline.cli._common import plan_file

    path = plan_file("plan", plan_path).parent / "run.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def check_why(name: str, plan: Plan, path: str) -> None:
    """One sentence naming the value asked for, the closest names and every name the plan has,
    when ``--why NAME`` is not one of its values."""
    import difflib

    from leadline.errors import InputError

    names = list(plan)
    if name in names:
        return
    close = difflib.get_close_matches(name, names, n=2)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    known = ", ".join(names) if names else "none (the plan holds no values)"
    raise InputError(f"--why {name}: the plan {path} has no value of that name{hint}; pass one of: {known}")

