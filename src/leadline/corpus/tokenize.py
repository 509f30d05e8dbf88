"""Tokenizing rows exactly as the training loader will, with the fast tokenizer in batches.

The loader followed is TRL's SFT (with ``assistant_only_loss=True`` for chats):

- ``text``: ``tokenizer(text)`` (its special tokens, e.g. a BOS) plus the EOS id when the
  tokens do not already end with it; every token is a label.
- ``prompt``/``completion``: ``tokenizer(prompt)`` and ``tokenizer(prompt + completion)``
  plus the EOS; the first ``len(prompt ids)`` labels are -100, the completion and the EOS
  are scored.
- ``messages``: the chat template (no EOS added: the template writes its own end of turn);
  the assistant turns scored (see :mod:`leadline.corpus.chat`).
- ``instruction``/``input``/``output`` and ``question``/``answer``: a user turn
  (``instruction``, a blank line, ``input``) and an assistant turn through the chat template;
  when the tokenizer has no chat template, prompt ``instruction\\n\\ninput\\n`` (or
  ``question\\n``) and completion ``output`` (``answer``), as above.
- ``input_ids``/``labels``: as given (``-100`` not scored; no labels: every token scored).

**Scored tokens** are counted after the causal shift: the label at position ``p`` is scored
when ``p >= 1`` and ``labels[p] != -100`` (the first label is never predicted; this is what
the Hugging Face loss scores, ``labels[..., 1:]``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any, TypeVar

from leadline.corpus import chat
from leadline.corpus.rows import Example, Problems, RowReader, RowSource
from leadline.errors import InputError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Item = TypeVar("Item")
"""What :func:`batches` groups."""


@dataclass
class TokenizedRow:
    """A row as the model sees it.

    Attributes:
        input_ids: the token ids.
        labels: one per input id, aligned with it (the model shifts), -100 = not scored.
        scored_tokens: ``sum(l != -100 for l in labels[1:])`` — the labels the loss scores.
        where: the file and line (or ``rows[i]``) it came from, for messages.

    Examples:
        >>> row = TokenizedRow.from_labels([1, 2, 3, 4], [-100, -100, 3, 4])
        >>> row.scored_tokens, len(row)
        (2, 4)
    """

    input_ids: list[int]
    labels: list[int]
    scored_tokens: int
    where: str = field(default="", compare=False)

    @classmethod
    def from_labels(cls, input_ids: list[int], labels: list[int], where: str = "") -> TokenizedRow:
        """A row with ``scored_tokens`` counted from its labels after the shift (:func:`count_scored`).

        Examples:
            >>> TokenizedRow.from_labels([5, 6, 7], [5, 6, 7])  # the first label is never predicted
            TokenizedRow(input_ids=[5, 6, 7], labels=[5, 6, 7], scored_tokens=2, where='')
        """
        return cls(input_ids, labels, count_scored(labels), where)

    def __len__(self) -> int:
        return len(self.input_ids)

    def truncated(self, seq_len: int) -> TokenizedRow:
        """The first ``seq_len`` tokens (the loader's truncation keeps the start), scored tokens recounted.

        Examples:
            >>> TokenizedRow.from_labels([1, 2, 3, 4], [-100, 2, 3, 4]).truncated(2)
            TokenizedRow(input_ids=[1, 2], labels=[-100, 2], scored_tokens=1, where='')
        """
        if len(self.input_ids) <= seq_len:
            return self
        return TokenizedRow.from_labels(self.input_ids[:seq_len], self.labels[:seq_len], self.where)


def count_scored(labels: Sequence[int]) -> int:
    """Labels the loss scores after the causal shift: ``labels[1:]`` that are not -100.

    Examples:
        >>> count_scored([-100, 5, -100, 7]), count_scored([5, 6, 7])
        (2, 2)
    """
    return sum(1 for t in labels[1:] if t != -100)


class RowEncoder:
    """Turns batches of :class:`Example` into :class:`TokenizedRow` and records the loss policy.

    Attributes: ``formats`` (rows by kind), ``chat_methods`` (chat rows by how the assistant
    tokens were found: ``generation mask`` or ``prefix difference``), ``boundary_merges``
    (prompt/completion rows whose prompt tokens are not a prefix of the joint tokens).

    Examples:
        A stand-in tokenizer, one id per character and EOS id 0:

        >>> class Chars:
        ...     eos_token_id = 0
        ...     def __len__(self):
        ...         return 128
        ...     def __call__(self, texts, add_special_tokens=True):
        ...         return {"input_ids": [[ord(c) for c in t] for t in texts]}
        >>> enc = RowEncoder(Chars(), Problems())
        >>> enc.encode([Example("prompt_completion", {"prompt": "Q:", "completion": "A"}, "rows[0]")])
        [TokenizedRow(input_ids=[81, 58, 65, 0], labels=[-100, -100, 65, 0], scored_tokens=2, where='rows[0]')]
    """

    def __init__(self, tokenizer: Any, problems: Problems) -> None:
        self.tok = tokenizer
        self.problems = problems
        self.template = chat.template_of(tokenizer) if tokenizer is not None else None
        self.generation = chat.has_generation_markers(self.template)
        self.eos_id = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
        self.vocab = len(tokenizer) if tokenizer is not None else None
        self.formats: Counter[str] = Counter()
        self.chat_methods: Counter[str] = Counter()
        self.boundary_merges = 0

    # ---- one batch ------------------------------------------------------------------------
    def encode(self, batch: Sequence[Example]) -> list[TokenizedRow]:
        """The usable rows of ``batch`` tokenized, in order (a row that fails is recorded).

        One tokenizer call per format in the batch; a row that scores no token is a problem.
        Rows other than ``input_ids``/``labels`` need a tokenizer:

        Examples:
            >>> RowEncoder(None, Problems()).encode([Example("tokenized", {"input_ids": [5, 6], "labels": [5, 6]}, "")])
            [TokenizedRow(input_ids=[5, 6], labels=[5, 6], scored_tokens=1, where='')]
            >>> RowEncoder(None, Problems("raise", "train.jsonl")).encode([Example("text", {"text": "hi"}, "")])
            Traceback (most recent call last):
            ...
            leadline.errors.InputError: train.jsonl has rows in the text format, which need a tokenizer; ...
        """
        out: list[TokenizedRow | None] = [None] * len(batch)
        groups: dict[str, list[int]] = {}
        items: list[Example] = []
        for i, ex in enumerate(batch):
            self.formats[ex.kind] += 1
            ex = self._as_loaded(ex)
            items.append(ex)
            groups.setdefault(ex.kind, []).append(i)
        for kind, idx in groups.items():
            if kind != "tokenized":
                self._need_tokenizer(kind)
            rows = getattr(self, f"_{kind}")([items[i] for i in idx])
            for i, r in zip(idx, rows):
                out[i] = r
        kept = []
        for r in out:
            if r is None:
                continue
            if r.scored_tokens == 0:
                self.problems.record(r.where, "scores no token once tokenized")
                continue
            kept.append(r)
        return kept

    def _as_loaded(self, ex: Example) -> Example:
        """instruction and question/answer rows in the form the loader reads them."""
        d = ex.data
        if ex.kind == "instruction":
            user = d["instruction"] + (f"\n\n{d['input']}" if d.get("input") else "")
            prompt, answer = user, d["output"]
        elif ex.kind == "question_answer":
            prompt, answer = d["question"], d["answer"]
        else:
            return ex
        if self.template is not None:
            msgs = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
            return Example("messages", {"messages": msgs}, ex.where)
        return Example("prompt_completion", {"prompt": prompt + "\n", "completion": answer}, ex.where)

    def _need_tokenizer(self, kind: str) -> None:
        if self.tok is None:
            raise InputError(f"{self.problems.source} has rows in the {kind} format, which need a tokenizer; pass "
                             "tokenizer= (--tokenizer PATH_OR_GGUF)")
        if kind in ("messages", "chat_prompt_completion") and self.template is None:
            raise InputError(f"{self.problems.source} has chat rows but the tokenizer has no chat template; use a "
                             "tokenizer with one or rows in the prompt/completion format")

    def _with_eos(self, ids: list[int]) -> list[int]:
        if self.eos_id is not None and (not ids or ids[-1] != self.eos_id):
            ids.append(self.eos_id)
        return ids

    # ---- the formats ------------------------------------------------------------------------
    def _text(self, exs: list[Example]) -> list[TokenizedRow | None]:
        enc = self.tok([e.data["text"] for e in exs], add_special_tokens=True)["input_ids"]
        out = []
        for e, ids in zip(exs, enc):
            ids = self._with_eos(list(ids))
            out.append(TokenizedRow(ids, list(ids), len(ids) - 1, e.where))
        return out

    def _prompt_completion(self, exs: list[Example]) -> list[TokenizedRow | None]:
        prompts = self.tok([e.data["prompt"] for e in exs], add_special_tokens=True)["input_ids"]
        fulls = self.tok([e.data["prompt"] + e.data["completion"] for e in exs], add_special_tokens=True)["input_ids"]
        out = []
        for e, p, ids in zip(exs, prompts, fulls):
            k = len(p)
            if list(ids[:k]) != list(p):
                self.boundary_merges += 1
            ids = self._with_eos(list(ids))
            labels = [-100] * min(k, len(ids)) + ids[k:]
            out.append(TokenizedRow(ids, labels, len(ids) - max(k, 1), e.where))
        return out

    def _messages(self, exs: list[Example]) -> list[TokenizedRow | None]:
        out: list[TokenizedRow | None] = [None] * len(exs)
        fallback = list(range(len(exs)))
        if self.generation:
            fallback = []
            try:
                pairs: list[Any] = self._generation_masks([e.data["messages"] for e in exs])
            except Exception:  # one row breaks the template: find it row by row
                pairs = [self._generation_one(e) for e in exs]
            for i, (e, pair) in enumerate(zip(exs, pairs)):
                if pair is None:
                    continue
                if not any(pair[1]):
                    fallback.append(i)
                    continue
                ids = list(pair[0])
                out[i] = TokenizedRow.from_labels(ids, chat.masked_labels(ids, pair[1]), e.where)
                self.chat_methods["generation mask"] += 1
        if fallback:
            for i, r in zip(fallback, self._by_spans([exs[i] for i in fallback], chat.assistant_spans)):
                out[i] = r
                if r is not None:
                    self.chat_methods["prefix difference"] += 1
        return out

    def _generation_masks(self, convs: list[Any]) -> list[tuple[Any, Any]]:
        enc = self.tok.apply_chat_template(convs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        return list(zip(enc["input_ids"], enc["assistant_masks"]))

    def _generation_one(self, e: Example) -> tuple[Any, Any] | None:
        try:
            return self._generation_masks([e.data["messages"]])[0]
        except Exception as err:  # jinja raises its own errors for a template's exceptions
            self.problems.record(e.where,
                                 f"cannot be rendered by the tokenizer's chat template ({type(err).__name__}: "
                                 f"{str(err)[:120]})")
            return None

    def _chat_prompt_completion(self, exs: list[Example]) -> list[TokenizedRow | None]:
        return self._by_spans(exs, lambda tok, d: chat.completion_span(tok, d["prompt"], d["completion"]), whole=True)

    def _by_spans(self, exs: list[Example], spans_of: Any, whole: bool = False) -> list[TokenizedRow | None]:
        texts, spans, keep = [], [], []
        for i, e in enumerate(exs):
            try:
                text, sp = spans_of(self.tok, e.data if whole else e.data["messages"])
            except chat.TemplateError as err:
                self.problems.record(e.where, str(err))
                continue
            texts.append(text)
            spans.append(sp)
            keep.append(i)
        out: list[TokenizedRow | None] = [None] * len(exs)
        if not texts:
            return out
        if not getattr(self.tok, "is_fast", False):
            raise InputError("finding the scored tokens of chat rows needs a fast tokenizer (offsets); load the "
                             "tokenizer with use_fast=True")
        enc = self.tok(texts, add_special_tokens=False, return_offsets_mapping=True)
        for i, ids, offs, sp in zip(keep, enc["input_ids"], enc["offset_mapping"], spans):
            ids = list(ids)
            out[i] = TokenizedRow.from_labels(ids, chat.masked_labels(ids, chat.token_mask(offs, sp)), exs[i].where)
        return out

    def _tokenized(self, exs: list[Example]) -> list[TokenizedRow | None]:
        out: list[TokenizedRow | None] = []
        for e in exs:
            ids, labels = e.data["input_ids"], e.data["labels"]
            if self.vocab is not None:
                top = max(max(ids), max(labels))
                if top >= self.vocab:
                    self.problems.record(e.where,
                                         f"has token id {top}, outside the tokenizer's vocabulary of {self.vocab:,}",
                                         "tokenize it with this tokenizer")
                    out.append(None)
                    continue
            out.append(TokenizedRow.from_labels(list(ids), list(labels), e.where))
        return out

    # ---- what it scores, in words ---------------------------------------------------------
    def policy(self) -> list[str]:
        """The loss policy, one line per format seen, and the scored-token convention last.

        Examples:
            >>> enc = RowEncoder(None, Problems())
            >>> _ = enc.encode([Example("tokenized", {"input_ids": [5, 6], "labels": [5, 6]}, "")])
            >>> for line in enc.policy():
            ...     print(line)
            input_ids/labels rows (1): the labels as given, -100 not scored
            scored tokens = labels after the causal shift (labels[1:] != -100)
        """
        lines = []
        f = self.formats
        eos = "the EOS" if self.eos_id is not None else "no EOS (the tokenizer has none)"
        if f["text"]:
            lines.append(f"text rows ({f['text']:,}): every token scored, {eos} appended")
        if f["prompt_completion"] or ((f["instruction"] or f["question_answer"]) and self.template is None):
            lines.append(f"prompt/completion rows: the completion and {eos} scored, the prompt not")
        if self.boundary_merges:
            lines.append(f"{self.boundary_merges:,} prompt/completion rows tokenize differently at the boundary (as "
                         "TRL warns); their first len(prompt) tokens are not scored")
        for kind, what in (("instruction", "instruction/input/output"), ("question_answer", "question/answer")):
            if f[kind]:
                how = ("a user turn and an assistant turn through the chat template" if self.template is not None
                       else "prompt + newline, then the completion")
                lines.append(f"{what} rows ({f[kind]:,}): read as {how}")
        if self.chat_methods:
            how = ", ".join(f"{m} {n:,}" for m, n in sorted(self.chat_methods.items()))
            lines.append(f"chat rows: the assistant turns scored, found by {how}; no EOS added (the template ends each "
                         "turn)")
        if f["chat_prompt_completion"]:
            lines.append("conversational prompt/completion rows: what the template writes after the prompt's "
                         "generation prompt scored")
        if f["tokenized"]:
            lines.append(f"input_ids/labels rows ({f['tokenized']:,}): the labels as given, -100 not scored")
        lines.append("scored tokens = labels after the causal shift (labels[1:] != -100)")
        return lines


def batches(it: Iterable[Item], size: int) -> Iterator[list[Item]]:
    """``it`` in lists of ``size`` items, the last one shorter; streams (holds one list at a time).

    Examples:
        >>> list(batches(range(5), 2))
        [[0, 1], [2, 3], [4]]
    """
    it = iter(it)
    while chunk := list(islice(it, size)):
        yield chunk


def tokenize_rows(
    path_or_rows: RowSource | Iterable[Example],
    tokenizer: PreTrainedTokenizerBase | None,
    *,
    fields: Mapping[str, str] | None = None,
    bad_rows: str = "raise",
    batch_size: int = 1000,
) -> Iterator[TokenizedRow]:
    """Stream :class:`TokenizedRow` from a path, raw rows (dicts) or :class:`Example` rows.

    Tokenizes ``batch_size`` rows per tokenizer call (see the module docstring for what each
    format scores). ``bad_rows`` as in :func:`leadline.corpus.read_rows`; a row that tokenizes
    to no scored token is a bad row too.

    Examples:
        A stand-in tokenizer, one id per character and EOS id 0 (``input_ids`` rows need none):

        >>> class Chars:
        ...     eos_token_id = 0
        ...     def __len__(self):
        ...         return 128
        ...     def __call__(self, texts, add_special_tokens=True):
        ...         return {"input_ids": [[ord(c) for c in t] for t in texts]}
        >>> rows = [{"text": "hi"}, {"prompt": "2+2=", "completion": "4"},
        ...         {"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}]
        >>> for row in tokenize_rows(rows, Chars()):
        ...     print(row.input_ids, row.labels, row.scored_tokens)
        [104, 105, 0] [104, 105, 0] 2
        [50, 43, 50, 61, 52, 0] [-100, -100, -100, -100, 52, 0] 2
        [5, 6, 7] [-100, 6, 7] 2
    """
    problems = Problems(bad_rows)
    if isinstance(path_or_rows, list) and path_or_rows and all(isinstance(r, Example) for r in path_or_rows):
        examples: Iterable[Example] = path_or_rows
    else:
        examples = RowReader(path_or_rows, fields=fields, problems=problems)
    enc = RowEncoder(tokenizer, problems)
    for batch in batches(examples, max(1, int(batch_size))):
        yield from enc.encode(batch)
    problems.finish()
