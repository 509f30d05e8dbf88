"""``leadline corpus DATA --tokenizer PATH_OR_GGUF [--seq-len N | --quantile Q] [--json]``.

Prints the corpus profile: rows, tokens read, scored tokens, the length, the loss policy.
Writes nothing.
"""

from __future__ import annotations

import argparse

from leadline.cli._common import add_field_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data",
                   help="a JSON Lines file: text, prompt/completion, messages, input_ids/labels, instruction/output or "
                        "question/answer rows")
    p.add_argument("--tokenizer", metavar="PATH_OR_GGUF",
                   help="the tokenizer the run trains with: a Hugging Face folder or a .gguf file (not needed for "
                        "input_ids rows; default: none)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--seq-len", type=int, metavar="N", help="the length to train at (default: the longest row)")
    length.add_argument("--quantile", type=float, metavar="Q",
                        help="the length that keeps this share of rows whole, e.g. 0.99; reports what truncation cuts "
                        "(default: none)")
    add_field_argument(p)
    p.add_argument("--bad-rows", choices=("raise", "report", "skip"), default="raise",
                   help="stop at the first bad row (raise), list them all (report) or drop them (skip); default "
                   "%(default)s")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from leadline.cli._common import fields_of
    from leadline.corpus import profile_corpus

    fields = fields_of(args)
    tokenizer = None
    if args.tokenizer:
        from leadline.hf.loading import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)
    bar = _progress()
    try:
        profile = profile_corpus(args.data, tokenizer, seq_len=args.seq_len, quantile=args.quantile,
                                 fields=fields, bad_rows=args.bad_rows, on_progress=bar)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print(json.dumps(profile.to_dict(), indent=1))
    else:
        print(profile.describe())
    sys.stdout.flush()
    from leadline.corpus import data_notes

    for note in data_notes(profile):  # what a run at this length changes in the rows
        print(f"leadline corpus: note: {note}", file=sys.stderr)
    return 0


class _Bar:
    """Bytes read, on stderr, when it is a terminal (tqdm, where installed)."""

    def __init__(self) -> None:
        from tqdm import tqdm

        self.bar = tqdm(unit="B", unit_scale=True, desc="profiling", leave=False)
        self.done = 0

    def __call__(self, reader: object) -> None:
        total = getattr(reader, "bytes_total", 0)
        if total and self.bar.total != total:
            self.bar.total = total
        read = getattr(reader, "bytes_read", 0)
        self.bar.update(read - self.done)
        self.done = read

    def close(self) -> None:
        self.bar.close()


def _progress() -> _Bar | None:
    import sys

    if not sys.stderr.isatty():
        return None
    try:
        return _Bar()
    except ImportError:
        return None
