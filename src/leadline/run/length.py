"""The run's length: past its first pass while its held-out checks still improve, at most five passes.

On a few hundred rows one pass is a few dozen steps, and the run's length is the hyperparameter
that matters most; on thousands of rows one pass is most runs' length. The rule, written before
the boards that decide it (``benchmarks/scoreboard.py`` rule D):

1. Where the caller gave no length (no ``--steps``, no ``--epochs``), the run plans one pass and
   may go on pass by pass, at most :data:`MAX_PASSES` in all.
2. At each pass's end the guard reads a check there (a scheduled one). The run takes another
   pass only when that check is significantly below the check half a pass before it
   (:func:`half_a_pass_before`; the same held-out rows; :func:`still_improving`: a one-sided
   paired t at :data:`ALPHA`), and the guard neither rolled back nor stopped there: a run whose
   second half-pass still learns is not cut at the pass's end, and a run that has flattened pays
   for no pass it does not need (why half a pass: ``docs/results.md``, "The sweep").
   A pass's end that reads flat while the model's held-out answers have collapsed (one answer for
   most rows, the end's rule: :func:`leadline.run.answers.collapsed`) takes another pass all the
   same: a classifier that gives one answer has not learned its task yet, and at one pass on a few
   hundred rows every rate of the sweep stood there (the answers' read is counted with the checks').
3. Each added pass gets the first pass's checks (the same rows, the same count), so the reads stay
   within the guard's share of the steps' time; the end and the kept model are the guard's as in
   one pass.

The steps of every pass but the first are the decision's cost; the plan's ``total_steps`` says how
many passes ran and why the run stopped, and the phase table counts every step.
"""

from __future__ import annotations

from collections.abc import Sequence

from leadline.rate.compare import compare

MAX_PASSES = 5
"""The most passes a run whose length was not given takes."""
PASS_RULE = "half a pass, or answers collapsed"
"""What a pass's end is read against (rule 2), as ``run.json``'s ``rules`` names it."""
ALPHA = 0.05


def still_improving(last: Sequence[float], before: Sequence[float], alpha: float = ALPHA) -> bool:
    """Whether the pass's last check (per-row held-out losses) is significantly below the check
    before it on the same rows: the run still learns at the pass's end.

    Examples:
        >>> still_improving([1.0, 1.1, 0.9, 1.0], [1.3, 1.4, 1.2, 1.35])
        True
        >>> still_improving([1.0, 1.1, 0.9, 1.0], [1.0, 1.12, 0.88, 1.01])
        False
    """
    return compare(last, before, alpha=alpha).better


def half_a_pass_before(steps: Sequence[int], end: int, pass_steps: int) -> int:
    """The check the pass's end is read against: the latest of ``steps`` (the checks read so far,
    the start 0 among them) at or before half a pass before ``end``.

    Examples:
        >>> half_a_pass_before([0, 11, 25, 39, 53, 67, 81, 95, 109, 122], 122, 122)
        53
        >>> half_a_pass_before([0, 6, 12, 18], 18, 18), half_a_pass_before([0, 18, 24, 30, 36], 36, 18)
        (6, 24)
        >>> half_a_pass_before([0, 3], 3, 3)   # a pass too short for a check in it: the start
        0
    """
    return max(s for s in steps if s <= end - pass_steps / 2)


def stop_sentence(passes: int, reason: str) -> str:
    """Why the run took ``passes`` passes.

    Examples:
        >>> stop_sentence(3, "flat")[:62]
        "3 passes: the run went on while its held-out check at a pass's"
        >>> stop_sentence(5, "cap")[:40]
        '5 passes: the most a run takes (its chec'
    """
    said = {
        "flat": "the run went on while its held-out check at a pass's end was significantly below the check half a "
                "pass before it, and stopped when it was not",
        "cap": "the most a run takes (its checks still improved at the last pass's end)",
        "guard": "the guard rolled back or stopped at the pass's end, so the run went no further",
        "collapsed": "the most a run takes (its held-out answers were one answer for most rows at the last pass's "
                     "end it read flat)",
        "given": "the length the caller gave",
    }[reason]
    return f"{passes} pass{'es' if passes != 1 else ''}: {said}"
