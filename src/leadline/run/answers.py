"""How good the model is in the user's terms, where the rows are a classifier's: the answers it
chooses on the held-out rows (and on the eval or test rows), before the run and after.

The answers are the opening race's (:func:`leadline.rate.opening.answer_set`): the distinct
completions of the training rows, from 2 to :data:`~leadline.rate.opening.MAX_ANSWERS`; free text
(more of them) has none, and neither do rows without a prompt (plain text). A row's choice is the
answer with the highest summed log-probability after the row's prompt
(:func:`answers_chosen`), so nothing is generated and nothing is parsed:

    accuracy = (rows whose choice is their own completion) / rows
    chosen[a] = (rows whose choice is a) / rows

``chosen`` beside the rows' own shares shows a collapse at a glance: a model that answers one
class for every row has one share of 100%, whatever its accuracy. Each reading is one batched read
of every row with every answer; the run counts them with the verdict's reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from leadline.rate.opening import first_scored

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from leadline.corpus import TokenizedRow
    from leadline.memory_readings import Device
    from leadline.run.task import Task

SHOWN = 8
"""The answers the terminal lists by name (the most frequent among the rows' own); ``run.json``
holds every one."""


def answers_chosen(model: torch.nn.Module, rows: Sequence[TokenizedRow], held: Sequence[int],
                   answers: Sequence[tuple[int, ...]], device: Device, pad_id: int) -> list[int]:
    """For each held-out row, the index of the answer with the highest summed log-probability
    after the row's prompt (one batched read of every row with every answer)."""
    from leadline.corpus import TokenizedRow
    from leadline.corpus.losses import row_losses

    tried = []
    for i in held:
        prompt = rows[i].input_ids[:first_scored(rows[i])]
        for ans in answers:
            tried.append(TokenizedRow.from_labels(list(prompt) + list(ans), [-100] * len(prompt) + list(ans)))
    means = row_losses(model, tried, None, device, pad_id=pad_id)
    k = len(answers)
    out = []
    for j in range(len(held)):
        nll = [means[j * k + a] * max(1, tried[j * k + a].scored_tokens) for a in range(k)]
        out.append(min(range(k), key=nll.__getitem__))
    return out


@dataclass(frozen=True)
class AnswerReading:
    """The answers a model chose on some rows: its accuracy and each answer's share of the choices.

    Examples:
        >>> r = AnswerReading.of([0, 1, 1, 1], [0, 1, 0, -1], ["games", "net", "sound"])
        >>> r.accuracy, r.chosen, r.rows
        (0.5, {'games': 0.25, 'net': 0.75, 'sound': 0.0}, 4)
    """

    accuracy: float
    chosen: dict[str, float]
    rows: int

    @classmethod
    def of(cls, choices: Sequence[int], gold: Sequence[int], names: Sequence[str]) -> AnswerReading:
        """``choices`` and ``gold`` are indices into ``names`` (``gold`` -1: a completion outside the answers)."""
        n = len(choices)
        right = sum(1 for c, g in zip(choices, gold) if c == g)
        return cls(right / n if n else 0.0, {a: sum(1 for c in choices if c == k) / n if n else 0.0
                                              for k, a in enumerate(names)}, n)

    def as_dict(self) -> dict[str, Any]:
        return {"accuracy": self.accuracy, "chosen": dict(self.chosen), "rows": self.rows}


def own_shares(gold: Sequence[int], names: Sequence[str]) -> dict[str, float]:
    """Each answer's share of the rows' own completions; ``(other)`` for those outside the answers.

    Examples:
        >>> own_shares([0, 0, 1, -1], ["games", "net"])
        {'games': 0.5, 'net': 0.25, '(other)': 0.25}
    """
    n = len(gold) or 1
    out = {a: sum(1 for g in gold if g == k) / n for k, a in enumerate(names)}
    other = sum(1 for g in gold if g < 0) / n
    return {**out, "(other)": other} if other else out


@dataclass
class AnswerCheck:
    """One set of rows read: how many, the rows' own shares, the readings before and after the run."""

    rows: int
    own: dict[str, float]
    before: AnswerReading | None = None
    after: AnswerReading | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "own": dict(self.own),
                "before": self.before.as_dict() if self.before else None,
                "after": self.after.as_dict() if self.after else None}

    def line(self, label: str) -> list[str]:
        """The terminal's lines for these rows: the accuracy before and after, then each answer's
        share of the choices before and after, beside the rows' own (the :data:`SHOWN` most frequent).

        Examples:
            >>> c = AnswerCheck(4, {"games": 0.5, "net": 0.5}, AnswerReading(0.5, {"games": 1.0, "net": 0.0}, 4),
            ...                 AnswerReading(1.0, {"games": 0.5, "net": 0.5}, 4))
            >>> print("\\n".join(c.line("held-out")))
            held-out answers: accuracy 50% before, 100% after on 4 rows
              chosen before -> after (the rows' own): games 100% -> 50% (50%), net 0% -> 50% (50%)
        """
        b, a = self.before, self.after
        if b is None or a is None:
            return []
        head = f"{label} answers: accuracy {_pct(b.accuracy)} before, {_pct(a.accuracy)} after on {self.rows} rows"
        names = sorted(a.chosen, key=lambda n: -self.own.get(n, 0.0))
        shown = [f"{n} {_pct(b.chosen[n])} -> {_pct(a.chosen[n])} ({_pct(self.own.get(n, 0.0))})"
                 for n in names[:SHOWN]]
        if len(names) > SHOWN:
            shown.append(f"and {len(names) - SHOWN} more in run.json")
        return [head, *_packed("  chosen before -> after (the rows' own): ", shown)]


