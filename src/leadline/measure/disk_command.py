"""``leadline disk FILES...``: read throughput per queue depth with the page cache bypassed."""

from __future__ import annotations

import argparse
import json
import sys


def _ints(text: str) -> list[int]:
    from leadline.errors import InputError

    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise InputError(f"--depths {text!r} is not a comma-separated list of positive integers; pass e.g. "
                         "1,2,3,4,6,8,16,32")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+",
                   help="files on the disk to measure (a quoted glob such as 'models/*.safetensors' is expanded; a "
                        "folder means the files in it)")
    p.add_argument("--depths", default="1,2,3,4,6,8,16,32",
                   help="queue depths (reader threads) to sweep, comma-separated (default: %(default)s)")
    p.add_argument("--block-mib", type=float, default=4.0, help="size of one read in MiB (default: %(default)s)")
    p.add_argument("--mib-per-depth", type=float, default=256.0,
                   help="MiB read at each depth in each round (default: %(default)s; at least two reads per reader)")
    p.add_argument("--rounds", type=int, default=3,
                   help="passes over the depths, ascending and descending in turn; each depth reports its median "
                        "(default: %(default)s)")
    p.add_argument("--buffered", action="store_true",
                   help="also sweep through the page cache, beside the real sweep, to show what a buffered benchmark "
                        "would claim")
    p.add_argument("--json", action="store_true", help="print the sweep as JSON")


def run(args: argparse.Namespace) -> int:
    from leadline.errors import InputError
    from leadline.measure.disk import disk_queue_depth

    if args.block_mib <= 0 or args.mib_per_depth <= 0:
        raise InputError("--block-mib and --mib-per-depth must be positive sizes in MiB")
    sweep = disk_queue_depth(
        args.files,
        depths=_ints(args.depths),
        block_bytes=int(args.block_mib * 2**20),
        bytes_per_depth=int(args.mib_per_depth * 2**20),
        rounds=args.rounds,
        buffered=args.buffered,
        on_progress=lambda m: print(f"leadline disk: {m}", file=sys.stderr, flush=True),
    )
    print(json.dumps(sweep.to_dict(), indent=1) if args.json else sweep.text())
    return 0
