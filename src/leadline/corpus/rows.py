"""Reading rows: a JSON Lines file or a list in memory, in the formats the ecosystem uses.

The formats (TRL's, plus the common instruction fields), detected row by row in this order:

==========================  ===========================================================
``{"input_ids", "labels"}``  already tokenized; ``labels`` optional (then every token is
                             scored), ``-100`` = not scored
``{"messages"}``             a chat, through the tokenizer's chat template
``{"prompt", "completion"}`` strings; or lists of messages (conversational prompt/completion)
``{"text"}``                 plain text, every token scored
``{"instruction", "output"}`` (``"input"`` optional) a user turn and an assistant turn
``{"question", "answer"}``   a user turn and an assistant turn
==========================  ===========================================================

``fields={"prompt": "question", "completion": "answer_cot"}`` reads other keys as these
roles. Keys a row has that its format does not use are counted (``RowReader.ignored``), never
silently dropped from the report.

A row that cannot be used is a *problem*: with ``bad_rows="raise"`` the first one raises an
:class:`~leadline.errors.InputError` naming the file and line; ``"report"`` reads on and
raises one sentence with the count and the first lines; ``"skip"`` drops them and counts them.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leadline.errors import InputError

BAD_ROWS = ("raise", "report", "skip")
ROLES = ("text", "prompt", "completion", "messages", "input_ids", "labels", "instruction", "input", "output",
         "question", "answer")
KNOWN = "text, prompt+completion, messages, input_ids(+labels), instruction+output, question+answer"
_SHOWN = 3  # problems quoted by name in a report
GIVEN = "the rows given"  # the source of rows passed in memory
RowSource = str | os.PathLike[str] | Iterable[Mapping[str, object]]
"""Where rows come from: a path to a JSON Lines file, or the rows in memory (dicts in one of the
formats above; already tokenized rows pass too)."""


@dataclass(frozen=True)
class Example:
    """One usable row: its format (``kind``), its fields under their role names, and where it came from.

    ``kind`` is one of ``text``, ``prompt_completion``, ``chat_prompt_completion``,
    ``messages``, ``tokenized``, ``instruction``, ``question_answer``. ``where`` is the file and
    line, or ``rows[i]`` for rows in memory.

    Examples:
        >>> next(read_rows([{"question": "2+2?", "answer": "4"}]))
        Example(kind='question_answer', data={'question': '2+2?', 'answer': '4'}, where='rows[0]')
    """

    kind: str
    data: dict[str, Any]
    where: str


class Problems:
    """The rows that cannot be used, handled by one policy (``raise``, ``report`` or ``skip``).

    ``count`` rows recorded; ``first`` quotes the first three, without the source's name.

    Examples:
        >>> p = Problems("skip", "train.jsonl")
        >>> p.record("train.jsonl line 3", "is not JSON")
        >>> p.record("train.jsonl line 9", "has an empty text (nothing to score)")
        >>> p.count, p.summary()
        (2, '2 rows of train.jsonl cannot be used (line 3 is not JSON; line 9 has an empty text (nothing to score))')
        >>> Problems("ignore")
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: bad_rows='ignore' is not one of raise, report, skip; pick how a row ...
    """

    def __init__(self, mode: str = "raise", source: str = "the rows") -> None:
        if mode not in BAD_ROWS:
            raise InputError(f"bad_rows={mode!r} is not one of {', '.join(BAD_ROWS)}; pick how a row that cannot be "
                             "used is handled")
        self.mode = mode
        self.source = source
        self.count = 0
        self.first: list[str] = []

    def record(self, where: str, reason: str, fix: str = "fix or remove it") -> None:
        """One row cannot be used: raise now (``raise``), or count it.

        Examples:
            >>> Problems("raise", "the rows given").record("rows[1]", "has an empty text (nothing to score)")
            Traceback (most recent call last):
            ...
            leadline.errors.InputError: rows[1] has an empty text (nothing to score); fix or remove it, or list ...
        """
        self.count += 1
        if self.mode == "raise":
            shell = (f" (from the shell: leadline corpus {self.source} --bad-rows report)" if self.source != GIVEN
                     else "")
            raise InputError(f"{where} {reason}; {fix}, or list every such row with bad_rows='report'{shell}")
        if len(self.first) < _SHOWN:
            short = where[len(self.source) + 1:] if where.startswith(self.source + " ") else where
            self.first.append(f"{short} {reason}")

    def summary(self) -> str:
        """One sentence: how many rows cannot be used, the first three quoted (see the class)."""
        more = f", and {self.count - len(self.first)} more" if self.count > len(self.first) else ""
        return (f"{self.count:,} row{'s' if self.count != 1 else ''} of {self.source} cannot be used "
                f"({'; '.join(self.first)}{more})")

    def finish(self) -> None:
        """After the last row: in ``report`` mode, one sentence for all the problems.

        Examples:
            >>> p = Problems("report", "the rows given")
            >>> p.record("rows[1]", "has an empty text (nothing to score)")
            >>> p.finish()
            Traceback (most recent call last):
            ...
            leadline.errors.InputError: 1 row of the rows given cannot be used (rows[1] ...); fix or remove them, ...
        """
        if self.mode == "report" and self.count:
            raise InputError(f"{self.summary()}; fix or remove them, or pass bad_rows='skip' (--bad-rows skip) to drop "
                             "them")


class RowReader:
    """Iterates :class:`Example` rows from a path or an iterable, streaming, and keeps count.

    Attributes after iteration: ``rows`` (usable rows), ``formats`` (Counter by kind),
    ``ignored`` (Counter of keys no format used), ``problems``, ``sha256`` (of the file's
    bytes, or of the rows as canonical JSON, as :func:`leadline.provenance.content_hash`),
    ``bytes_read`` / ``bytes_total`` (files only, for progress).

    Examples:
        >>> reader = RowReader([{"text": "a", "id": 1}, {"prompt": "p", "completion": "c", "id": 2}])
        >>> [ex.kind for ex in reader]
        ['text', 'prompt_completion']
        >>> reader.rows, dict(reader.formats), dict(reader.ignored)
        (2, {'text': 1, 'prompt_completion': 1}, {'id': 2})
    """

    def __init__(self, path_or_rows: Any, *, fields: Mapping[str, str] | None = None,
                 problems: Problems | None = None) -> None:
        self.path = _as_path(path_or_rows)
        self.source = str(self.path) if self.path is not None else GIVEN
        self._rows = path_or_rows
        self.fields = _check_fields(fields)
        self.problems = problems if problems is not None else Problems("raise", self.source)
        self.problems.source = self.source
        self.rows = 0
        self.formats: Counter[str] = Counter()
        self.ignored: Counter[str] = Counter()
        self.sha256 = ""
        self.bytes_read = 0
        self.bytes_total = 0

    def __iter__(self) -> Iterator[Example]:
        h = hashlib.sha256()
        seen = 0
        for where, raw in self._raw(h):
            seen += 1
            ex = self.parse(raw, where)
            if ex is not None:
                self.rows += 1
                self.formats[ex.kind] += 1
                yield ex
        self.sha256 = h.hexdigest()
        if seen == 0:
            fix = ("pass a JSON Lines file with one JSON object per line" if self.path is not None
                   else "pass at least one row")
            raise InputError(f"{self.source} holds no rows; {fix}")

    def _raw(self, h: Any) -> Iterator[tuple[str, Any]]:
        if self.path is None:
            if isinstance(self._rows, (str, bytes, Mapping)) or not isinstance(self._rows, Iterable):
                raise InputError("rows must be a path to a JSON Lines file or a list of dicts, got "
                                 f"{type(self._rows).__name__}; pass one of those")
            for i, row in enumerate(self._rows):
                h.update(json.dumps(_plain(row), sort_keys=True, default=str).encode())
                h.update(b"\n")
                yield f"rows[{i}]", row
            return
        p = self.path
        if p.is_dir():
            raise InputError(f"data file {p} is a folder, not a file; pass a JSON Lines file (one JSON object per "
                             "line)")
        if not p.is_file():
            raise InputError(f"data file {p} does not exist; pass a JSON Lines file (one JSON object per line)")
        self.bytes_total = p.stat().st_size
        with open(p, "rb") as f:
            for lineno, line in enumerate(f, start=1):
                h.update(line)
                self.bytes_read += len(line)
                if not line.strip():
                    continue
                where = f"{p} line {lineno}"
                try:
                    yield where, json.loads(line)
                except json.JSONDecodeError as e:
                    self.problems.record(where, f"is not JSON ({_json_reason(e)})")
                except UnicodeDecodeError:
                    self.problems.record(where, "is not UTF-8 text")

    def parse(self, raw: object, where: str) -> Example | None:
        """The row as an :class:`Example`, or None after recording why it cannot be used.

        Examples:
            >>> reader = RowReader([], problems=Problems("skip"))
            >>> reader.parse({"q": "2+2?", "text": "4"}, "rows[0]")
            Example(kind='text', data={'text': '4'}, where='rows[0]')
            >>> reader.parse({"title": "x"}, "rows[1]") is None
            True
            >>> reader.problems.first
            ['rows[1] has none of the known fields (it has title; known: text, prompt+completion, ...)']
        """
        raw = _plain(raw)
        if not isinstance(raw, Mapping):
            self.problems.record(where, f"is a JSON {_json_type(raw)}, not an object with fields")
            return None
        row, origin = self._rename(raw)
        kind = detect(row)
        if kind is None:
            has = ", ".join(sorted(map(str, raw))) or "no fields"
            self.problems.record(where, f"has none of the known fields (it has {has}; known: {KNOWN})",
                                 "rename its fields (in Python, fields= maps other keys to these)")
            return None
        used = _USED[kind]
        data = {k: row[k] for k in used if k in row}
        reason = validate(kind, data)
        if reason is not None:
            self.problems.record(where, reason)
            return None
        used_raw = {origin[k] for k in used if k in row}
        for k in raw:
            if k not in used_raw:
                self.ignored[str(k)] += 1
        return Example(kind, data, where)

    def _rename(self, raw: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        if not self.fields:
            return dict(raw), {k: k for k in raw}
        row: dict[str, Any] = {}
        origin: dict[str, str] = {}
        taken = set()
        for role, key in self.fields.items():
            if key in raw:
                row[role], origin[role] = raw[key], key
                taken.add(key)
        for k, v in raw.items():
            if k not in taken and k not in row:
                row[k], origin[k] = v, k
        return row, origin


_USED: dict[str, tuple[str, ...]] = {
    "tokenized": ("input_ids", "labels"),
    "messages": ("messages",),
    "prompt_completion": ("prompt", "completion"),
    "chat_prompt_completion": ("prompt", "completion"),
    "text": ("text",),
    "instruction": ("instruction", "input", "output"),
    "question_answer": ("question", "answer"),
}


def detect(row: Mapping[str, Any]) -> str | None:
    """The format of a row by its fields (see the module docstring for the order), or None.

    Examples:
        >>> detect({"prompt": "2+2=", "completion": "4"}), detect({"prompt": [], "completion": []})
        ('prompt_completion', 'chat_prompt_completion')
        >>> detect({"input_ids": [1], "text": "a"}), detect({"title": "x"})
        ('tokenized', None)
    """
    if "input_ids" in row:
        return "tokenized"
    if "messages" in row:
        return "messages"
    if "prompt" in row and "completion" in row:
        return ("chat_prompt_completion" if isinstance(row["prompt"], list) or isinstance(row["completion"], list)
                else "prompt_completion")
    if "text" in row:
        return "text"
    if "instruction" in row and "output" in row:
        return "instruction"
    if "question" in row and "answer" in row:
        return "question_answer"
    return None


def validate(kind: str, d: dict[str, Any]) -> str | None:
    """Why a row of this format cannot be used (the clause after "line N"), or None.

    Every text field must be a string: a number (``"completion": 3``) is refused, as TRL's
    tokenization would refuse it, with the quoted spelling to write instead. Tokenized rows
    without labels get ``labels = input_ids`` (``d`` is changed in place).

    Examples:
        >>> validate("text", {"text": "  "})
        'has an empty text (nothing to score)'
        >>> print(validate("prompt_completion", {"prompt": "2+2=", "completion": 4}))
        has a 'completion' that is a number, not a string (write "completion": "4")
        >>> validate("tokenized", {"input_ids": [5, 6], "labels": [-100, -100]})
        'has every label after the first at -100 (nothing to score)'
    """
    if kind == "text":
        if not isinstance(d["text"], str):
            return _not_text("text", d["text"])
        return "has an empty text (nothing to score)" if not d["text"].strip() else None
    if kind == "prompt_completion":
        for key in ("prompt", "completion"):
            if not isinstance(d[key], str):
                return _not_text(key, d[key])
        return "has an empty completion (nothing to score)" if not d["completion"].strip() else None
    if kind == "chat_prompt_completion":
        for key in ("prompt", "completion"):
            bad = _bad_messages(d[key], key)
            if bad:
                return bad
        return "has an empty completion (nothing to score)" if not d["completion"] else None
    if kind == "messages":
        bad = _bad_messages(d["messages"], "messages")
        if bad:
            return bad
        if not any(m["role"] == "assistant" for m in d["messages"]):
            return "has no assistant turn in 'messages' (nothing to score)"
        return None
    if kind == "tokenized":
        return _bad_tokenized(d)
    if kind == "instruction":
        for key in ("instruction", "input", "output"):
            if key in d and d[key] is not None and not isinstance(d[key], str):
                return _not_text(key, d[key])
        return "has an empty output (nothing to score)" if not (d["output"] or "").strip() else None
    if kind == "question_answer":
        for key in ("question", "answer"):
            if not isinstance(d[key], str):
                return _not_text(key, d[key])
        return "has an empty answer (nothing to score)" if not d["answer"].strip() else None
    raise AssertionError(kind)


def _not_text(key: str, value: Any) -> str:
    """Why a field that must be a string is not one, with the quoted spelling where it is a number.

    Examples:
        >>> print(_not_text("completion", 3))
        has a 'completion' that is a number, not a string (write "completion": "3")
        >>> print(_not_text("input", [1]))
        has an 'input' that is a list, not a string
    """
    article = "an" if key[0] in "aeiou" else "a"
    said = f"has {article} '{key}' that is a {_json_type(value)}, not a string"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        said += f' (write "{key}": "{value}")'
    return said


def _bad_messages(msgs: Any, key: str) -> str | None:
    if not isinstance(msgs, list) or not msgs:
        return f"has a '{key}' that is not a non-empty list of messages"
    for j, m in enumerate(msgs):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return f"has {key}[{j}] without a 'role' and a text 'content'"
    return None


def _bad_tokenized(d: dict[str, Any]) -> str | None:
    ids = d["input_ids"]
    if not isinstance(ids, list) or not ids or not all(type(t) is int and t >= 0 for t in ids):
        return "has 'input_ids' that are not a non-empty list of token ids (ints >= 0)"
    labels = d.get("labels")
    if labels is None:
        d["labels"] = list(ids)
        return None if len(ids) > 1 else "has one token and no labels (nothing to score after the shift)"
    if not isinstance(labels,
                      list) or len(labels) != len(ids) or not all(type(t) is int and (t >= 0 or t == -100)
                                                                  for t in labels):
        return (f"has 'labels' that are not a list of {len(ids)} ints, one per input id (a token id, or -100 for not "
                "scored)")
    if all(t == -100 for t in labels[1:]):
        return "has every label after the first at -100 (nothing to score)"
    return None


def _check_fields(fields: Mapping[str, str] | None) -> dict[str, str]:
    if not fields:
        return {}
    if not isinstance(fields, Mapping):
        raise InputError("fields must map a role to a key, like {'completion': 'answer_cot'}, got "
                         f"{type(fields).__name__}")
    for role, key in fields.items():
        if role not in ROLES or not isinstance(key, str) or not key:
            raise InputError(f"fields maps {role!r} -> {key!r}; a role is one of {', '.join(ROLES)} and a key is a "
                             "field name")
    return dict(fields)


def _json_reason(e: json.JSONDecodeError) -> str:
    """The decoder's reason and column, read once: its message can end in "at" ("Unterminated
    string starting at")."""
    msg = e.msg[:-3] if e.msg.endswith(" at") else e.msg
    return f"{msg} at column {e.colno}"


