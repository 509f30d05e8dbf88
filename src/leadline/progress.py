"""The progress display of a training run's steps on stderr: one tqdm bar when it is a terminal,
a line every few steps otherwise (:class:`StepBar`); :func:`wants_bar` tells a terminal apart.

The bar over derive()'s phases (``--effort full``) is the annex's
:class:`leadline.lookahead.progress.PhaseBar`.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


def wants_bar(stream: TextIO) -> bool:
    """True when ``stream`` is a terminal (False for one without ``isatty`` or already closed).

    Examples:
        >>> import io
        >>> wants_bar(io.StringIO())
        False
    """
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class StepBar:
    """``on_step`` for a training run: a tqdm bar of the steps with the loss and the rate on a
    terminal, else every ``every``-th step as one line (a log, a pipe, ``make demo``'s output).

    Examples:
        >>> import io
        >>> out = io.StringIO()
        >>> bar = StepBar(stream=out, every=2)
        >>> for s in range(3):
        ...     bar({"step": s, "loss": 1.0 / (s + 1), "lr": 0.0025, "seconds": 0.5 * s})
        >>> bar.close()
        >>> print(out.getvalue().strip())
        step     0  loss 1.0000  lr 0.0025  0.0s
        step     2  loss 0.3333  lr 0.0025  1.0s
    """

    def __init__(self, stream: TextIO | None = None, every: int = 10, total: int | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.every, self.total = every, total
        self.bar: Any = None
        self.terminal = wants_bar(self.stream)

    def __call__(self, rec: dict[str, Any]) -> None:
        if self.terminal:
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=self.total, initial=rec["step"], unit="step", file=self.stream,
                                dynamic_ncols=True, leave=True, desc="train")
            self.bar.set_postfix(loss=f"{rec['loss']:.4f}", lr=f"{rec['lr']:.3g}", refresh=False)
            self.bar.update(1)
        elif rec["step"] % self.every == 0:
            print(f"step {rec['step']:5d}  loss {rec['loss']:.4f}  lr {rec['lr']:.3g}  {rec['seconds']:.1f}s",
                  file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
