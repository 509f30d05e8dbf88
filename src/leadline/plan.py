"""The plan and its provenance: every number with its kind, its source and its evidence.

A :class:`Value` cannot be built without a source sentence. A :class:`Plan` is an ordered
set of named values plus the record of where they were measured (machine, model, data,
leadline's version) and the rows derive() held out. Prose is rendered from the structure,
never the other way round, and the JSON form round-trips exactly.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from leadline._io import write_atomic
from leadline._version import __version__
from leadline.errors import InputError

KINDS = ("measured", "derived", "constant", "given")
"""measured on this machine; derived by a stated formula from measured values; a constant
nobody measured here; given by the user."""

PLAN_FORMAT = 1


def _jsonable(obj: Any, what: str) -> Any:
    """Normalise ``obj`` to what JSON gives back (tuples become lists), or say why it cannot."""
    try:
        return json.loads(json.dumps(obj, allow_nan=True))
    except (TypeError, ValueError) as e:
        raise InputError(f"{what} must be JSON data (numbers, strings, lists, dicts): {e}") from None


@dataclass(frozen=True)
class Value:
    """One number of a plan and what produced it.

    Args:
        value: the number (or a short string/list where the quantity is one, e.g. betas).
        kind: one of ``measured``, ``derived``, ``constant``, ``given``.
        source: one sentence saying where the number came from; never empty.
        evidence: the measurement as structured JSON data (rungs, draws, candidates).
            A dict with a ``"plot"`` key is drawn by the HTML report (see docs/evidence.md).
        seconds: what producing the number cost, wall-clock.
        unit: the unit, where the name does not say it.

    Examples:
        >>> v = Value(16, "measured", "the ramp's kept micro-batch", unit="rows")
        >>> v.value, v.kind, v.unit
        (16, 'measured', 'rows')
        >>> Value(16, "guessed", "nobody knows")
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: Value kind 'guessed' is not one of measured, derived, constant, given; ...
    """

    value: Any
    kind: str
    source: str
    evidence: Any = None
    seconds: float = 0.0
    unit: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"Value kind {self.kind!r} is not one of {', '.join(KINDS)}; pick the one that says where "
                             "the number came from")
        if not isinstance(self.source, str) or not self.source.strip():
            raise InputError("a Value needs a source sentence saying where its number came from; pass source='...'")
        seconds = float(self.seconds)
        if not math.isfinite(seconds) or seconds < 0:
            raise InputError(f"Value seconds must be a finite number >= 0, got {self.seconds!r}")
        object.__setattr__(self, "seconds", seconds)
        object.__setattr__(self, "value", _jsonable(self.value, "a Value's value"))
        object.__setattr__(self, "evidence", _jsonable(self.evidence, "a Value's evidence"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "kind": self.kind,
            "source": self.source,
            "evidence": self.evidence,
            "seconds": self.seconds,
            "unit": self.unit,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Value:
        return cls(
            value=d["value"],
            kind=d["kind"],
            source=d["source"],
            evidence=d.get("evidence"),
            seconds=d.get("seconds", 0.0),
            unit=d.get("unit"),
        )

    def line(self, name: str) -> str:
        """``name = number unit  [kind] source`` — the long report's line for this value."""
        text = self.words() if isinstance(self.value, dict) else self.text()
        return f"{name} = {text}  [{self.kind}] {self.source}"

    def words(self) -> str:
        """The number as a sentence shows it: a dict in words (:func:`readable`), the rest as
        :func:`format_number` writes it.

        Examples:
            >>> Value({"dtype": "float32", "quantization": None, "compute_dtype": "float32",
            ...        "checkpointing": False}, "given", "the model as it trains").words()
            'float32, no quantization, gradient checkpointing off'
        """
        return readable(self.value) if isinstance(self.value, dict) else format_number(self.value)

    def text(self) -> str:
        """The number with its unit as the table shows it: ``1 row`` for one of a plural unit,
        ``not resolved`` for None, a dict as ``key value`` pairs.

        Examples:
            >>> Value(1, "derived", "the step", unit="rows").text(), Value(0.000227, "measured", "a race",
            ...                                                               unit="per step").text()
            ('1 row', '0.000227 per step')
            >>> Value(None, "derived", "no phase resolved it").text()
            'not resolved'
            >>> Value({"dtype": "float32", "adapter": True, "quantization": None}, "given", "the model").text()
            'dtype float32, adapter on, quantization none'
        """
        if self.value is None:
            return "not resolved"
        if isinstance(self.value, dict):
            return ", ".join(f"{k} {_setting(v)}" for k, v in self.value.items())
        text = format_number(self.value)
        if self.unit:
            unit = self.unit
            if self.value == 1 and unit.endswith("s") and unit != "s" and not unit.startswith("per "):
                unit = unit[:-1]
            text += f" {unit}"
        return text


