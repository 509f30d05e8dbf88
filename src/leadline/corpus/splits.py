"""Held-out splits as data: a seeded split of row indices into train / held-out / test.

``held_out`` is what derive() decides on (the look-ahead, the schedule's checks); ``test`` is
left untouched for the user's verdict. Both come back as row indices (for ``plan.held_out``)
and, through :meth:`Split.reader`, as a function that returns per-row losses.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError

if TYPE_CHECKING:
    import torch

    from leadline.corpus.tokenize import TokenizedRow
    from leadline.memory_readings import Device


@dataclass(frozen=True)
class Split:
    """Row indices of each part, each sorted ascending; disjoint, together ``range(n)``.

    Built by :func:`split_rows`; ``seed`` is the one that drew it.

    Examples:
        >>> split = Split(train=[0, 3], held_out=[1], test=[2])
        >>> split.held_out, split.as_dict()
        ([1], {'train': [0, 3], 'held_out': [1], 'test': [2], 'seed': 0})
    """

    train: list[int]
    held_out: list[int]
    test: list[int]
    seed: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The form ``plan.held_out`` stores: the three index lists and the seed (see the class)."""
        return {"train": list(self.train), "held_out": list(self.held_out), "test": list(self.test), "seed": self.seed}

    def reader(self, model: torch.nn.Module, rows: Sequence[TokenizedRow], part: str = "held_out", *,
               micro_batch: int | None = None, device: Device | None = None,
               pad_id: int = 0) -> Callable[[], list[float]]:
        """A function returning the per-row mean losses of ``part``'s rows under ``model`` as it is
        when called (what ``LookaheadSchedule(held_out_losses_per_row=...)`` takes).

        Each call reads through :func:`~leadline.corpus.row_losses`; the function's ``rows`` is
        how many rows a read holds.

        Examples:
            A model whose logits are uniform over 10 tokens scores every row ln 10:

            >>> import torch
            >>> from types import SimpleNamespace
            >>> from leadline.corpus import TokenizedRow
            >>> class Uniform(torch.nn.Module):
            ...     def __init__(self):
            ...         super().__init__()
            ...         self.w = torch.nn.Parameter(torch.zeros(10))
            ...     def forward(self, input_ids, attention_mask=None):
            ...         return SimpleNamespace(logits=self.w.expand(*input_ids.shape, 10))
            >>> rows = [TokenizedRow.from_labels([1, 2, 3], [1, 2, 3])] * 4
            >>> split = split_rows(4, held_out=2, test=1)
            >>> read = split.reader(Uniform(), rows)
            >>> read.rows, [round(x, 4) for x in read()]
            (2, [2.3026, 2.3026])
            >>> split.reader(Uniform(), rows, "dev")
            Traceback (most recent call last):
            ...
            leadline.errors.InputError: part='dev' is not one of train, held_out, test
        """
        if part not in ("train", "held_out", "test"):
            raise InputError(f"part={part!r} is not one of train, held_out, test")
        idx = getattr(self, part)
        if not idx:
            raise InputError(f"the split has no {part} rows; give split_rows a larger {part}")
        chosen = [rows[i] for i in idx]

        def losses() -> list[float]:
            from leadline.corpus.losses import row_losses

            return row_losses(model, chosen, micro_batch, device, pad_id=pad_id)

        losses.rows = len(chosen)  # type: ignore[attr-defined]  # what derive's time bound estimates a read from
        return losses


def _count(share: int | float, n: int, name: str) -> int:
    if isinstance(share, bool) or not isinstance(share, (int, float)) or share < 0:
        raise InputError(f"{name} must be a row count (int >= 0) or a share in [0, 1), got {share!r}")
    if isinstance(share, float):
        if share >= 1:
            raise InputError(f"{name}={share} is a share of the rows and must be below 1; pass an int for a row count")
        return round(share * n)
    return share


def split_rows(n: int, held_out: int | float = 0.1, test: int | float = 0.1, seed: int = 0) -> Split:
    """Split ``range(n)`` at random (seeded) into train, held-out and test row indices.

    ``held_out`` and ``test`` are row counts (int) or shares of ``n`` (float, rounded). The
    same ``n``, sizes and ``seed`` give the same split on any machine (Python's Mersenne
    Twister shuffle). At least one row is left to train on.

    Examples:
        >>> split_rows(10, held_out=0.2, test=2, seed=0)
        Split(train=[0, 2, 3, 4, 6, 9], held_out=[1, 5], test=[7, 8], seed=0)
        >>> split_rows(3, held_out=2, test=1)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: held_out (2) + test (1) rows leave none of the 3 rows to train on; ask for fewer
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"split_rows needs n, the number of rows, an int >= 1; got {n!r}")
    h, t = _count(held_out, n, "held_out"), _count(test, n, "test")
    if h + t >= n:
        raise InputError(f"held_out ({h}) + test ({t}) rows leave none of the {n} rows to train on; ask for fewer")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return Split(train=sorted(order[h + t:]), held_out=sorted(order[t:t + h]), test=sorted(order[:t]), seed=seed)
