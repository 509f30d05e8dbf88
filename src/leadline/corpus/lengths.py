"""The length and what truncation cuts, as pure functions on histograms (no torch, no numpy).

A corpus is profiled in one streaming pass into histograms whose size is bounded by the
longest row, never by the row count:

- ``lengths[n]``: rows of ``n`` tokens;
- ``scored_at[p]``: scored labels at position ``p`` (over all rows; ``p >= 1``);
- ``first_scored[p]``: rows whose first scored label is at position ``p``;
- ``scored_per_row[k]``: rows with ``k`` scored tokens (untruncated).

Truncating to ``L`` tokens keeps positions ``0 .. L-1``, so it cuts the scored labels at
``p >= L`` and leaves nothing to score in a row whose first scored label is at ``p >= L``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from leadline.errors import InputError

Hist = Mapping[int, int]


def total(hist: Hist) -> int:
    """The number of items counted.

    Examples:
        >>> total({10: 3, 20: 1})
        4
    """
    return sum(hist.values())


def length_at_quantile(lengths: Hist, q: float) -> int:
    """The smallest length ``L`` such that at least a share ``q`` of rows are ``<= L`` tokens.

    Nearest rank: with ``n`` rows, ``L`` is the ``ceil(q * n)``-th shortest length.

    Examples:
        >>> length_at_quantile({10: 3, 20: 1}, 0.75)
        10
        >>> length_at_quantile({10: 3, 20: 1}, 0.76)
        20
        >>> length_at_quantile({10: 3}, 0)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: quantile must be in (0, 1], got 0; pass e.g. 0.99 to keep 99% of rows whole
    """
    if not 0.0 < q <= 1.0:
        raise InputError(f"quantile must be in (0, 1], got {q}; pass e.g. 0.99 to keep 99% of rows whole")
    n = total(lengths)
    if n == 0:
        raise InputError("no rows to take a length quantile of")
    rank = max(1, math.ceil(q * n - 1e-9))
    seen = 0
    for length in sorted(lengths):
        seen += lengths[length]
        if seen >= rank:
            return length
    raise AssertionError("unreachable")


def count_at_or_above(hist: Hist, at: int) -> int:
    """Items counted at keys ``>= at`` (scored labels cut, rows left unscored).

    Examples:
        >>> count_at_or_above({10: 3, 20: 1}, 15)  # rows truncation to 14 tokens cuts
        1
    """
    return sum(c for k, c in hist.items() if k >= at)


def tokens_kept(lengths: Hist, seq_len: int) -> int:
    """Tokens read at length ``seq_len``: ``sum(min(n, seq_len))`` over rows.

    Examples:
        >>> tokens_kept({10: 3, 20: 1}, 15)  # 3 x 10 + 15
        45
    """
    return sum(min(n, seq_len) * c for n, c in lengths.items())


def quantiles(hist: Hist, qs: tuple[float, ...] = (0.1, 0.5, 0.9)) -> dict[str, int]:
    """Nearest-rank quantiles of a histogram as ``{"p10": .., "p50": .., "p90": .., "min", "max"}``.

    Examples:
        >>> quantiles({10: 3, 20: 1})
        {'min': 10, 'p10': 10, 'p50': 10, 'p90': 20, 'max': 20}
    """
    out = {"min": min(hist), **{f"p{round(q * 100)}": length_at_quantile(hist, q) for q in qs}, "max": max(hist)}
    return out


def binned(hist: Hist, bins: int = 20) -> list[dict[str, int]]:
    """The histogram in at most ``bins`` equal-width bins ``[lo, hi]`` (for the evidence).

    The width is ``ceil((max - min + 1) / bins)``; empty bins are left out.

    Examples:
        >>> binned({1: 2, 5: 1, 10: 4}, bins=3)
        [{'lo': 1, 'hi': 4, 'rows': 2}, {'lo': 5, 'hi': 8, 'rows': 1}, {'lo': 9, 'hi': 10, 'rows': 4}]
    """
    if not hist:
        return []
    lo, hi = min(hist), max(hist)
    width = max(1, math.ceil((hi - lo + 1) / bins))
    out: dict[int, int] = {}
    for k, c in hist.items():
        b = (k - lo) // width
        out[b] = out.get(b, 0) + c
    return [{"lo": lo + b * width, "hi": min(hi, lo + (b + 1) * width - 1), "rows": out[b]} for b in sorted(out)]
