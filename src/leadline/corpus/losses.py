"""row_losses: the held-out reader, one mean loss per row over its scored tokens.

The one place leadline reads per-row losses (the look-ahead, the schedule's checks and the
user's test verdict all read through it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from leadline.corpus.collate import collate
from leadline.corpus.tokenize import TokenizedRow
from leadline.errors import InputError


def row_losses(model: Any, rows: Sequence[TokenizedRow], micro_batch: int = 8, device: Any = None, *, pad_id: int = 0) -> list[float]:
    """Per-row mean cross-entropy over each row's scored tokens, in the order of ``rows``.

    loss_i = (1 / s_i) * sum over scored positions p of -log softmax(logits[p-1])[labels[p]],
    with ``s_i`` the row's scored tokens (the labels after the causal shift).

    Runs in eval mode under ``torch.no_grad()`` and puts ``model.training`` back as it was,
    on every exit path. Rows go through in micro-batches of ``micro_batch``, sorted by length
    so that little padding is added (padding moves a row's numbers at ~1e-5, seed E12); the
    result is in the order given. ``device``: where the batches go (default: the model's).

    Raises:
        InputError: a row with no scored token (its mean is undefined), or ``micro_batch < 1``.
    """
    import torch
    import torch.nn.functional as F

    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise InputError(f"row_losses needs micro_batch an int >= 1, got {micro_batch!r}")
    for i, r in enumerate(rows):
        if r.scored_tokens < 1:
            raise InputError(f"row {i} ({r.where or 'in memory'}) has no scored token, so it has no mean loss; drop it from the held-out rows")
    if device is None:
        device = next(model.parameters()).device
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].input_ids))
    out = [0.0] * len(rows)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(order), micro_batch):
                chunk = order[start:start + micro_batch]
                counts = [rows[i].scored_tokens for i in chunk]
                mb = collate([rows[i] for i in chunk], pad_id).to(device)
                logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
                ce = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), mb.labels[:, 1:], ignore_index=-100, reduction="none")
                sums = ce.sum(dim=1).tolist()
                for i, s, c in zip(chunk, sums, counts):
                    out[i] = s / c
    finally:
        model.train(was_training)
    return out