def _as_path(x: Any) -> Path | None:
    return Path(x) if isinstance(x, (str, os.PathLike)) else None


def _plain(row: Any) -> Any:
    """A :class:`~leadline.corpus.tokenize.TokenizedRow` given in memory reads as a tokenized row."""
    if hasattr(row, "input_ids") and hasattr(row, "labels") and not isinstance(row, Mapping):
        return {"input_ids": list(row.input_ids), "labels": list(row.labels)}
    return row


def _json_type(x: Any) -> str:
    if isinstance(x, bool):
        return "boolean"
    if isinstance(x, (int, float)):
        return "number"
    if isinstance(x, str):
        return "string"
    if isinstance(x, list):
        return "list"
    if x is None:
        return "null"
    return type(x).__name__


def read_rows(path_or_rows: RowSource, *, fields: Mapping[str, str] | None = None,
              bad_rows: str = "raise") -> Iterator[Example]:
    """Stream the usable rows of a JSON Lines file or of an in-memory list as :class:`Example`.

    Args:
        path_or_rows: a path to a ``.jsonl`` file, or an iterable of dicts (or TokenizedRows).
        fields: read other keys as the known roles, e.g. ``{"completion": "answer_cot"}``.
        bad_rows: ``"raise"`` at the first row that cannot be used (the message names the
            file and line), ``"report"`` one sentence for all of them at the end, ``"skip"``.

    Raises:
        InputError: a missing or empty file, or a bad row (see ``bad_rows``).

    Examples:
        >>> [ex.kind for ex in read_rows([{"text": "hi"}, {"prompt": "2+2=", "completion": "4"}])]
        ['text', 'prompt_completion']
        >>> [ex.data for ex in read_rows([{"q": "2+2=", "a": "4"}], fields={"prompt": "q", "completion": "a"})]
        [{'prompt': '2+2=', 'completion': '4'}]
        >>> list(read_rows([{"text": "hi"}, {"title": "x"}], bad_rows="skip"))
        [Example(kind='text', data={'text': 'hi'}, where='rows[0]')]
        >>> list(read_rows([{"text": "hi"}, {"text": ""}]))
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: rows[1] has an empty text (nothing to score); fix or remove it, ...

        A file, in a temporary folder:

        >>> import os, tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     path = os.path.join(folder, "train.jsonl")
        ...     with open(path, "w") as f:
        ...         for line in ('{"text": "one"}', "", '{"text": "two"}'):
        ...             print(line, file=f)
        ...     [ex.where.replace(folder, "DIR") for ex in read_rows(path)]
        ['DIR/train.jsonl line 1', 'DIR/train.jsonl line 3']
    """
    problems = Problems(bad_rows)
    reader = RowReader(path_or_rows, fields=fields, problems=problems)
    yield from reader
    problems.finish()
