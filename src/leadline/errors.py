"""The one error type a user sees: a sentence naming the input and the fix."""

from __future__ import annotations


class LeadlineError(Exception):
    """Bad input or a refusal, said in one sentence that names the input and what would fix it.

    The CLI prints the sentence alone (no traceback) and exits with code 2.
    """


class InputError(LeadlineError, ValueError):
    """An argument, a file or a row that cannot be used as given."""