def _setting(x: Any) -> str:
    """One setting of a dict as the table shows it: on/off for a flag, ``none`` for None."""
    if isinstance(x, bool):
        return "on" if x else "off"
    return "none" if x is None else format_number(x)


_SETTING_WORDS = {"checkpointing": "gradient checkpointing"}


def readable(obj: object) -> str:
    """A dict (or list) value in words, never Python's repr: the precision a model trains in
    reads ``float32, no quantization, gradient checkpointing off``; any other key reads
    ``key value`` (a flag ``key on``/``off``, None ``no key``).

    Examples:
        >>> readable({"dtype": "bfloat16", "quantization": "4-bit nf4", "compute_dtype": "float32",
        ...           "checkpointing": True, "adapter": True})
        'bfloat16, 4-bit nf4 quantization, computing in float32, gradient checkpointing on, a LoRA adapter'
        >>> readable({"kept": "decay", "steps": 12, "average": None, "halved": False, "at": [1, 2]})
        'kept decay, steps 12, no average, halved off, at (1, 2)'
        >>> readable({"adapter": False})
        'every weight trained'
    """
    if isinstance(obj, list):
        return "(" + ", ".join(readable(v) for v in obj) + ")"
    if not isinstance(obj, dict):
        return format_number(obj)
    parts = []
    for k, v in obj.items():
        key = str(k).replace("_", " ")
        if k == "dtype" and isinstance(v, str):
            parts.append(v)
        elif k == "compute_dtype":
            if v != obj.get("dtype"):
                parts.append(f"computing in {v}")
        elif k == "quantization":
            parts.append(f"{v} quantization" if v else "no quantization")
        elif k == "adapter" and isinstance(v, bool):
            parts.append("a LoRA adapter" if v else "every weight trained")
        elif isinstance(v, bool):
            parts.append(f"{_SETTING_WORDS.get(str(k), key)} {'on' if v else 'off'}")
        elif v is None:
            parts.append(f"no {key}")
        else:
            parts.append(f"{key} {readable(v)}")
    return ", ".join(parts)


def _rounded(obj: Any) -> Any:
    """Floats to 4 significant digits, inside lists and dicts too (for display)."""
    if isinstance(obj, float) and math.isfinite(obj):
        return float(f"{obj:.4g}")
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    return obj


