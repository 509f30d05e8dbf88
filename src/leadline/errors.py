"""The one error type a user sees: a sentence naming the input and the fix."""

from __future__ import annotations


class LeadlineError(Exception):
    """Bad input or a refusal, said in one sentence that names the input and what would fix it.

    The CLI prints the sentence alone (no traceback) and exits with code 2.

    Examples:
        >>> try:
        ...     raise LeadlineError("max_seconds=-1 is not a time; pass a number of seconds > 0")
        ... except LeadlineError as e:
        ...     print(e)
        max_seconds=-1 is not a time; pass a number of seconds > 0
    """


class InputError(LeadlineError, ValueError):
    """An argument, a file or a row that cannot be used as given.

    A :class:`LeadlineError` and a :class:`ValueError`, so ``except ValueError`` catches it too.

    Examples:
        >>> from leadline.stats import median
        >>> try:
        ...     median([])
        ... except ValueError as e:
        ...     print(type(e).__name__, isinstance(e, LeadlineError), e)
        InputError True median needs at least one number
    """
