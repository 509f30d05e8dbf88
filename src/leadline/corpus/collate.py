"""Micro-batches from rows: right padding, the attention mask, labels, and the scored tokens
counted on the host before anything moves to a device (no synchronisation to count them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from leadline.corpus.tokenize import TokenizedRow
from leadline.errors import InputError

if TYPE_CHECKING:
    import torch

    from leadline.memory_readings import Device


@dataclass
class MicroBatch:
    """Rows as tensors, with the counts a step needs kept as host ints.

    Attributes:
        input_ids, labels: ``(rows, length)`` long tensors; pad labels are -100.
        attention_mask: ``(rows, length)`` 1 for a token, 0 for padding.
        scored_tokens: the labels the loss scores (after the shift), counted on the host.
        tokens: the non-pad tokens.
        position_ids: for packed sequences, positions restarting at 0 for each row.
        attention: ``padded`` (one row per line, the 2D mask), ``block_mask`` (packed; a 4D
            block-diagonal causal mask for SDPA/eager is built by :meth:`model_inputs`) or
            ``varlen`` (packed; the model reads the boundaries from ``position_ids``, as
            flash-attention's varlen path does).
        rows: the indices of the rows it holds, in the order given to :func:`collate` or
            :func:`~leadline.corpus.pack_steps`.
        mask_dtype: ``None`` for a boolean 4D mask (SDPA), else the float dtype of an additive
            mask (eager attention adds it to the scores).

    Examples:
        >>> rows = [TokenizedRow.from_labels([5, 6, 7], [-100, 6, 7]), TokenizedRow.from_labels([8, 9], [8, 9])]
        >>> batch = collate(rows, pad_id=0)
        >>> len(batch), batch.length, batch.scored_tokens, batch.tokens
        (2, 3, 3, 5)
    """

    input_ids: Any
    attention_mask: Any
    labels: Any
    scored_tokens: int
    tokens: int
    position_ids: Any = None
    attention: str = "padded"
    rows: tuple[int, ...] = ()
    mask_dtype: Any = field(default=None, repr=False)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def length(self) -> int:
        """The padded length of each line, in tokens."""
        return int(self.input_ids.shape[1])

    def to(self, device: Device, non_blocking: bool = True) -> MicroBatch:
        """The same batch with its tensors on ``device``; the host counts stay host ints.

        Examples:
            >>> batch = collate([TokenizedRow.from_labels([5, 6, 7], [-100, 6, 7])], pad_id=0).to("cpu")
            >>> batch.input_ids.device.type, type(batch.scored_tokens).__name__
            ('cpu', 'int')
        """
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        return replace(self, input_ids=move(self.input_ids), attention_mask=move(self.attention_mask),
                       labels=move(self.labels), position_ids=move(self.position_ids))

    def model_inputs(self) -> dict[str, Any]:
        """The keyword arguments of ``model(**batch.model_inputs())`` for a causal LM (packed
        batches add ``use_cache=False``: a training forward keeps no cache, and transformers
        reads varlen boundaries from ``position_ids`` only when there is none).

        Examples:
            >>> batch = collate([TokenizedRow.from_labels([5, 6, 7], [-100, 6, 7])], pad_id=0)
            >>> sorted(batch.model_inputs())
            ['attention_mask', 'input_ids', 'labels']
        """
        if self.attention == "padded":
            return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "labels": self.labels}
        # no cache: Hugging Face models read packed boundaries from position_ids only without one
        packed = {"input_ids": self.input_ids, "position_ids": self.position_ids, "labels": self.labels,
                  "use_cache": False}
        if self.attention == "varlen":
            return packed
        return {**packed, "attention_mask": block_causal_mask(self.position_ids, self.mask_dtype)}


def block_causal_mask(position_ids: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The ``(b, 1, L, L)`` mask that lets a token see the earlier tokens of its own row only.

    Rows are told apart by ``position_ids`` restarting at 0. Boolean (True = attend) when
    ``dtype`` is None, else additive: 0 where attended, the dtype's lowest value elsewhere.

    Examples:
        Two rows of 2 and 3 tokens in one sequence:

        >>> import torch
        >>> block_causal_mask(torch.tensor([[0, 1, 0, 1, 2]]))[0, 0].int().tolist()
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]]
        >>> block_causal_mask(torch.tensor([[0, 1]]), torch.float32)[0, 0].tolist()
        [[0.0, -3.4028234663852886e+38], [0.0, 0.0]]
    """
    import torch

    starts = (position_ids == 0).cumsum(-1)  # (b, L): which row each token belongs to
    same = starts[:, :, None] == starts[:, None, :]
    n = position_ids.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool, device=position_ids.device).tril()
    mask = (same & causal)[:, None, :, :]
    if dtype is None:
        return mask
    out = torch.zeros(mask.shape, dtype=dtype, device=position_ids.device)
    return out.masked_fill_(~mask, torch.finfo(dtype).min)


def collate(rows: Sequence[TokenizedRow], pad_id: int | None, pad_to: int | None = None) -> MicroBatch:
    """Right-pad ``rows`` into one :class:`MicroBatch` (host tensors, CPU).

    ``scored_tokens`` is the sum of the rows' own counts, an int computed before any tensor
    exists. Rows longer than ``pad_to`` are an error (truncate them first with
    ``row.truncated(seq_len)``).

    Examples:
        >>> rows = [TokenizedRow.from_labels([5, 6, 7], [-100, 6, 7]), TokenizedRow.from_labels([8, 9], [8, 9])]
        >>> batch = collate(rows, pad_id=0)
        >>> batch.input_ids.tolist(), batch.labels.tolist(), batch.attention_mask.tolist()
        ([[5, 6, 7], [8, 9, 0]], [[-100, 6, 7], [8, 9, -100]], [[1, 1, 1], [1, 1, 0]])
        >>> batch.scored_tokens  # 2 + 1: the first label of a row is never scored
        3
        >>> collate(rows, pad_id=0, pad_to=2)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: a row of 3 tokens does not fit pad_to=2; truncate the rows with row.truncated(2) ...
    """
    import torch

    if not rows:
        raise InputError("collate needs at least one row; pass a non-empty list of TokenizedRow")
    if pad_id is None:
        raise InputError("collate needs a pad id; pass tokenizer.pad_token_id (or the EOS id when the tokenizer has no "
                         "pad token)")
    longest = max(len(r.input_ids) for r in rows)
    length = longest if pad_to is None else int(pad_to)
    if longest > length:
        raise InputError(f"a row of {longest} tokens does not fit pad_to={length}; truncate the rows with "
                         f"row.truncated({length}) first")
    scored = sum(r.scored_tokens for r in rows)
    tokens = sum(len(r.input_ids) for r in rows)
    ids = [list(r.input_ids) + [pad_id] * (length - len(r.input_ids)) for r in rows]
    labels = [list(r.labels) + [-100] * (length - len(r.labels)) for r in rows]
    mask = [[1] * len(r.input_ids) + [0] * (length - len(r.input_ids)) for r in rows]
    return MicroBatch(
        input_ids=torch.tensor(ids, dtype=torch.long),
        attention_mask=torch.tensor(mask, dtype=torch.long),
        labels=torch.tensor(labels, dtype=torch.long),
        scored_tokens=scored,
        tokens=tokens,
        rows=tuple(range(len(rows))),
    )
