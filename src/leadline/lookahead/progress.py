"""The progress display of derive()'s phases: one tqdm bar on stderr when it is a terminal, one
line a finished phase otherwise (``[  5.2 s]  2/10 noise: done (noise_scale_tokens=2.02)``).

A phase's summary is its numbers at 3 significant digits; the total is the number of phases
derive() will call (its first event says which), and the bar ends full.

    bar = PhaseBar()
    plan = derive(..., on_progress=bar)
    bar.close()
"""

from __future__ import annotations

import math
import sys
from typing import Any, TextIO

from leadline.progress import wants_bar

TEXT_CHARS = 60


def sig3(x: object) -> str:
    """``x`` at 3 significant digits (ints with separators below 1e6, floats 1.23e-04 style
    outside [1e-3, 1e5)); lists as a tuple; anything else as text.

    Examples:
        >>> sig3(12345), sig3(2_500_000), sig3(2.0213), sig3(0.000457), sig3(123456.0), sig3([1, 0.5])
        ('12,345', '2.5e+06', '2.02', '4.57e-04', '1.23e+05', '(1, 0.5)')
    """
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}" if abs(x) < 1_000_000 else f"{x:.3g}"
    if isinstance(x, float):
        if not math.isfinite(x) or x == 0:
            return "0" if x == 0 else str(x)
        if 1e-3 <= abs(x) < 1e5:
            s = f"{x:.3g}"
            return s if "e" not in s else f"{x:.0f}"
        return f"{x:.2e}"
    if isinstance(x, (list, tuple)):
        return "(" + ", ".join(sig3(v) for v in x) + ")"
    return str(x)


def summary(values: dict[str, Any]) -> str:
    """``name=value`` pairs at 3 significant digits, lists and dicts left out.

    Examples:
        >>> summary({"noise_scale_tokens": 2.0213, "micro_batch": 8, "draws": [1, 2]})
        'noise_scale_tokens=2.02, micro_batch=8'
    """
    return ", ".join(f"{k}={sig3(v)}" for k, v in values.items() if not isinstance(v, (list, tuple, dict)))


def reformat(text: str) -> str:
    """A runner's ``name=value; name=value`` summary with its numbers at 3 significant digits;
    parts without ``=`` are kept as they are.

    Examples:
        >>> reformat("b_noise=2021.3; draws=12; settled")
        'b_noise=2021, draws=12, settled'
    """
    out = []
    for part in text.split(";"):
        name, eq, raw = part.strip().partition("=")
        if not eq:
            out.append(part.strip())
            continue
        try:
            num: Any = int(raw) if raw.strip().lstrip("-").isdigit() else float(raw)
        except ValueError:
            num = raw
        out.append(f"{name}={sig3(num)}")
    return ", ".join(p for p in out if p)


def clip(text: str, chars: int = TEXT_CHARS) -> str:
    """``text`` cut at a word boundary to at most ``chars`` characters, with an ellipsis when cut.

    Examples:
        >>> clip("the look-ahead read five rates over three horizons", 40), clip("short")
        ('the look-ahead read five rates over…', 'short')
    """
    if len(text) <= chars:
        return text
    cut = text[: chars - 1]
    if " " in cut:
        cut = cut.rsplit(" ", 1)[0].rstrip(",;:")
    return cut + "…"


class PhaseBar:
    """``on_progress`` for derive(): a tqdm bar over the phases on a terminal, one line a
    finished phase otherwise (or nothing with ``quiet``).

    The first event carries ``phases`` (the names derive() will call: the total); a phase's
    ``done`` carries ``values`` (its numbers) or ``summary`` (a sentence).

    Examples:
        >>> import io
        >>> out = io.StringIO()  # not a terminal: one line a finished phase
        >>> bar = PhaseBar(out)
        >>> bar({"phase": "ramp", "status": "start", "phases": ["ramp", "noise"]})
        >>> bar({"phase": "ramp", "status": "done", "values": {"micro_batch": 8}, "elapsed_s": 3.2})
        >>> bar({"phase": "noise", "status": "skipped", "reason": "out of time", "elapsed_s": 5.4})
        >>> bar.close()
        >>> print(out.getvalue(), end="")
        [   3.2 s] 1/2 ramp: done (micro_batch=8)
        [   5.4 s] 2/2 noise: skipped — out of time
    """

    def __init__(self, stream: TextIO | None = None, *, bar: bool | None = None, quiet: bool = False) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.total = 0
        self.seen: list[str] = []
        self.bar: Any = None
        if not quiet and (wants_bar(self.stream) if bar is None else bar):
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=None, unit="phase", file=self.stream, dynamic_ncols=True, leave=True,
                                bar_format="{desc} |{bar}| {n_fmt}/{total_fmt} phases [{elapsed}]")
            except ImportError:
                self.bar = None

    def text(self, ev: dict[str, Any]) -> str:
        """One event as a line: ``phase: status (numbers) — reason``, or ``phase: measuring``.

        Examples:
            >>> bar = PhaseBar(quiet=True)
            >>> bar.text({"phase": "noise", "status": "start"})
            'noise: measuring'
            >>> bar.text({"phase": "noise", "status": "done", "summary": "b_noise=2021.3"})
            'noise: done (b_noise=2021)'
        """
        status, phase = ev.get("status"), ev.get("phase")
        if isinstance(ev.get("values"), dict) and ev["values"]:
            detail = summary(ev["values"])
        else:
            detail = reformat(str(ev.get("summary") or ""))
        reason = f" — {ev['reason']}" if ev.get("reason") else ""
        if status == "start":
            return f"{phase}: measuring"
        return f"{phase}: {status}" + (f" ({detail})" if detail else "") + reason

    def __call__(self, ev: dict[str, Any]) -> None:
        """Take one of derive()'s progress events: move the bar, or print a finished phase."""
        if self.quiet:
            return
        phases = ev.get("phases")
        if isinstance(phases, (list, tuple)):
            self.total = max(self.total, len(phases))
        phase, status = ev.get("phase"), ev.get("status")
        finished = status in ("done", "skipped", "resumed")
        if finished and phase not in self.seen:
            self.seen.append(phase)
        self.total = max(self.total, len(self.seen))
        text = self.text(ev)
        if self.bar is not None:
            if self.total and self.bar.total != self.total:
                self.bar.total = self.total
            self.bar.set_description_str(clip(text), refresh=False)
            if finished:
                self.bar.update(1)
            else:
                self.bar.refresh()
        elif finished:
            width = len(str(self.total))
            count = f"{len(self.seen):>{width}}/{self.total} "
            print(f"[{float(ev.get('elapsed_s') or 0):6.1f} s] {count}{text}", file=self.stream, flush=True)

    def close(self) -> None:
        """End the bar full: its total is the phases that ran (done, skipped or resumed)."""
        if self.bar is not None:
            self.bar.total = len(self.seen)
            self.bar.n = len(self.seen)
            self.bar.set_description_str("derive: done", refresh=False)
            self.bar.refresh()
            self.bar.close()
            self.bar = None
