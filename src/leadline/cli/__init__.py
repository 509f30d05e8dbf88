"""The ``leadline`` command line.

Each subcommand lives in its own module (:data:`MODULES`: ``leadline.cli.<name>``, and the
measurement tools' own in :mod:`leadline.measure`) with two functions: ``add_arguments(parser)``
(light: no torch at import) and ``run(args) -> int``. This module only builds the parser and
turns a :class:`~leadline.errors.LeadlineError` into one sentence on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import threading
from collections.abc import Iterator, Sequence

from leadline._version import __version__
from leadline.errors import LeadlineError

COMMANDS: dict[str, str] = {
    "derive": "derive a plan: micro-batch, tokens per step, rate, warmup, ending, each with its evidence",
    "train": "a reference run with a plan and the look-ahead schedule",
    "run": "one load: the rate raced on the opening steps (or --lr), the run under the guard, the model kept",
    "fit": "measure whether a training shape fits the card (the real peak, not a prediction)",
    "report": "print a plan's values with their sources, or write its HTML report",
    "corpus": "profile a data set: rows, tokens read, scored tokens, the length",
    "gpu": "what this GPU really delivers: virtualisation, launch latency, bandwidth, matmul",
    "disk": "read throughput per queue depth with the page cache bypassed",
    "quant": "int8/int4 round-trip error per weight family of a model",
    "demo": "the main job on the embedded default model and data",
}
MODULES: dict[str, str] = {
    **{name: f"leadline.cli.{name}" for name in COMMANDS},
    **{tool: f"leadline.measure.{tool}_command" for tool in ("gpu", "disk", "quant")},
}
"""Each command's module: the measurement tools' commands are theirs, the rest the command line's."""


_SMALLER = ("pass a shorter --seq-len or --gradient-checkpointing (with LoRA on CUDA, --load-in-4bit too), or free "
            "memory")
"""What the default run (and derive) take to need less memory: flags ``--effort race`` accepts."""
OUT_OF_MEMORY_FIX = {
    "derive": _SMALLER,
    "train": "derive the plan again with a shorter --seq-len, or free memory",
    "run": _SMALLER,
    "fit": "pass a shorter --seq-len or a smaller --micro-batch",
}


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:160]


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad usage in one sentence and exits with code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message}; run `{self.prog} --help` for usage.\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="leadline",
        description="Fine-tuning hyperparameters sounded from your machine and your task, "
        "with the measurement printed next to every number.",
    )
    parser.add_argument("--version", action="version", version=f"leadline {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod = importlib.import_module(MODULES[name])
        mod.add_arguments(p)
        p.set_defaults(_run=MODULES[name])
    return parser


OUT_FOLDER_COMMANDS = ("derive", "train", "run", "demo")
"""The commands that write an ``--out`` folder: one that fails or is interrupted takes back what it
made there."""

EXIT_INTERRUPTED = 130
"""Ctrl-C (SIGINT): 128 + 2, as a shell reports it."""
EXIT_TERMINATED = 143
"""SIGTERM (``timeout``, a scheduler, a container's stop): 128 + 15, as a shell reports a process
the signal ended; the same path as Ctrl-C, so nothing half-written is left."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, as Ctrl-C raises KeyboardInterrupt."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` (a KeyboardInterrupt) while the command runs; the
    previous handler is put back after. Outside the main thread (no signals there) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    from leadline.cli._common import OutFolder

    out = OutFolder.before(getattr(args, "out", None) if args.command in OUT_FOLDER_COMMANDS else None)
    try:
        with _sigterm_as_interrupt():
            return int(importlib.import_module(args._run).run(args) or 0)
    except LeadlineError as e:
        out.take_back()
        print(f"leadline {args.command}: {e}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError, OSError) as e:
        from leadline.memory_readings import is_oom

        if not is_oom(e):
            raise
        out.take_back()
        print(f"leadline {args.command}: the machine ran out of memory ({_first_line(e)}); "
              f"{OUT_OF_MEMORY_FIX.get(args.command, 'free memory or choose a smaller shape')}; "
              "nothing half-written was kept.", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        out.take_back()
        how = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
        print(f"leadline {args.command}: {how}; nothing half-written was kept.", file=sys.stderr)
        return EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
