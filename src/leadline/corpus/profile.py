"""profile_corpus: rows, tokens read, scored tokens, the length, and the loss policy.

One streaming pass: rows are read and tokenized in batches and folded into histograms
(:mod:`leadline.corpus.lengths`), so memory is bounded by the longest row, not the row count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any

from leadline.corpus import lengths as L
from leadline.corpus.rows import Problems, RowReader, RowSource
from leadline.corpus.tokenize import RowEncoder, TokenizedRow, batches
from leadline.errors import InputError
from leadline.plan import Value, format_number

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_KIND_NAMES = {
    "text": "text",
    "prompt_completion": "prompt/completion",
    "chat_prompt_completion": "chat prompt/completion",
    "messages": "messages",
    "tokenized": "input_ids/labels",
    "instruction": "instruction/output",
    "question_answer": "question/answer",
}


@dataclass
class CorpusProfile:
    """What a corpus gives the loss at the chosen length.

    ``*_untruncated`` fields count the rows whole; the others at ``seq_len``. Scored tokens are
    label positions the loss scores after the causal shift (see :mod:`leadline.corpus.tokenize`).
    Built by :func:`profile_corpus`.

    Examples:
        A row of 4 tokens scores 3; a row of 8 whose first 4 labels are -100 scores 4. At
        ``seq_len=6`` the second row loses its last 2 scored tokens:

        >>> rows = [{"input_ids": [1, 2, 3, 4]}, {"input_ids": list(range(1, 9)), "labels": [-100] * 4 + [5, 6, 7, 8]}]
        >>> profile = profile_corpus(rows, seq_len=6)
        >>> profile.scored_tokens_untruncated, profile.scored_tokens, profile.truncated_rows
        (7, 5, 1)
        >>> round(profile.truncated_scored_share, 4)  # 2 / 7
        0.2857
    """

    source: str
    path: str | None
    sha256: str
    rows: int
    seq_len: int
    seq_len_rule: str  # "longest", "quantile", "given" or "positions" (the model's, shorter than the rows)
    quantile: float | None
    longest: int
    tokens_read: int
    tokens_untruncated: int
    scored_tokens: int
    scored_tokens_untruncated: int
    scored_tokens_per_row: float
    scored_per_row: dict[str, int]  # quantiles of scored tokens per row, untruncated
    lengths: dict[str, int]  # quantiles of row lengths in tokens
    truncated_rows: int
    truncated_scored_tokens: int
    truncated_scored_share: float
    unscored_rows: int
    loss_policy: list[str]
    formats: dict[str, int]
    ignored_fields: dict[str, int]
    skipped_rows: int
    skipped: list[str]
    seconds: float
    length_bins: list[dict[str, int]] = field(default_factory=list)
    scored_bins: list[dict[str, int]] = field(default_factory=list)
    longest_where: str = ""  # the longest row's file and line (or rows[i])
    positions: int | None = None  # the model's positions, where given
    changes: list[str] = field(default_factory=list)  # what training does to the rows, one sentence each

    @property
    def rows_per_second(self) -> float:
        """Rows profiled per second of the pass (inf when it took no measurable time)."""
        return self.rows / self.seconds if self.seconds > 0 else float("inf")

    @property
    def data(self) -> dict[str, Any]:
        """The plan's record of the data: path (None in memory), rows, sha256.

        Examples:
            >>> profile = profile_corpus([{"input_ids": [1, 2, 3]}])
            >>> sorted(profile.data), profile.data["path"], profile.data["rows"]
            (['path', 'rows', 'sha256'], None, 1)
        """
        return {"path": self.path, "rows": self.rows, "sha256": self.sha256}

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (what ``leadline corpus --json`` prints)."""
        return asdict(self)

    @property
    def mixed_formats(self) -> str | None:
        """One sentence when the rows come in more than one format (each row's loss then follows
        its own format's policy, which is rarely meant), else None.

        Examples:
            >>> profile_corpus([{"input_ids": [1, 2, 3]}]).mixed_formats is None
            True
            >>> profile_corpus([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}]).formats
            {'tokenized': 2}
        """
        if len(self.formats) < 2:
            return None
        fmt = ", ".join(f"{_KIND_NAMES.get(k, k)} {format_number(n)}" for k, n in self.formats.items())
        return (f"the rows of {self.source} mix formats ({fmt}): each row is scored by its own format's policy; "
                "put one format in a file if that is not what you meant")

    def describe(self) -> str:
        """The profile as a person reads it, one fact a line (what ``leadline corpus`` prints).

        Examples:
            >>> rows = [{"input_ids": [1, 2, 3, 4]},
            ...         {"input_ids": list(range(1, 9)), "labels": [-100] * 4 + [5, 6, 7, 8]}]
            >>> print(profile_corpus(rows).describe())
            corpus                 the rows given
            rows                   2  (input_ids/labels 2)
            tokens read            12  at seq_len (12 whole)
            scored tokens          7  what the loss scores (7 whole)
            scored tokens per row  3.5 mean at seq_len; whole rows: min 3, p10 3, median 3, p90 4, max 4
            row length (tokens)    min 4, p10 4, median 4, p90 8, max 8
            seq_len                8  the longest row
            truncation             none
            loss policy            input_ids/labels rows (2): the labels as given, -100 not scored
                                   scored tokens = labels after the causal shift (labels[1:] != -100)
            took                   ...
        """
        f = format_number
        fmt = ", ".join(f"{_KIND_NAMES.get(k, k)} {f(n)}" for k, n in self.formats.items())
        sp = self.scored_per_row
        if self.seq_len_rule == "longest":
            rule = "the longest row"
        elif self.seq_len_rule == "quantile":
            rule = f"the {self.quantile:g} quantile of row lengths"
        elif self.seq_len_rule == "positions":
            rule = f"the model's positions (the longest row has {format_number(self.longest)} tokens)"
        else:
            rule = "given"
        if self.truncated_rows:
            cut = (f"{f(self.truncated_rows)} rows cut; {f(self.truncated_scored_tokens)} scored tokens "
                   f"({self.truncated_scored_share:.2%} of the scored tokens) cut from the completions")
            if self.unscored_rows:
                cut += f"; {f(self.unscored_rows)} rows have nothing left to score"
        else:
            cut = "none"
        lines = [
            f"corpus                 {self.source}",
            f"rows                   {f(self.rows)}  ({fmt})",
            f"tokens read            {f(self.tokens_read)}  at seq_len ({f(self.tokens_untruncated)} whole)",
            f"scored tokens          {f(self.scored_tokens)}  what the loss scores "
            f"({f(self.scored_tokens_untruncated)} whole)",
            f"scored tokens per row  {f(self.scored_tokens_per_row)} mean at seq_len; whole rows: {_spread(sp)}",
            f"row length (tokens)    {_spread(self.lengths)}",
            f"seq_len                {f(self.seq_len)}  {rule}",
            f"truncation             {cut}",
        ]
        lines += [f"loss policy            {p}" if i == 0 else f"                       {p}" for i,
                  p in enumerate(self.loss_policy)]
        if self.ignored_fields:
            ign = ", ".join(f"{k} ({f(n)} rows)" for k, n in self.ignored_fields.items())
            lines.append(f"fields not read        {ign}; map them with --field ROLE=KEY to use them")
        if self.mixed_formats:
            lines.append(f"formats mixed          {self.mixed_formats}")
        if self.skipped_rows:
            lines.append(f"rows skipped           {f(self.skipped_rows)}: " + "; ".join(self.skipped))
        lines.append(f"took                   {self.seconds:.3g} s ({f(round(self.rows_per_second))} rows/s)")
        return "\n".join(lines)

    def as_values(self) -> dict[str, Value]:
        """The plan's entries: ``rows``, ``tokens_read``, ``scored_tokens``,
        ``scored_tokens_per_row`` and ``seq_len``, each with its evidence.

        ``seq_len``'s kind follows its rule: ``measured`` (the longest row), ``derived`` (a
        quantile, or cut to the model's positions) or ``given``.

        Examples:
            >>> rows = [{"input_ids": [1, 2, 3, 4]},
            ...         {"input_ids": list(range(1, 9)), "labels": [-100] * 4 + [5, 6, 7, 8]}]
            >>> values = profile_corpus(rows, quantile=0.5).as_values()
            >>> {name: v.value for name, v in values.items()}
            {'rows': 2, 'tokens_read': 8, 'scored_tokens': 3, 'scored_tokens_per_row': 1.5, 'seq_len': 4}
            >>> values["seq_len"].kind, values["seq_len"].source.split("; ")[1]
            ('derived', 'truncation cuts 1 rows and 57.14% of the scored tokens')
        """
        src = self.source
        return {
            "rows": Value(self.rows, "measured",
                          f"rows read from {src}" + (f"; {self.mixed_formats}" if self.mixed_formats else ""),
                          {"formats": self.formats, "ignored_fields": self.ignored_fields,
                           "skipped_rows": self.skipped_rows, "sha256": self.sha256}),
            "tokens_read": Value(self.tokens_read, "measured",
                                 f"tokens of {src} at seq_len {self.seq_len}, as the training loader tokenizes them",
                                 {"tokens_untruncated": self.tokens_untruncated}, unit="tokens"),
            "scored_tokens": Value(self.scored_tokens, "measured",
                                   f"labels the loss scores in {src} at seq_len {self.seq_len}, after the causal shift",
                                   {"loss_policy": self.loss_policy,
                                    "scored_tokens_untruncated": self.scored_tokens_untruncated},
                                   seconds=self.seconds, unit="tokens"),
            "scored_tokens_per_row": Value(self.scored_tokens_per_row, "measured",
                                           f"scored tokens per row of {src} at seq_len {self.seq_len}, the mean",
                                           {"untruncated": self.scored_per_row, "bins_untruncated": self.scored_bins},
                                           unit="tokens"),
            "seq_len": self._seq_len_value(),
        }

    def _seq_len_value(self) -> Value:
        """``seq_len`` with its rule's kind and source, and the truncation it causes as its evidence."""
        src = self.source
        truncation = {
            "truncated_rows": self.truncated_rows,
            "truncated_scored_tokens": self.truncated_scored_tokens,
            "truncated_scored_share": self.truncated_scored_share,
            "unscored_rows": self.unscored_rows,
        }
        if self.seq_len_rule == "longest":
            seq = Value(self.seq_len, "measured", f"the longest row of {src}, in tokens, so truncation cuts nothing",
                        {"rule": "longest", "lengths": self.lengths, "length_bins": self.length_bins, **truncation})
        elif self.seq_len_rule == "quantile":
            seq = Value(self.seq_len, "derived",
                        f"the {self.quantile:g} quantile (nearest rank) of row lengths in {src}; truncation cuts "
                        f"{self.truncated_rows:,} rows and {self.truncated_scored_share:.2%} of the scored tokens",
                        {"rule": "quantile", "quantile": self.quantile, "lengths": self.lengths,
                         "length_bins": self.length_bins, **truncation})
        elif self.seq_len_rule == "positions":
            seq = Value(self.seq_len, "derived",
                        f"the model's positions (max_position_embeddings {self.seq_len}), shorter than the longest row "
                        f"of {src} ({self.longest:,} tokens); truncation at it cuts {self.truncated_rows:,} rows and "
                        f"{self.truncated_scored_share:.2%} of the scored tokens",
                        {"rule": "positions", "positions": self.seq_len, "longest": self.longest,
                         "lengths": self.lengths,
                         "length_bins": self.length_bins, **truncation})
        else:
            seq = Value(self.seq_len, "given",
                        f"given; truncation at it cuts {self.truncated_rows:,} rows of {src} and "
                        f"{self.truncated_scored_share:.2%} of the scored tokens",
                        {"rule": "given", "lengths": self.lengths, "length_bins": self.length_bins, **truncation})
        return seq


