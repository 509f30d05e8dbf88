"""pack_steps: several rows in one sequence, with the boundaries the attention cannot cross.

Each pack is one sequence of at most ``seq_len`` tokens holding whole rows in their order
(greedy: a row starts a new pack when it does not fit the current one; a row longer than
``seq_len`` is truncated to it, as the loader would). Inside a pack:

- the position ids restart at 0 for each row, so rotary/learned positions match the row alone;
- the first label of each row is -100, so no row's first token is predicted from the row
  before it (a row alone never scores its first token either: the scored tokens are equal);
- the attention stays inside a row: ``block_mask`` builds a 4D block-diagonal causal mask
  (boolean for SDPA, additive for eager), ``varlen`` passes only ``position_ids`` and lets the
  model cut the sequence where they restart (flash-attention's varlen path).

The packed loss is the mean over the pack's scored tokens, which equals the rows' own mean
losses weighted by their scored tokens; gradients likewise (tested to float tolerance).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from leadline.corpus.collate import MicroBatch, collate
from leadline.corpus.tokenize import TokenizedRow
from leadline.errors import InputError

if TYPE_CHECKING:
    import torch

_VARLEN = ("flash_attention_2", "flash_attention_3")
_BLOCK = {"sdpa": None, "eager": "additive"}


@dataclass
class Packing:
    """The packs, how their boundaries are kept, and what packing bought.

    Attributes:
        batches: one :class:`MicroBatch` per pack (one sequence each; ``batch.rows`` says which).
        attention: ``block_mask``, ``varlen``, or ``padded`` (no packing: one row per batch).
        note: why packing fell back, or None.
        truncated_rows: rows cut to ``seq_len``.
        fill: the share of ``seq_len`` the packs' tokens fill, on average.
        groups: the row indices of each pack (what each ``batch.rows`` holds).

    Examples:
        >>> rows = [TokenizedRow.from_labels(list(range(1, n + 1)), list(range(1, n + 1))) for n in (3, 2, 4)]
        >>> packing = pack_steps(rows, 6)
        >>> len(packing), packing.attention, packing.groups, packing.fill  # (5 + 4) / (2 x 6)
        (2, 'block_mask', [[0, 1], [2]], 0.75)
    """

    batches: list[MicroBatch]
    attention: str
    seq_len: int
    note: str | None = None
    truncated_rows: int = 0
    fill: float = 0.0
    groups: list[list[int]] = field(default_factory=list, repr=False)

    def __iter__(self) -> Iterator[MicroBatch]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def pack_groups(lengths: Sequence[int], seq_len: int) -> list[list[int]]:
    """Greedy in order: the row indices of each pack, every pack's lengths summing to <= seq_len.

    A row longer than ``seq_len`` counts as ``seq_len`` (it is truncated) and fills a pack.

    Examples:
        >>> pack_groups([3, 4, 2, 5, 1], 6)
        [[0], [1, 2], [3, 4]]
        >>> pack_groups([9, 1], 6)
        [[0], [1]]
    """
    groups: list[list[int]] = []
    room = 0
    for i, n in enumerate(lengths):
        n = min(n, seq_len)
        if not groups or n > room:
            groups.append([])
            room = seq_len
        groups[-1].append(i)
        room -= n
    return groups


def attention_for(model: torch.nn.Module) -> tuple[str, torch.dtype | None, str | None]:
    """How ``model`` keeps packed rows apart: (attention, mask dtype, note when it cannot).

    Read from ``model.config._attn_implementation``: ``flash_attention_2/3`` -> ``varlen``;
    ``sdpa`` -> ``block_mask`` boolean; ``eager`` -> ``block_mask`` additive in the model's
    floating dtype (float32 otherwise); anything else -> ``padded``, with the note.

    Examples:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> attention_for(SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2")))
        ('varlen', None, None)
        >>> attention_for(SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager"), dtype=torch.bfloat16))
        ('block_mask', torch.bfloat16, None)
        >>> attention_for(torch.nn.Linear(4, 2))[2]
        'a model without a Hugging Face config takes neither a 4D block mask nor varlen position ids here, ...'
    """
    cfg = getattr(model, "config", None)
    impl = getattr(cfg, "_attn_implementation", None) if cfg is not None else None
    if impl in _VARLEN:
        return "varlen", None, None
    if impl in _BLOCK:
        dtype = None
        if _BLOCK[impl] == "additive":
            dtype = getattr(model, "dtype", None)
            import torch

            if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
                dtype = torch.float32
        return "block_mask", dtype, None
    what = f"attention implementation {impl!r}" if impl else "a model without a Hugging Face config"
    return ("padded", None,
            f"{what} takes neither a 4D block mask nor varlen position ids here, so rows are not packed (one row per "
            "micro-batch)")


def pack_steps(rows: Sequence[TokenizedRow], seq_len: int, *, model: torch.nn.Module | None = None,
               attention: str = "auto") -> Packing:
    """Pack ``rows`` into sequences of at most ``seq_len`` tokens with per-row boundaries.

    Args:
        rows: tokenized rows, in the order they should train.
        seq_len: the longest sequence a pack may be.
        model: read for its attention implementation when ``attention="auto"``
            (``flash_attention_2/3`` -> ``varlen``; ``sdpa`` -> ``block_mask`` boolean;
            ``eager`` -> ``block_mask`` additive in the model's dtype; anything else -> no packing,
            with a note). Without a model, ``auto`` means ``block_mask`` boolean (SDPA).
        attention: ``auto``, ``block_mask``, ``varlen`` or ``padded`` (no packing).

    Returns:
        A :class:`Packing`; ``model(**batch.model_inputs())`` runs a pack.

    Examples:
        Rows of 3 and 2 tokens fill one pack of 6; each row's positions restart at 0 and its first
        label is -100, so the pack scores what the rows alone score:

        >>> rows = [TokenizedRow.from_labels([1, 2, 3], [1, 2, 3]), TokenizedRow.from_labels([4, 5], [4, 5])]
        >>> batch = pack_steps(rows, 6).batches[0]
        >>> batch.input_ids.tolist(), batch.position_ids.tolist(), batch.labels.tolist()
        ([[1, 2, 3, 4, 5]], [[0, 1, 2, 0, 1]], [[-100, 2, 3, -100, 5]])
        >>> batch.scored_tokens, batch.rows, batch.model_inputs()["attention_mask"].shape
        (3, (0, 1), torch.Size([1, 1, 5, 5]))
        >>> pack_steps(rows, 6, attention="flat")
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: attention='flat' is not one of auto, block_mask, varlen, padded
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise InputError(f"pack_steps needs seq_len an int of at least 2 tokens, got {seq_len!r}")
    if not rows:
        raise InputError("pack_steps needs at least one row; pass a non-empty list of TokenizedRow")
    note = None
    dtype = None
    if attention == "auto":
        attention, dtype, note = attention_for(model) if model is not None else ("block_mask", None, None)
    elif attention not in ("block_mask", "varlen", "padded"):
        raise InputError(f"attention={attention!r} is not one of auto, block_mask, varlen, padded")
    elif attention == "block_mask" and model is not None:
        _, dtype, _ = attention_for(model)
    truncated = sum(1 for r in rows if len(r.input_ids) > seq_len)
    rows = [r.truncated(seq_len) for r in rows]
    if attention == "padded":
        batches = []
        for i, r in enumerate(rows):
            b = collate([r], pad_id=0)
            b.rows = (i,)
            batches.append(b)
        groups = [[i] for i in range(len(rows))]
    else:
        groups = pack_groups([len(r.input_ids) for r in rows], seq_len)
        batches = [_pack([rows[i] for i in g], tuple(g), attention, dtype) for g in groups]
    fill = sum(b.tokens for b in batches) / (len(batches) * seq_len)
    return Packing(batches, attention, seq_len, note, truncated, fill, groups)


def _pack(rows: list[TokenizedRow], idx: tuple[int, ...], attention: str, dtype: Any) -> MicroBatch:
    import torch

    ids: list[int] = []
    labels: list[int] = []
    pos: list[int] = []
    for r in rows:
        ids += r.input_ids
        labels += [-100, *r.labels[1:]]
        pos += range(len(r.input_ids))
    n = len(ids)
    return MicroBatch(
        input_ids=torch.tensor([ids], dtype=torch.long),
        attention_mask=torch.ones(1, n, dtype=torch.long),
        labels=torch.tensor([labels], dtype=torch.long),
        scored_tokens=sum(r.scored_tokens for r in rows),
        tokens=n,
        position_ids=torch.tensor([pos], dtype=torch.long),
        attention=attention,
        rows=idx,
        mask_dtype=dtype,
    )