@dataclass
class Answers:
    """What the run read of the answers: their names, the held-out rows' check, the eval or test
    rows' (``test``, where the run has them), and the reads and seconds it cost."""

    names: list[str]
    held_out: AnswerCheck
    test: AnswerCheck | None = None
    test_source: str | None = None
    reads: int = 0
    seconds: float = 0.0

    def lines(self) -> list[str]:
        out = self.held_out.line("held-out")
        if self.test is not None:
            out += self.test.line(self.test_source or "test")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"answers": list(self.names), "held_out": self.held_out.as_dict(),
                "test": self.test.as_dict() if self.test else None, "test_source": self.test_source,
                "reads": self.reads, "seconds": round(self.seconds, 3)}


@dataclass
class AnswerReader:
    """Reads the task's model's answers on its held-out and test rows: :meth:`before` at the start,
    :meth:`after` on the model kept, which returns the :class:`Answers`."""

    task: Any
    answers: list[tuple[int, ...]]
    names: list[str]
    chosen_before: dict[str, list[int]] = field(default_factory=dict)
    reads: int = 0
    seconds: float = 0.0

    @classmethod
    def of(cls, task: Task, decode: Callable[[Sequence[int]], str]) -> AnswerReader | None:
        """The reader where the training rows have a few distinct completions after a prompt, else None."""
        from leadline.rate.opening import answer_set

        rows = task.rows
        if any(first_scored(rows[i]) == 0 for i in task.split.train):  # plain text: no prompt to answer
            return None
        answers = answer_set(rows, task.split.train)
        return None if answers is None else cls(task, answers, names_of(answers, decode))

    def before(self) -> None:
        """The start's choices on every held-out and test row."""
        self.chosen_before = {part: self._choose(part) for part in ("held_out", "test")}

    def after(self, held_out_rows: int | None = None, test_source: str | None = None) -> Answers:
        """The kept model's choices, against the start's, on the first ``held_out_rows`` held-out
        rows (None: all of them; fewer where the others trained) and every test row."""
        checks: dict[str, AnswerCheck | None] = {}
        for part in ("held_out", "test"):
            n = None if part == "test" else held_out_rows
            after, gold = self._choose(part, n), self._gold(part, n)
            before = self.chosen_before.get(part, [])[:len(after)]
            checks[part] = (AnswerCheck(len(after), own_shares(gold, self.names),
                                        AnswerReading.of(before, gold, self.names) if before else None,
                                        AnswerReading.of(after, gold, self.names)) if after else None)
        held = checks["held_out"] or AnswerCheck(0, {})
        return Answers(self.names, held, checks["test"], test_source if checks["test"] else None, self.reads,
                       self.seconds)

    def _indices(self, part: str, n: int | None = None) -> list[int]:
        idx = list(getattr(self.task.split, part) or [])
        return idx if n is None else idx[:n]

    def _gold(self, part: str, n: int | None = None) -> list[int]:
        rows = self.task.rows
        return [self.answers.index(a) if a in self.answers else -1
                for a in (tuple(rows[i].input_ids[first_scored(rows[i]):]) for i in self._indices(part, n))]

    def _choose(self, part: str, n: int | None = None) -> list[int]:
        idx = self._indices(part, n)
        if not idx:
            return []
        t = time.perf_counter()
        task = self.task
        try:
            return answers_chosen(task.model, task.rows, idx, self.answers, task.device, task.pad_id)
        finally:
            self.reads += 1
            self.seconds += time.perf_counter() - t


def names_of(answers: Sequence[Sequence[int]], decode: Callable[[Sequence[int]], str]) -> list[str]:
    """Each answer's text as the user wrote it (``decode`` of its tokens, stripped), made unique.

    Examples:
        >>> names_of([(5, 0), (6, 0), (6,)], lambda ids: {5: " games", 6: " net"}.get(ids[0], "?"))
        ['games', 'net', 'net #2']
    """
    out: list[str] = []
    for ids in answers:
        name = decode(list(ids)).strip() or repr(tuple(ids))
        base, k = name, 2
        while name in out:
            name, k = f"{base} #{k}", k + 1
        out.append(name)
    return out


def _packed(head: str, items: Sequence[str], width: int = 99) -> list[str]:
    """``items`` joined by commas after ``head``, in lines under ``width``, no item split.

    Examples:
        >>> _packed("  chosen: ", ["games 10%", "net 20%", "sound 70%"], width=24)
        ['  chosen: games 10%,', '    net 20%, sound 70%']
    """
    lines, line = [], head
    for k, item in enumerate(items):
        text = item + ("," if k < len(items) - 1 else "")
        if line.strip() and line != head and len(line) + 1 + len(text) > width:
            lines.append(line)
            line = "    " + text
        else:
            line += ("" if line == head else " ") + text
    return [*lines, line]


def _pct(x: float) -> str:
    return f"{x:.0%}"


def answers_before(task: Task, tokenizer: PreTrainedTokenizerBase) -> AnswerReader | None:
    """Where the rows are a classifier's, the start's answers on the held-out and test rows; None for free text."""
    reader = AnswerReader.of(task, lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    if reader is not None:
        reader.before()
    return reader
