"""row_losses: the held-out reader, one mean loss per row over its scored tokens.

The one place leadline reads per-row losses (the look-ahead, the schedule's checks and the
user's test verdict all read through it). It runs many times inside derive() (every walk point
of the first step, every look-ahead check), so it is built for speed: few large forwards, and
the vocabulary projection only at the positions the loss scores.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from leadline.corpus.collate import collate
from leadline.corpus.tokenize import TokenizedRow
from leadline.errors import InputError

if TYPE_CHECKING:
    import torch

MAX_TOKENS = 16384
"""Padded tokens a forward of the reader holds when no ``micro_batch`` is given. On a
launch-bound card a forward costs nearly the same at 1 row as at many, so the reader's cost is
its number of forwards (measured: docs/corpus.md). Without gradients a forward keeps one
layer's activations; an OOM halves the forward and goes on."""


def _accepts_logits_to_keep(model: Any) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "logits_to_keep" in inspect.signature(getattr(base, "forward", base)).parameters
    except (TypeError, ValueError):
        return False


def _chunks(order: list[int], lengths: list[int], micro_batch: int | None, max_tokens: int) -> list[list[int]]:
    """Consecutive runs of ``order`` (rows sorted by length): ``micro_batch`` rows each, or as
    many as keep rows x the longest length within ``max_tokens`` (at least one row)."""
    if micro_batch is not None:
        return [order[s:s + micro_batch] for s in range(0, len(order), micro_batch)]
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * max(lengths[i], lengths[cur[-1]]) > max_tokens:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def _oom_types() -> tuple[type[BaseException], ...]:
    import torch

    return tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                             getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)


def row_losses(model: torch.nn.Module, rows: Sequence[TokenizedRow], micro_batch: int | None = None,
               device: torch.device | str | None = None, *,
               pad_id: int = 0,
               max_tokens: int = MAX_TOKENS) -> list[float]:
    """Per-row mean cross-entropy over each row's scored tokens, in the order of ``rows``.

    loss_i = (1 / s_i) * sum over scored positions p of -log softmax(logits[p-1])[labels[p]],
    with ``s_i`` the row's scored tokens (the labels after the causal shift).

    Runs in eval mode under ``torch.no_grad()`` and puts ``model.training`` back as it was,
    on every exit path. Rows go through sorted by length so that little padding is added
    (padding moves a row's loss slightly: docs/corpus.md), in forwards of ``micro_batch`` rows, or
    (default) of as many rows as keep the padded tokens within ``max_tokens``; a forward that
    runs out of memory is split in two and read again. The logits are computed only at the
    positions some row of the forward scores (``logits_to_keep``, where the model takes it).
    The result is in the order given. ``device``: where the batches go (default: the model's).

    Raises:
        InputError: a row with no scored token (its mean is undefined), ``micro_batch < 1`` or
            ``max_tokens < 1``.

    Examples:
        A model whose logits are uniform over 10 tokens scores every row ln 10:

        >>> import torch
        >>> from types import SimpleNamespace
        >>> class Uniform(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w = torch.nn.Parameter(torch.zeros(10))
        ...     def forward(self, input_ids, attention_mask=None):
        ...         return SimpleNamespace(logits=self.w.expand(*input_ids.shape, 10))
        >>> model = Uniform()
        >>> rows = [TokenizedRow.from_labels([5, 6, 7], [-100, 6, 7]), TokenizedRow.from_labels([8, 9], [8, 9])]
        >>> [round(x, 4) for x in row_losses(model, rows)], model.training
        ([2.3026, 2.3026], True)
        >>> row_losses(model, rows, micro_batch=0)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: row_losses needs micro_batch an int >= 1 (or None for forwards of up to ...
    """
    _check_arguments(rows, micro_batch, max_tokens)
    if device is None:
        device = next(model.parameters()).device
    lengths = [len(r.input_ids) for r in rows]
    order = sorted(range(len(rows)), key=lambda i: lengths[i])
    pending = _chunks(order, lengths, micro_batch, max_tokens)
    keep = _accepts_logits_to_keep(model)
    out = [0.0] * len(rows)

    def read(chunk: list[int]) -> None:
        for i, loss in zip(chunk, _chunk_losses(model, [rows[i] for i in chunk], pad_id, device, keep)):
            out[i] = loss

    _read_in_eval(model, pending, read, device)
    return out


def _check_arguments(rows: Sequence[TokenizedRow], micro_batch: int | None, max_tokens: int) -> None:
    if micro_batch is not None and (isinstance(micro_batch, bool) or not isinstance(micro_batch, int)
                                    or micro_batch < 1):
        raise InputError("row_losses needs micro_batch an int >= 1 (or None for forwards of up to max_tokens), got "
                         f"{micro_batch!r}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InputError(f"row_losses needs max_tokens an int >= 1, got {max_tokens!r}")
    for i, r in enumerate(rows):
        if r.scored_tokens < 1:
            raise InputError(f"row {i} ({r.where or 'in memory'}) has no scored token, so it has no mean loss; drop it "
                             "from the held-out rows")


def _chunk_losses(model: torch.nn.Module, rows: list[TokenizedRow], pad_id: int, device: torch.device | str,
                  keep: bool) -> list[float]:
    """One forward of ``rows``: each row's mean loss over its scored tokens, the logits computed
    only at the positions some row scores (``keep``: through the model's ``logits_to_keep``)."""
    import torch.nn.functional as F

    counts = [r.scored_tokens for r in rows]
    mb = collate(rows, pad_id)
    shifted = mb.labels[:, 1:]
    cols = (shifted != -100).any(dim=0).nonzero().flatten()  # the positions some row scores
    mb = mb.to(device)
    targets = shifted.index_select(1, cols).to(device)
    if keep:
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                       logits_to_keep=cols.to(device)).logits
    else:
        logits = model(input_ids=mb.input_ids,
                       attention_mask=mb.attention_mask).logits.index_select(1, cols.to(device))
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100,
                         reduction="none")
    sums = ce.view(len(rows), -1).sum(dim=1).tolist()
    return [s / c for s, c in zip(sums, counts)]


def _read_in_eval(model: torch.nn.Module, pending: list[list[int]], read: Callable[[list[int]], None],
                  device: torch.device | str) -> None:
    """``read`` each chunk of ``pending`` in eval mode under ``torch.no_grad()``; a chunk that runs
    out of memory is split in two and read again (a single row's is raised). ``model.training``
    is put back on every exit path."""
    import torch

    oom = _oom_types()
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            while pending:
                chunk = pending.pop(0)
                failed = False
                try:
                    read(chunk)
                except oom:
                    if len(chunk) == 1:
                        raise
                    failed = True
                if failed:  # outside the handler, so the failed forward's tensors are freed first
                    if str(device).startswith("cuda"):
                        torch.cuda.empty_cache()
                    half = len(chunk) // 2
                    pending[:0] = [chunk[:half], chunk[half:]]
    finally:
        model.train(was_training)
