"""``leadline quant``: not built yet in this version (see the issue that builds it)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from leadline.errors import LeadlineError

    raise LeadlineError("this command is not built in leadline 0.1.0 yet; see README.md for what is")
