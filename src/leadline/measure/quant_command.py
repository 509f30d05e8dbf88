"""``leadline quant MODEL``: int8/int4 round-trip error per weight family of a model."""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a .safetensors file, a folder of them, or a .gguf file")
    p.add_argument("--layers", default=None,
                   help="layer indices, comma-separated, or 'all' (default: the first, middle and last)")
    p.add_argument("--group", type=int, default=64, help="values per quantization group (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from leadline.errors import InputError
    from leadline.measure.quant import quant_error

    layers: list[int] | str | None = None
    if args.layers is not None:
        if args.layers.strip() == "all":
            layers = "all"
        else:
            try:
                layers = [int(x) for x in args.layers.split(",") if x.strip()]
            except ValueError:
                raise InputError(f"--layers {args.layers!r} is not a comma-separated list of layer indices or 'all'; "
                                 "pass e.g. 0,15,29") from None
    report = quant_error(
        args.model,
        layers=layers,
        group=args.group,
        on_progress=lambda m: print(f"leadline quant: {m}", file=sys.stderr, flush=True),
    )
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.text())
    return 0