def _spread(q: dict[str, int]) -> str:
    f = format_number
    return f"min {f(q['min'])}, p10 {f(q['p10'])}, median {f(q['p50'])}, p90 {f(q['p90'])}, max {f(q['max'])}"


class _Histograms:
    """The streaming pass's counts (numpy arrays, grown to the longest row)."""

    def __init__(self) -> None:
        import numpy as np

        self.np = np
        z = np.zeros(0, dtype=np.int64)
        self.lengths, self.scored_at, self.first_scored, self.scored_per_row = z, z, z.copy(), z.copy()
        self.longest: tuple[int, str] = (0, "")  # the longest row's tokens and where it came from

    def _add(self, acc: Any, values: Any) -> Any:
        counts = self.np.bincount(values)
        if len(counts) > len(acc):
            acc = self.np.concatenate([acc, self.np.zeros(len(counts) - len(acc), dtype=acc.dtype)])
        acc[: len(counts)] += counts
        return acc

    def add(self, rows: list[TokenizedRow], seq_len: int | None, problems: Problems) -> None:
        np = self.np
        lens = np.fromiter((len(r.input_ids) for r in rows), dtype=np.int64, count=len(rows))
        n = int(lens.sum())
        labels = np.fromiter(chain.from_iterable(r.labels for r in rows), dtype=np.int64, count=n)
        starts = np.cumsum(lens) - lens
        rowid = np.repeat(np.arange(len(rows)), lens)
        pos = np.arange(n) - starts[rowid]
        scored = (labels != -100) & (pos >= 1)
        idx = np.flatnonzero(scored)
        first = np.zeros(len(rows), dtype=np.int64)
        ids, at = np.unique(rowid[idx], return_index=True)
        first[ids] = pos[idx[at]]
        if seq_len is not None and (first >= seq_len).any():
            for i in np.flatnonzero(first >= seq_len):
                problems.record(rows[i].where,
                                f"has {int(first[i]):,} tokens before its first scored token, so at seq_len {seq_len} "
                                "nothing is left to score",
                                "raise --seq-len or shorten the prompt")
            keep = [r for r, f in zip(rows, first) if f < seq_len]
            if keep:
                self.add(keep, seq_len, problems)
            return
        top = int(lens.argmax())
        if int(lens[top]) > self.longest[0]:
            self.longest = (int(lens[top]), rows[top].where)
        self.lengths = self._add(self.lengths, lens)
        self.scored_at = self._add(self.scored_at, pos[idx])
        self.first_scored = self._add(self.first_scored, first)
        self.scored_per_row = self._add(self.scored_per_row, np.bincount(rowid[idx], minlength=len(rows)))

    @staticmethod
    def as_dict(arr: Any) -> dict[int, int]:
        return {int(k): int(c) for k, c in enumerate(arr.tolist()) if c}


