"""The fit pre-flight's result: :class:`FitResult`, its verdicts, and the one sentence it reads as.

:class:`FitResult` holds what :func:`~leadline.memory.fit.measure_fit` measured at one shape
(the peak, the room, the allocator's retries, every step run), its verdict (one of
:data:`FIT_VERDICTS`) and the alternatives measured instead; :func:`fit_sentence` turns it
into the sentence naming the measured peak, the room and what would fit, and
:data:`LONG_RUN_DRIFT` is the margin a long run at the shape plans on above the measured peak.
Plain data and strings: no torch, no device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from leadline.memory.probe import Rung
from leadline.memory_readings import format_bytes
from leadline.plan import Value

FIT_VERDICTS = ("fits", "squeezed", "oom", "over", "too_large")

LONG_RUN_DRIFT = 0.02
"""How far a long run's peak allocated bytes may rise above the pre-flight's, as a share (a
constant, not measured per run): the caching allocator hands a reused block out whole when the
remainder is too small to split, so the same tensors' allocated total creeps up as a run's
lengths vary. Set from long runs whose peak rose above the pre-flight's (measured:
docs/memory.md). The verdict does not use it (on CUDA a verdict is a step that ran);
``run_peak_bytes`` does."""


@dataclass
class FitResult:
    """The pre-flight's measurement at one shape, its verdict and what would fit instead.

    Attributes:
        verdict: ``fits`` (ran ``repeats`` steps in a row, no retry); ``squeezed`` (ran only by
            the allocator emptying its cache and retrying); ``oom`` (refused at the cap);
            ``over`` (off CUDA: the peak, measured or extrapolated from one row, exceeds the
            RAM room); ``too_large`` (the estimate is more than ``max_over`` times the room:
            not run).
        peak_bytes, reserved_bytes, retries: the measurement (None when not run).
        room_bytes: free + held when it ran (the cap); estimate_bytes: the estimate, if any.
        rungs: every step run, the shape's own and the alternatives'.
        alternatives: ``{"what", "text", "fits", ...}`` measured alternatives, in order.

    Examples:
        >>> fit = FitResult(3, 512, "cuda:0", "fits", 5_900_000_000, peak_bytes=3_047_382_528,
        ...                 reserved_bytes=3_300_000_000)
        >>> fit.fits, fit.run_peak_bytes  # the peak + LONG_RUN_DRIFT (2%), rounded up
        (True, 3108330179)
        >>> print(fit.sentence)
        fits: a training step of 3 rows x 512 tokens measured a peak of 3.05 GB allocated (3.30 GB reserved, ...
        >>> print(FitResult(64, 128, "cpu", "too_large", 450_000_000, estimate_bytes=2 * 10**9).sentence)
        refused before running (nothing caps the host): a training step of 64 rows x 128 tokens would need ...
    """

    rows: int
    length: int
    device: str
    verdict: str
    room_bytes: int | None
    peak_bytes: int | None = None
    reserved_bytes: int | None = None
    retries: int = 0
    estimate_bytes: int | None = None
    max_over: float = 4.0
    seconds: float = 0.0
    rungs: list[Rung] = field(default_factory=list)
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    suggested: bool = False

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"

    @property
    def run_peak_bytes(self) -> int | None:
        """The peak a long run at this shape should plan on: the measured peak plus
        :data:`LONG_RUN_DRIFT` on CUDA (None when nothing ran); off CUDA the measured peak."""
        if self.peak_bytes is None:
            return None
        drift = LONG_RUN_DRIFT if self.device.startswith("cuda") else 0.0
        return int(-(-self.peak_bytes * (1.0 + drift) // 1))

    def add_alternative(self, what: str, text: str, fits: bool, **detail: object) -> None:
        """Record one alternative (``what``: rows, length, checkpointing, rank) for the sentence.

        Examples:
            >>> fit = FitResult(64, 128, "cpu", "over", 450_000_000, suggested=True)
            >>> fit.add_alternative("rows", "10 rows x 128 tokens (measured 443 MB)", True, rows=10)
            >>> fit.alternatives
            [{'what': 'rows', 'text': '10 rows x 128 tokens (measured 443 MB)', 'fits': True, 'rows': 10}]
        """
        self.alternatives.append({"what": what, "text": text, "fits": bool(fits), **detail})

    @property
    def sentence(self) -> str:
        return fit_sentence(self)

    def evidence(self) -> dict[str, Any]:
        return {"plot": "ramp", "budget_bytes": self.room_bytes, "rungs": [r.as_dict() for r in self.rungs],
                "verdict": self.verdict, "estimate_bytes": self.estimate_bytes, "alternatives": self.alternatives}

    def as_values(self) -> dict[str, Value]:
        """``fit_verdict`` and (when measured) ``fit_peak_bytes`` for the plan; on CUDA also
        ``fit_run_peak_bytes``. A verdict no step ran for (the estimate's, the scout's line) is
        ``derived``.

        Examples:
            >>> values = FitResult(64, 128, "cpu", "too_large", 450_000_000).as_values()
            >>> list(values), values["fit_verdict"].kind
            (['fit_verdict'], 'derived')
        """
        ran = any(g.phase == "fit" for g in self.rungs)  # else the verdict came from the estimate or the scout's line
        out = {"fit_verdict": Value(self.verdict, "measured" if ran else "derived", self.sentence, self.evidence(),
                                    self.seconds)}
        if self.peak_bytes is not None and ran:
            out["fit_peak_bytes"] = Value(self.peak_bytes, "measured",
                                          f"peak allocated bytes of a real training step of {self.rows} rows x "
                                          f"{self.length} tokens on {self.device}", None, 0.0, "bytes")
            if self.device.startswith("cuda"):
                out["fit_run_peak_bytes"] = Value(self.run_peak_bytes, "derived",
                                                  f"the measured peak {format_bytes(self.peak_bytes)} plus "
                                                  f"{LONG_RUN_DRIFT:.0%} for a long "
                                                  "run's allocator drift (a constant: 0.12-0.83% measured on the H200 "
                                                  "over 300 steps)",
                                                  None, 0.0, "bytes")
        return out

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rungs"] = [r.as_dict() for r in self.rungs]
        d["fits"] = self.fits
        d["run_peak_bytes"] = self.run_peak_bytes
        d["sentence"] = self.sentence
        return d


def _shape(rows: int, length: int) -> str:
    return f"{rows} row{'s' if rows != 1 else ''} x {length} tokens"


def fit_sentence(r: FitResult) -> str:
    """The one sentence for a :class:`FitResult`: the measured peak, the room, and what would fit.

    Examples:
        >>> from leadline.memory.probe import Rung
        >>> fit = FitResult(64, 128, "cpu", "over", 450_000_000, peak_bytes=605_000_000, suggested=True,
        ...                 rungs=[Rung(64, 128, 605_000_000, 605_000_000, 0, "fits", 1.2, "fit")])
        >>> fit.add_alternative("rows", "10 rows x 128 tokens (measured 443 MB)", True, rows=10)
        >>> import textwrap
        >>> print(textwrap.fill(fit_sentence(fit), 100))
        refused: a training step of 64 rows x 128 tokens peaked at 605 MB against 450 MB of RAM room on cpu;
        what would fit: 10 rows x 128 tokens (measured 443 MB) (not measured: gradient checkpointing or a
        lower LoRA rank)
    """
    shape, room = _shape(r.rows, r.length), format_bytes(r.room_bytes)
    if r.device.startswith("cuda"):
        measured = (f"measured a peak of {format_bytes(r.peak_bytes)} allocated ({format_bytes(r.reserved_bytes)} "
                    f"reserved, {r.retries} allocator retr{'y' if r.retries == 1 else 'ies'})")
    else:
        measured = f"measured a peak resident set of {format_bytes(r.peak_bytes)}"
    if r.verdict == "fits":
        run = (f"; a long run should plan on {format_bytes(r.run_peak_bytes)} (+{LONG_RUN_DRIFT:.0%}, the allocator's "
               "drift)"
               if r.device.startswith("cuda") and r.run_peak_bytes is not None else "")
        return f"fits: a training step of {shape} {measured} against {room} of room on {r.device}{run}"
    mixed = next((g for g in r.rungs if g.phase == "mix" and g.verdict != "fits"), None)
    if mixed is not None:
        what = ("ran out of memory" if mixed.verdict == "oom" else "ran only because the allocator emptied its cache "
                                                                   "and retried")
        head = (f"refused: a training step of {shape} ran twice at {r.length} tokens, then, through the corpus's "
                f"length mix, {what} at a step of {mixed.length} tokens ({r.retries} allocator "
                f"retr{'y' if r.retries == 1 else 'ies'}, "
                f"peak {format_bytes(r.peak_bytes)} allocated) against {room} of room on {r.device}")
    elif r.verdict == "too_large" and r.device.startswith("cuda"):
        head = (f"refused before touching the card: a training step of {shape} would need an estimated "
                f"{format_bytes(r.estimate_bytes)}, more than {r.max_over:g}x the {room} of room on {r.device}")
    elif r.verdict == "too_large":
        head = (f"refused before running (nothing caps the host): a training step of {shape} would need an "
                f"estimated {format_bytes(r.estimate_bytes)}, more than the {room} of RAM room on {r.device}")
    elif r.verdict == "squeezed":
        head = (f"refused: a training step of {shape} {measured} against {room} of room on {r.device}, and ran "
                f"only because the allocator emptied its cache and retried, which every step would repeat")
    elif r.verdict == "oom":
        head = (f"refused: a training step of {shape} ran out of memory at {room} of room on {r.device} "
                f"(the peak measured before the refusal: {format_bytes(r.peak_bytes)} allocated)")
    elif any(g.phase == "fit" for g in r.rungs):
        head = (f"refused: a training step of {shape} peaked at {format_bytes(r.peak_bytes)} against "
                f"{room} of RAM room on {r.device}")
    else:
        head = (f"refused: a training step of {shape} would peak near {format_bytes(r.peak_bytes)} "
                f"(extrapolated from {_scout_peak(r)}) against {room} of RAM room on {r.device}")
    return f"{head}; {_what_would_fit(r)}"


def _scout_peak(r: FitResult) -> str:
    scouts = [g for g in r.rungs if g.phase == "scout"]
    return " and ".join(f"{_shape(g.rows, g.length)} measured at {format_bytes(g.peak_bytes)}"
                        for g in scouts) or "no scout"


def _what_would_fit(r: FitResult) -> str:
    good = [a["text"] for a in r.alternatives if a["fits"]]
    bad = [a["text"] for a in r.alternatives if not a["fits"]]
    measured = {a["what"] for a in r.alternatives}
    untried = [t for w, t in (("checkpointing", "gradient checkpointing"), ("rank", "a lower LoRA rank"))
               if w not in measured]
    if not r.suggested:
        return "what would fit: fewer rows, a shorter length, " + _or(untried or ["a larger card"]) + " (not measured)"
    tail = ((f" (not measured: {_or(untried)})" if untried else "")
            + (f"; measured and still over: {', '.join(bad)}" if bad else ""))
    if good:
        return "what would fit: " + _or(good) + tail
    return "nothing measured fits" + (f" ({', '.join(bad)})" if bad else "") + (
        f"; try {_or(untried)}" if untried else "; try a larger card")


def _or(items: Sequence[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " or " + items[-1]
