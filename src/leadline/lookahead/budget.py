"""The time budget's signal: :class:`OutOfTime`, raised where derive's ``max_seconds`` is spent
and caught by the phase that keeps what it read (the look-ahead) or by derive's runner."""

from __future__ import annotations


class OutOfTime(Exception):
    """Raised inside a phase (from its progress callback) when derive's max_seconds is spent;
    the phase's own guard restores what it touched, and the runner records the cut.

    Examples:
        >>> try:
        ...     raise OutOfTime
        ... except OutOfTime:
        ...     print("cut")
        cut
    """