def profile_corpus(path_or_rows: RowSource, tokenizer: PreTrainedTokenizerBase | None = None,
                   seq_len: int | None = None, quantile: float | None = None, *,
                   fields: Mapping[str, str] | None = None, bad_rows: str = "raise", batch_size: int = 1000,
                   on_progress: Callable[[RowReader], None] | None = None,
                   positions: int | None = None) -> CorpusProfile:
    """Profile a corpus: rows, tokens read, scored tokens, the length, the loss policy.

    Args:
        path_or_rows: a JSON Lines path, or rows in memory (dicts or TokenizedRows).
        tokenizer: the fast tokenizer the run trains with (not needed for input_ids rows).
        seq_len: the length to train at (``given``); default the longest row (``measured``).
        quantile: instead, the length that keeps this share of rows whole (``derived``),
            with the share of scored tokens truncation cuts reported.
        fields: read other keys as the known roles, e.g. ``{"completion": "answer_cot"}``.
        bad_rows: ``raise`` / ``report`` / ``skip`` (see :func:`leadline.corpus.read_rows`).
            With ``seq_len`` given, a row with nothing left to score at it is a bad row.
        batch_size: rows per tokenizer call.
        on_progress: called with the reader after each batch (``rows``, ``bytes_read``).
        positions: the model's positions (``max_position_embeddings``): a ``seq_len`` beyond
            them is refused; a longest row or quantile beyond them is cut to them (rule
            ``positions``), with the share of scored tokens the cut costs in its source.

    Raises:
        InputError: bad rows, an empty corpus, or a corpus with no scored tokens.

    Examples:
        Rows already tokenized need no tokenizer (rows of 4 and 8 tokens; the second scores its
        last 4):

        >>> rows = [{"input_ids": [1, 2, 3, 4]}, {"input_ids": list(range(1, 9)), "labels": [-100] * 4 + [5, 6, 7, 8]}]
        >>> profile = profile_corpus(rows)
        >>> profile.rows, profile.seq_len, profile.seq_len_rule, profile.tokens_read, profile.scored_tokens
        (2, 8, 'longest', 12, 7)
        >>> profile = profile_corpus(rows, positions=6)  # the model reads 6 positions at most
        >>> profile.seq_len, profile.seq_len_rule, profile.scored_tokens
        (6, 'positions', 5)
        >>> profile_corpus(rows, seq_len=3)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: rows[1] has 4 tokens before its first scored token, so at seq_len 3 nothing is ...
    """
    _check_length_arguments(seq_len, quantile, positions)
    hist = _histograms()
    t0 = time.perf_counter()
    problems = Problems(bad_rows)
    reader = RowReader(path_or_rows, fields=fields, problems=problems)
    enc = RowEncoder(tokenizer, problems)
    _stream(reader, enc, hist, problems, seq_len, batch_size, on_progress)
    problems.finish()
    lengths = hist.as_dict(hist.lengths)
    if not lengths:
        raise InputError(f"{reader.source} has no usable row ({problems.summary()}); fix the rows or pass another file")
    length, rule = _length_and_rule(lengths, seq_len, quantile, positions)
    profile = _summarize(reader, enc, problems, hist, length, rule, quantile, time.perf_counter() - t0)
    profile.longest_where, profile.positions = hist.longest[1], positions
    profile.changes = changes_of(profile)
    return profile