def _json_lines(obj: Any, width: int, indent: str = "", lead: int = 0) -> str:
    """``obj`` as JSON, each list or dict on one line where it fits in ``width`` columns (after
    ``indent`` and the ``lead`` characters of its key) and opened a level deeper where it does not.

    Examples:
        >>> print(_json_lines({"rungs": [{"rows": 4, "verdict": "fits"}, {"rows": 8, "verdict": "oom"}]}, 40))
        {
          "rungs": [
            {"rows": 4, "verdict": "fits"},
            {"rows": 8, "verdict": "oom"}
          ]
        }
    """
    flat = json.dumps(obj, allow_nan=True)
    if len(indent) + lead + len(flat) + 1 <= width or not isinstance(obj, (dict, list)) or not obj:
        return flat
    inner = indent + "  "
    if isinstance(obj, dict):
        items = [f"{inner}{json.dumps(k)}: {_json_lines(v, width, inner, len(json.dumps(k)) + 2)}"
                 for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    items = [inner + _json_lines(v, width, inner) for v in obj]
    return "[\n" + ",\n".join(items) + f"\n{indent}]"


def format_number(x: object) -> str:
    """Numbers as a person reads them: ints with separators, floats to 3-4 significant digits."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        if x == 0:
            return "0"
        if abs(x) >= 1e5 or abs(x) < 1e-3:
            return f"{x:.3g}"
        return f"{x:.4g}"
    if isinstance(x, list):
        return "(" + ", ".join(format_number(v) for v in x) + ")"
    return str(x)


SkipReason = Literal["needs", "not_reached", "cut"]
"""Why a phase of derive() left no values: a value it needs is missing, max_seconds was spent
before it started, max_seconds cut it while it ran (its state restored)."""


@dataclass(frozen=True)
class Skipped:
    """A phase of derive() that left no values, and why (``plan.skipped``).

    Args:
        phase: the phase's name (``"rate"``, ``"first_step"``, ...).
        reason: one of :data:`SkipReason`.
        needs: the values it needed and did not have (reason ``"needs"``).
        max_seconds: the bound that stopped it (reasons ``"not_reached"`` and ``"cut"``).
        seconds: how long it ran before the cut (reason ``"cut"``).

    Examples:
        >>> Skipped("rate", "not_reached", max_seconds=30.0).sentence()
        'rate: not reached within max_seconds=30'
        >>> Skipped("step", "needs", needs=("rows_fit",)).out_of_time
        False
    """

    phase: str
    reason: SkipReason
    needs: tuple[str, ...] = ()
    max_seconds: float | None = None
    seconds: float = 0.0

    @property
    def out_of_time(self) -> bool:
        """True when max_seconds, not a missing value, stopped the phase."""
        return self.reason != "needs"

    def sentence(self) -> str:
        """The note shown for it."""
        if self.reason == "needs":
            return (f"{self.phase}: not run, it needs {', '.join(self.needs)}, which no earlier phase produced "
                    "or resolved")
        if self.reason == "not_reached":
            return f"{self.phase}: not reached within max_seconds={self.max_seconds:g}"
        return (f"{self.phase}: cut by max_seconds={self.max_seconds:g} after {self.seconds:.1f} s of it; "
                "its state was restored")

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "reason": self.reason, "needs": list(self.needs),
                "max_seconds": self.max_seconds, "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Skipped:
        return cls(str(d["phase"]), d["reason"], tuple(d.get("needs") or ()), d.get("max_seconds"),
                   float(d.get("seconds") or 0.0))


PhaseStatus = Literal["done", "resumed", "needs", "not_reached", "cut"]
"""What became of a phase: it ran, its values came back from a resume file, or a
:data:`SkipReason` stopped it."""


RUN_PHASES = ("run", "guard")
"""The phases that are the run's own work (its steps; the guard's checks and verdict), not derive's."""