def _check_length_arguments(seq_len: int | None, quantile: float | None, positions: int | None) -> None:
    if seq_len is not None and quantile is not None:
        raise InputError("pass seq_len or quantile, not both; seq_len fixes the length, quantile derives it from the "
                         "rows")
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2):
        raise InputError(f"seq_len must be an int of at least 2 tokens, got {seq_len!r}")
    if seq_len is not None and positions is not None and seq_len > positions:
        raise InputError(f"seq_len {seq_len} (--seq-len) is longer than the model's positions (max_position_embeddings "
                         f"{positions}); pass {positions} or less")
    if quantile is not None and not 0.0 < float(quantile) <= 1.0:
        raise InputError(f"quantile must be in (0, 1], got {quantile}; pass e.g. 0.99 to keep 99% of rows whole")


def _histograms() -> _Histograms:
    try:
        return _Histograms()
    except ImportError:
        raise InputError("profiling a corpus needs numpy; pip install 'leadline[hf]'") from None


def _stream(reader: RowReader, enc: RowEncoder, hist: _Histograms, problems: Problems, seq_len: int | None,
            batch_size: int, on_progress: Callable[[RowReader], None] | None) -> None:
    """The one pass: the rows read and tokenized ``batch_size`` at a time, folded into ``hist``."""
    for batch in batches(reader, max(1, int(batch_size))):
        rows = enc.encode(batch)
        if rows:
            hist.add(rows, seq_len, problems)
        if on_progress is not None:
            on_progress(reader)


def changes_of(profile: CorpusProfile) -> list[str]:
    """What training at the profile's length does to the rows as given, one sentence each: rows
    cut to the length, rows left with nothing to score (left out of training), rows in mixed
    formats, bad rows skipped.

    Examples:
        >>> rows = [{"input_ids": list(range(1, 41))}] + [{"input_ids": [1, 2, 3, 4]}] * 3
        >>> note = changes_of(profile_corpus(rows, positions=8))[0]
        >>> print(note.split(": ")[0])
        1 row of the rows given (rows[0]) has 40 tokens and is cut to 8, the model's positions
        >>> print(note.split("; ")[1])
        the model reads no more, so split or shorten it to keep it whole
        >>> changes_of(profile_corpus(rows))
        []
    """
    f = format_number
    notes = []
    p = profile
    if p.truncated_rows:
        where = f" ({p.longest_where})" if p.longest_where else ""
        at_positions = p.seq_len_rule == "positions" or (p.positions is not None and p.seq_len >= p.positions)
        length = f"seq_len {f(p.seq_len)}"
        if at_positions:
            length = f"{f(p.seq_len)}, the model's positions"
        elif p.seq_len_rule == "quantile" and p.quantile is not None:
            length += f" (the {p.quantile:g} quantile of row lengths)"
        lost = (f"{f(p.truncated_scored_tokens)} of {'its' if p.truncated_rows == 1 else 'their'} scored tokens "
                f"({p.truncated_scored_share:.2%} of the scored tokens) are not trained on")
        them = "it" if p.truncated_rows == 1 else "them"
        fix = (f"the model reads no more, so split or shorten {them} to keep {them} whole"
               if at_positions else f"a seq_len of {f(p.longest)} (--seq-len) keeps {them} whole")
        if p.truncated_rows == 1:
            notes.append(f"1 row of {p.source}{where} has {f(p.longest)} tokens and is cut to {length}: {lost}; {fix}")
        else:
            at = f", {p.longest_where}," if p.longest_where else ""
            notes.append(f"{f(p.truncated_rows)} rows of {p.source} are longer than {length} and are cut to it (the "
                         f"longest{at} has {f(p.longest)} tokens): {lost}; {fix}")
    if p.unscored_rows:
        n = p.unscored_rows
        notes.append(f"{f(n)} {'row' if n == 1 else 'rows'} of {p.source} {'has' if n == 1 else 'have'} nothing left "
                     f"to score at seq_len {f(p.seq_len)} (the prompt fills it) and {'is' if n == 1 else 'are'} left "
                     "out of training; raise --seq-len or shorten the prompts")
    if p.mixed_formats:
        notes.append(p.mixed_formats)
    if p.skipped_rows:
        notes.append(f"{f(p.skipped_rows)} bad {'row' if p.skipped_rows == 1 else 'rows'} of {p.source} skipped and "
                     "left out of training: " + "; ".join(p.skipped[:3]))
    return notes