@dataclass(frozen=True)
class PhaseTime:
    """Where derive()'s seconds went: one phase, its seconds, the optimizer steps it took on the
    run's rows, and the plan's training numbers its answer moved (``plan.phases``).

    Args:
        phase: the phase's name.
        seconds: its wall time, from its start to its values in the plan.
        steps: the run's training steps it took (forward, backward and an optimizer update on the
            run's rows, through ``train_step_of``); the ramp's and the probe's are not steps.
        changed: the training numbers (:data:`TRAINING_NUMBERS`) that differ after it from before
            it, where the rate before it is the one the plan would fall back to; empty for a phase
            whose answer moved none (one that only feeds a later phase, or that confirmed it).
        status: what became of it, one of :data:`PhaseStatus`.
        step_seconds: the seconds of those steps.
        reads / read_seconds: the held-out reads it made (each a forward over the held-out rows)
            and their seconds; what is left of ``seconds`` is the rest (the ramp's rungs, the
            noise probe's draws, copies and the bookkeeping).

    Examples:
        >>> PhaseTime("past_format", 12.5, 61, ()).row()
        'past_format    12.5 s      61 steps  changed nothing'
        >>> print(PhaseTime("rate", 28.6, 80, ("lr",), step_seconds=20.1, reads=45, read_seconds=7.9).row())
        rate           28.6 s      80 steps  changed lr
                        of it: steps 20.1 s, 45 held-out reads 7.9 s, the rest 0.6 s
    """

    phase: str
    seconds: float
    steps: int = 0
    changed: tuple[str, ...] = ()
    status: PhaseStatus = "done"
    step_seconds: float = 0.0
    reads: int = 0
    read_seconds: float = 0.0

    def row(self) -> str:
        """The phase's line in :meth:`Plan.phase_table`."""
        what = f"changed {', '.join(self.changed)}" if self.changed else "changed nothing"
        if self.status != "done":
            what += f" ({self.status.replace('_', ' ')})"
        line = f"{self.phase:<12} {self.seconds:6.1f} s  {self.steps:6d} steps  {what}"
        if self.step_seconds or self.reads:  # a plan written without the breakdown shows none, else a line below
            rest = max(0.0, self.seconds - self.step_seconds - self.read_seconds)
            line += (f"\n{'':<16}of it: steps {self.step_seconds:.1f} s, {self.reads} held-out reads "
                     f"{self.read_seconds:.1f} s, the rest {rest:.1f} s")
        return line

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "seconds": self.seconds, "steps": self.steps, "changed": list(self.changed),
                "status": self.status, "step_seconds": self.step_seconds, "reads": self.reads,
                "read_seconds": self.read_seconds}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PhaseTime:
        return cls(str(d["phase"]), float(d.get("seconds") or 0.0), int(d.get("steps") or 0),
                   tuple(d.get("changed") or ()), d.get("status", "done"), float(d.get("step_seconds") or 0.0),
                   int(d.get("reads") or 0), float(d.get("read_seconds") or 0.0))


TRAINING_NUMBERS = ("micro_batch", "grad_accum", "tokens_per_step", "lr", "warmup_steps", "total_steps")
"""The numbers a run trains with; :class:`PhaseTime` says which of them a phase moved."""

DECIDED_BY = {"lr": "rate", "micro_batch": "memory"}
"""The phase that decides a value, where the phase's answer may leave it where it was (a race
that kept the default rate moved nothing, yet it decided it)."""

TRAIN_WITH = (*TRAINING_NUMBERS, "ending", "seq_len", "weight_decay")
"""The numbers a run trains with, in the order a person reads them: the first lines of
:meth:`Plan.table` (the HTML report's summary card shows the same)."""

COLUMNS = 100
"""The terminal's width: every line of :meth:`Plan.table` is shorter."""

NUMBER_COLUMNS = 36
"""The widest number (with its unit) :meth:`Plan.table` shows whole; a wider one, a list or a
dict, is cut after its last whole item with ``…`` (``leadline report --why NAME`` shows it)."""