def data_notes(profile: CorpusProfile) -> list[str]:
    """What leadline changes in the user's rows, one sentence each (the profile's ``changes``):
    the notes every command that trains on the rows prints and adds to the plan.

    Examples:
        >>> data_notes(profile_corpus([{"input_ids": [1, 2, 3]}, {"input_ids": [4]}], bad_rows="skip"))
        ['1 bad row of the rows given skipped and left out of training: rows[1] has one token and no labels ...']
    """
    return list(profile.changes)


def _length_and_rule(lengths: dict[int, int], seq_len: int | None, quantile: float | None,
                     positions: int | None) -> tuple[int, str]:
    """The length to train at and its rule: ``given``, ``quantile`` or ``longest``; ``positions``
    where the model reads fewer."""
    if seq_len is not None:
        length, rule = seq_len, "given"
    elif quantile is not None:
        length, rule = L.length_at_quantile(lengths, float(quantile)), "quantile"
    else:
        length, rule = max(lengths), "longest"
    if positions is not None and length > positions:
        length, rule = positions, "positions"
    return length, rule


def _summarize(reader: RowReader, enc: RowEncoder, problems: Problems, hist: _Histograms, length: int, rule: str,
               quantile: float | None, seconds: float) -> CorpusProfile:
    lengths = hist.as_dict(hist.lengths)
    scored_at = hist.as_dict(hist.scored_at)
    first = hist.as_dict(hist.first_scored)
    per_row = hist.as_dict(hist.scored_per_row)
    longest = max(lengths)
    rows = L.total(lengths)
    scored_whole = L.total(scored_at)
    cut = L.count_at_or_above(scored_at, length)
    scored = scored_whole - cut
    if scored == 0:
        raise InputError(f"no row of {reader.source} has a token the loss scores at seq_len {length}; "
                         "check the labels or the completion fields, or raise the length")
    return CorpusProfile(
        source=reader.source,
        path=str(reader.path) if reader.path is not None else None,
        sha256=reader.sha256,
        rows=rows,
        seq_len=length,
        seq_len_rule=rule,
        quantile=float(quantile) if quantile is not None else None,
        longest=longest,
        tokens_read=L.tokens_kept(lengths, length),
        tokens_untruncated=L.tokens_kept(lengths, longest),
        scored_tokens=scored,
        scored_tokens_untruncated=scored_whole,
        scored_tokens_per_row=scored / rows,
        scored_per_row=L.quantiles(per_row),
        lengths=L.quantiles(lengths),
        truncated_rows=L.count_at_or_above(lengths, length + 1),
        truncated_scored_tokens=cut,
        truncated_scored_share=cut / scored_whole,
        unscored_rows=L.count_at_or_above(first, length),
        loss_policy=enc.policy(),
        formats={k: n for k, n in enc.formats.most_common()},
        ignored_fields=dict(reader.ignored.most_common()),
        skipped_rows=problems.count,
        skipped=list(problems.first),
        seconds=seconds,
        length_bins=L.binned(lengths),
        scored_bins=L.binned(per_row),
    )