@dataclass
class Plan:
    """The derived hyperparameters, each a :class:`Value`, and the record of where they came from.

    ``plan.micro_batch`` is the number, ``plan["micro_batch"]`` the :class:`Value`.

    Attributes:
        values: name -> Value, in the order the phases produced them.
        machine, model, data: what the plan was measured on (see :mod:`leadline.provenance`).
        held_out: the rows derive() split off, as data: ``{"train": [...], "held_out": [...],
            "test": [...]}`` row indices into the corpus.
        notes: phase-level remarks (what a time budget did not reach, a fallback taken).
        skipped: the phases that left no values, each a :class:`Skipped` (its sentence is in
            ``notes`` too).
        phases: where derive()'s seconds went, a :class:`PhaseTime` per phase in the order run.
        derive_seconds: derive()'s wall time, from its call to its return (None: not derived).
        version: the leadline version that made it.
        created: seconds since the epoch.
        prepared: in the process that made the plan, the rows ``derive_for``'s race tokenized and
            split, which ``train_with_plan`` reuses instead of preparing them again; not in the JSON.

    Examples:
        >>> plan = Plan()
        >>> plan.set("micro_batch", Value(8, "measured", "the ramp's kept micro-batch", unit="rows"))
        >>> plan.set("weight_decay", Value(0.0, "constant", "0 by argument, not measured here"))
        >>> plan.micro_batch, plan["micro_batch"].kind, list(plan.constants())
        (8, 'measured', ['weight_decay'])
        >>> Plan.from_json(plan.to_json()).micro_batch
        8
    """

    values: dict[str, Value] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    held_out: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    phases: list[PhaseTime] = field(default_factory=list)
    derive_seconds: float | None = None
    version: str = __version__
    created: float = field(default_factory=time.time)
    prepared: Any = field(default=None, repr=False, compare=False)
    """The rows the plan's race prepared, kept in this process for the run that follows (never written)."""

    # ---- access -------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        # Only called when normal attribute lookup fails: the plan's values by name.
        values = self.__dict__.get("values")
        if values is not None and name in values:
            return values[name].value
        known = ", ".join(values) if values else "none yet"
        raise AttributeError(f"the plan has no value {name!r}; it has: {known}")

    def __getitem__(self, name: str) -> Value:
        try:
            return self.values[name]
        except KeyError:
            known = ", ".join(self.values) or "none yet"
            raise KeyError(f"the plan has no value {name!r}; it has: {known}") from None

    def __contains__(self, name: object) -> bool:
        return name in self.values

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def set(self, name: str, value: Value) -> None:
        """Add or replace one value (the phases call this)."""
        if not isinstance(value, Value):
            raise InputError(f"plan.set({name!r}, ...) needs a leadline.Value, got {type(value).__name__}")
        self.values[name] = value

    def get(self, name: str, default: Any = None) -> Any:
        """The number of ``name``, or ``default`` when the plan has none."""
        return self.values[name].value if name in self.values else default

    # ---- prose from the structure -------------------------------------------------------
    def report(self, *, long: bool = True, path: str = "PLAN") -> str:
        """The plan in words. ``long`` (the default): one line per value with its whole sentence,
        then the constants together, the notes and where derive's seconds went. ``long=False``:
        the terminal's form, :meth:`table` (``path`` names the plan file in its last line), then
        the same constants, notes (wrapped to :data:`COLUMNS`) and seconds.

        Examples:
            >>> plan = Plan()
            >>> plan.set("lr", Value(0.000227, "measured", "won a race of 5 rates", unit="per step"))
            >>> print(plan.report())
            lr = 0.000227 per step  [measured] won a race of 5 rates
            <BLANKLINE>
            constants: none — every number above was measured, derived or given
            >>> print(plan.report(long=False, path="plan.json").splitlines()[1])
              lr  0.000227 per step  measured
        """
        lines = [v.line(name) for name, v in self.values.items()] if long else [self.table(path)]
        consts = self.constants()
        lines.append("")
        if consts:
            lines.append(f"constants (not measured here, {len(consts)}): " + ", ".join(consts))
        else:
            lines.append("constants: none — every number above was measured, derived or given")
        if long:
            lines.extend(f"note: {note}" for note in self.notes)
        else:
            lines[-1:] = textwrap.wrap(lines[-1], COLUMNS - 1, subsequent_indent="  ", break_on_hyphens=False)
            for note in self.notes:
                lines.extend(textwrap.wrap(f"note: {note}", COLUMNS - 1, subsequent_indent="  ",
                                           break_on_hyphens=False))
        if self.phases:
            lines.append("")
            lines.append(self.phase_table())
        return "\n".join(lines)

    def table(self, path: str = "PLAN") -> str:
        """The numbers to train with (:data:`TRAIN_WITH`), then the plan's other values, a line
        each: name, number with its unit, kind; every line shorter than :data:`COLUMNS`, a number
        wider than :data:`NUMBER_COLUMNS` cut with ``…``. The last line says how to read a value's sentence and
        evidence (``path``: the plan file, ``PLAN`` where naming it would pass the width).

        Examples:
            >>> plan = Plan()
            >>> plan.set("rows", Value(32, "measured", "rows read from train.jsonl"))
            >>> plan.set("micro_batch", Value(1, "derived", "the step's 1 row", unit="rows"))
            >>> plan.set("weight_decay", Value(0.0, "constant", "0 by argument, not measured here"))
            >>> print(plan.table("plan.json"))
            train with:
              micro_batch   1 row  derived
              weight_decay  0      constant
            and the numbers behind them:
              rows          32     measured
            leadline report plan.json --why NAME prints the sentence and evidence behind a value
        """
        first = [n for n in TRAIN_WITH if n in self.values]
        rest = [n for n in self.values if n not in first]
        name_w = min(max((len(n) for n in self.values), default=0), 40)  # a longer name widens its own line
        text_w = max((len(v.text()) for v in self.values.values()), default=0)
        text_w = min(text_w, NUMBER_COLUMNS, COLUMNS - 1 - (2 + name_w + 2 + 2 + max(len(k) for k in KINDS)))
        lines = []
        for head, names in (("train with:", first), ("and the numbers behind them:" if first else "values:", rest)):
            if names:
                lines.append(head)
                lines.extend(self._row(n, name_w, text_w) for n in names)
        hint = "leadline report {} --why NAME prints the sentence and evidence behind a value"
        line = hint.format(path)
        lines.append(line if len(line) < COLUMNS else hint.format("PLAN"))
        return "\n".join(lines)

    def _row(self, name: str, name_w: int, text_w: int) -> str:
        """One line of :meth:`table`: the number cut with ``…`` where the line would pass the width."""
        v = self.values[name]
        width = max(4, min(text_w, COLUMNS - 1 - (2 + max(name_w, len(name)) + 2 + 2 + len(v.kind))))
        text = v.text()
        if len(text) > width:  # cut after a whole item of a list or dict where there is one
            head = text[: width - 1]
            text = (head[: head.rindex(", ") + 2] if ", " in head else head) + "…"
        return f"  {name:<{name_w}}  {text:<{width}}  {v.kind}"

    def phase_table(self) -> str:
        """Where derive()'s seconds went: a line per phase (seconds, the run's steps it took,
        the training numbers it moved), then derive's wall time and the share the phases hold,
        then the run's own steps, apart from derive's."""
        rows = [p.row() for p in self.phases]
        deciding = [p for p in self.phases if p.phase not in RUN_PHASES]  # the run's own work is no part of derive
        inside = sum(p.seconds for p in deciding)
        steps = sum(p.steps for p in deciding)
        reads = sum(p.reads for p in deciding)
        if self.derive_seconds is not None:
            rows.append(f"derive: {self.derive_seconds:.1f} s wall, {inside:.1f} s of it in the phases,\n"
                        f"  {steps} steps on the run's rows ({sum(p.step_seconds for p in deciding):.1f} s), "
                        f"{reads} held-out reads ({sum(p.read_seconds for p in deciding):.1f} s)")
        run = self.run_phase()
        if run is not None:
            rows.append(self.run_line(run))
        head = "where the seconds went" if len(deciding) < len(self.phases) else "where derive's seconds went"
        return head + ":\n" + "\n".join("  " + line for r in rows for line in r.split("\n"))

    def run_phase(self) -> PhaseTime | None:
        """The run's own phase (``"run"``), where the plan holds it."""
        return next((p for p in self.phases if p.phase == "run"), None)

    def kept_race_steps(self) -> int:
        """The opening race's steps the run kept as its first (``opening_steps`` where the run
        trained on from the race; 0 where no run phase follows it)."""
        kept = self.get("opening_steps") if self.run_phase() is not None else 0
        return kept if isinstance(kept, int) and not isinstance(kept, bool) else 0

    def run_line(self, run: PhaseTime) -> str:
        """The run's steps and seconds, and the race's steps it kept, in one sentence.

        Examples:
            >>> plan = Plan(phases=[PhaseTime("rate", 38.1, 4), PhaseTime("run", 84.1, 18)])
            >>> plan.set("opening_steps", Value(2, "derived", "each candidate's steps in the race", unit="steps"))
            >>> plan.run_line(plan.phases[1])
            "the run: 18 steps in 84.1 s after the race's 2 it kept (20 steps of training in all)"
        """
        kept = self.kept_race_steps()
        line = f"the run: {run.steps} step{'s' if run.steps != 1 else ''} in {run.seconds:.1f} s"
        if run.reads:
            line += f", {run.reads} held-out read{'s' if run.reads != 1 else ''} ({run.read_seconds:.1f} s)"
        if kept:
            line += f" after the race's {kept} it kept ({run.steps + kept} steps of training in all)"
        guard = next((p for p in self.phases if p.phase == "guard"), None)
        if guard is not None:
            line += (f"; the guard's checks and verdict {guard.seconds:.1f} s ({guard.reads} held-out "
                     f"read{'s' if guard.reads != 1 else ''})")
        return line

    def cost(self, name: str) -> str:
        """What deciding ``name`` cost: its own seconds, and the phase that decided it (the one
        whose answer moved it, or the rate phase for ``lr``) with that phase's seconds, steps and
        held-out reads.

        Examples:
            >>> plan = Plan(phases=[PhaseTime("rate", 44.9, 6, (), step_seconds=30.0, reads=3, read_seconds=14.0)])
            >>> plan.set("lr", Value(0.0025, "measured", "won the opening race"))
            >>> print(plan.cost("lr"))
            cost: the rate phase, 44.9 s: 6 steps on the run's rows (30.0 s), 3 held-out reads (14.0 s)
            >>> plan.set("weight_decay", Value(0.0, "constant", "0 by argument"))
            >>> plan.cost("weight_decay")
            'cost: none (nothing was measured for it)'
        """
        v = self[name]
        phase = next((p for p in self.phases if name in p.changed), None)
        if phase is None and name in DECIDED_BY:
            phase = next((p for p in self.phases if p.phase == DECIDED_BY[name]), None)
        own = f"{v.seconds:.3g} s" if v.seconds else ""
        if phase is None or phase.seconds <= 0:
            return f"cost: {own}" if own else "cost: none (nothing was measured for it)"
        what = [f"{phase.steps} step{'s' if phase.steps != 1 else ''} on the run's rows ({phase.step_seconds:.1f} s)"
                if phase.steps else "",
                f"{phase.reads} held-out read{'s' if phase.reads != 1 else ''} ({phase.read_seconds:.1f} s)"
                if phase.reads else ""]
        detail = ", ".join(w for w in what if w)
        line = f"cost: the {phase.phase} phase, {phase.seconds:.3g} s" + (f": {detail}" if detail else "")
        if own and abs(v.seconds - phase.seconds) > 0.05 * phase.seconds:
            line = f"cost: {own} of its own; " + line[len("cost: "):]
        return line

    def why(self, name: str, *, width: int | None = None) -> str:
        """The whole evidence behind one value: its line, its cost, and the structure.

        ``width`` (``leadline report --why``): the line split in two, ``name = number unit  [kind]``
        and the sentence wrapped to ``width`` columns; the evidence's numbers to 4 significant
        digits, a list or dict on one line where it fits.

        Examples:
            >>> plan = Plan()
            >>> plan.set("lr", Value(0.000227, "measured", "won a race of 5 rates", evidence={"rates": 5}))
            >>> print(plan.why("lr", width=40))
            lr = 0.000227  [measured]
            won a race of 5 rates
            cost: none (nothing was measured for it)
            evidence (numbers to 4 significant digits; the plan file holds them whole):
            {"rates": 5}
        """
        v = self[name]
        if width is None:
            head = v.line(name)
        else:
            unit = f" {v.unit}" if v.unit and isinstance(v.value, (int, float)) else ""
            text = v.words() + unit if isinstance(v.value, dict) else v.text()
            head = "\n".join([f"{name} = {text}  [{v.kind}]",
                              *textwrap.wrap(v.source, width, break_on_hyphens=False)])
        cost = self.cost(name)
        if v.evidence is None:
            return f"{head}\n{cost}\nevidence: none recorded"
        if width is None:
            return f"{head}\n{cost}\nevidence:\n{json.dumps(v.evidence, indent=2, sort_keys=False)}"
        return (f"{head}\n{cost}\nevidence (numbers to 4 significant digits; the plan file holds them whole):\n"
                f"{_json_lines(_rounded(v.evidence), width)}")

    def constants(self) -> dict[str, Value]:
        """Every value nobody measured here, in one place."""
        return {n: v for n, v in self.values.items() if v.kind == "constant"}

    # ---- JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "leadline_plan": PLAN_FORMAT,
            "version": self.version,
            "created": self.created,
            "machine": self.machine,
            "model": self.model,
            "data": self.data,
            "held_out": self.held_out,
            "notes": list(self.notes),
            "skipped": [s.to_dict() for s in self.skipped],
            "phases": [p.to_dict() for p in self.phases],
            "derive_seconds": self.derive_seconds,
            "values": {n: v.to_dict() for n, v in self.values.items()},
        }

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """The plan as JSON; with ``path``, also written there atomically."""
        text = json.dumps(self.to_dict(), indent=1, allow_nan=True)
        if path is not None:
            write_atomic(path, text + "\n")
        return text

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, origin: str = "the data") -> Plan:
        is_plan = isinstance(d, Mapping) and d.get("leadline_plan") == PLAN_FORMAT
        if not is_plan or not isinstance(d.get("values"), Mapping):
            raise InputError(f"{origin} is not a leadline plan (no 'leadline_plan': {PLAN_FORMAT} with 'values'); "
                             "pass a file written by plan.to_json() or `leadline derive --out`")
        try:
            values = {n: Value.from_dict(v) for n, v in d["values"].items()}
            skipped = [Skipped.from_dict(s) for s in d.get("skipped") or []]
            timed = [PhaseTime.from_dict(p) for p in d.get("phases") or []]
        except (KeyError, TypeError, AttributeError) as e:
            raise InputError(f"{origin} is not a leadline plan: a value is missing its field {e}; regenerate it with "
                             "`leadline derive`") from None
        return cls(
            values=values,
            machine=dict(d.get("machine") or {}),
            model=dict(d.get("model") or {}),
            data=dict(d.get("data") or {}),
            held_out=dict(d.get("held_out") or {}),
            notes=list(d.get("notes") or []),
            skipped=skipped,
            phases=timed,
            derive_seconds=(float(d["derive_seconds"]) if isinstance(d.get("derive_seconds"), (int, float))
                            else None),
            version=str(d.get("version", "unknown")),
            created=float(d.get("created", 0.0)),
        )

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike[str]) -> Plan:
        """Read a plan from a JSON string or a path to a file written by :meth:`to_json`."""
        text = str(text_or_path) if not isinstance(text_or_path, os.PathLike) else None
        origin = "the JSON text"
        if text is None or not text.lstrip().startswith("{"):
            p = Path(text_or_path)
            origin = str(p)
            if not p.is_file():
                raise InputError(f"plan file {p} does not exist; pass the path `leadline derive --out` wrote")
            try:
                text = p.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise InputError(f"plan file {p} cannot be read as text ({e.__class__.__name__}); pass a JSON "
                                 "plan") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"{origin} is not a leadline plan: not JSON ({e.msg} at line {e.lineno}); pass a file "
                             "written by `leadline derive --out`") from None
        return cls.from_dict(d, origin=origin)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Plan) and self.to_dict() == other.to_dict()


def refuse_quick_plan(plan: Plan, name: str = "the plan") -> None:
    """A plan of the removed quick effort (``race_rates`` and no look-ahead horizon) refused in one
    sentence naming it and the fix.

    Examples:
        >>> plan = Plan()
        >>> plan.set("race_rates", Value([5e-4, 1e-3], "derived", "the anchor x 2^j"))
        >>> refuse_quick_plan(plan)
        Traceback (most recent call last):
            ...
        leadline.errors.InputError: the plan is of the quick effort, which was removed; derive it again with ...
    """
    if plan.get("race_rates") and "lookahead_horizon_steps" not in plan:
        raise InputError(f"{name} is of the quick effort, which was removed; derive it again with the race effort "
                         "(the default) or full")
