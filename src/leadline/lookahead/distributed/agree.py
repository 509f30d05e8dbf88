"""Did anyone fail? One collective after each piece of local work, so a failure on one rank
becomes the same sentence on every rank instead of a collective that never completes.

The rule: a rank never raises between two collectives on its own. Local work (a forward, a
ramp, a held-out read) runs inside :func:`agreed`; its outcome — fine, out of memory, or an
error — is then all-gathered, and when any rank failed every rank raises
:class:`RankFailed` with the first failing rank's sentence.

Every agreement is the same collective (an all-gather of one number, then the sentences only
when one is not zero), so a rank that fails anywhere meets the others at their next agreement,
whichever one it is, and both sides raise. A :class:`RankFailed` is already agreed: it passes
through every outer agreement without another collective. An out-of-memory is kept as what
it is: the sentence says so and :attr:`RankFailed.out_of_memory` is set, so a caller that
treats an OOM as a measurement (the ramp) can read it as one on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from leadline.errors import LeadlineError

T = TypeVar("T")

OK, OUT_OF_MEMORY, FAILED = 0, 1, 2
"""A rank's outcome in an agreement: the one number every rank all-gathers."""


class RankFailed(LeadlineError):
    """A rank failed; every rank raises this with the same sentence.

    Attributes:
        rank: the first rank that failed.
        out_of_memory: that rank's failure was the allocator refusing memory.
        failed_ranks: every rank that failed.

    Examples:
        >>> e = RankFailed("the memory ramp ran out of memory on rank 1 of 2: CUDA out of memory", 1, True, [1])
        >>> str(e), e.rank, e.out_of_memory, e.failed_ranks
        ('the memory ramp ran out of memory on rank 1 of 2: CUDA out of memory', 1, True, [1])
        >>> from leadline.errors import LeadlineError
        >>> isinstance(e, LeadlineError)        # the CLI prints the sentence and exits 2 on every rank
        True
    """

    def __init__(self, sentence: str, rank: int, out_of_memory: bool, failed_ranks: list[int]) -> None:
        super().__init__(sentence)
        self.rank = rank
        self.out_of_memory = out_of_memory
        self.failed_ranks = failed_ranks


def _sentence(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if isinstance(exc, LeadlineError):
        return first or type(exc).__name__
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def status_of(exc: BaseException | None) -> int:
    """OK, OUT_OF_MEMORY or FAILED for an exception (None: OK).

    An agreed :class:`RankFailed` keeps its kind; any other exception is an out-of-memory when
    :func:`~leadline.memory_readings.is_oom` says so, else a failure.

    Examples:
        >>> status_of(None), status_of(ValueError("bad row")), status_of(MemoryError())
        (0, 2, 1)
        >>> status_of(RankFailed("the memory ramp ran out of memory on rank 1 of 2", 1, True, [1]))
        1
    """
    if exc is None:
        return OK
    if isinstance(exc, RankFailed):
        return OUT_OF_MEMORY if exc.out_of_memory else FAILED
    from leadline.memory_readings import is_oom

    return OUT_OF_MEMORY if is_oom(exc) else FAILED


def agreed(world: Any, fn: Callable[[], T], what: str, passthrough: tuple[type[BaseException], ...] = ()) -> T:
    """Run ``fn()`` on this rank, then agree with every rank on how it went.

    Returns ``fn()``'s result when it returned on every rank. Otherwise every rank raises the
    same :class:`RankFailed`: "``what`` failed on rank r of W: <r's sentence>" (or "ran out of
    memory"), chained to the local exception on the ranks that raised one. Two collectives at
    most: a status all-gather, and the sentences only when something failed.

    A :class:`RankFailed` raised inside ``fn`` (an inner agreement: every rank raised one) passes
    through unchanged and without a collective, and so do the ``passthrough`` exceptions: those
    every rank raises at the same point by construction (derive's ``OutOfTime``, read from a
    clock the ranks agreed on).

    Args:
        world: the :class:`~leadline.lookahead.distributed.World`.
        fn: the local work; it must not call collectives that another rank could skip.
        what: names the work in the sentence ("the memory ramp", "micro-batch 7's forward").

    Examples:
        ``world`` needs ``rank``, ``world_size``, ``all_gather`` and ``gather_object``. A world of
        one rank, whose collectives return its own part:

        >>> class One:
        ...     rank, world_size = 0, 1
        ...     def all_gather(self, values): return [list(values)]
        ...     def gather_object(self, obj): return [obj]
        >>> agreed(One(), lambda: 6 * 7, "the answer")
        42
        >>> agreed(One(), lambda: 1 / 0, "the division")
        Traceback (most recent call last):
        ...
        leadline.lookahead.distributed.agree.RankFailed: the division failed on rank 0 of 1: ZeroDivisionError: ...

        Rank 0 of two, whose own work succeeded, when rank 1 ran out of memory: rank 0 raises
        rank 1's sentence (the replies are rank 1's side of the two collectives):

        >>> class RankZeroOfTwo:
        ...     rank, world_size = 0, 2
        ...     def all_gather(self, values): return [list(values), [OUT_OF_MEMORY]]
        ...     def gather_object(self, obj): return [obj, ("the memory ramp ran out of memory on rank 1 of 2: "
        ...                                                 "CUDA out of memory", True)]
        >>> try:
        ...     agreed(RankZeroOfTwo(), lambda: 8, "the memory ramp")
        ... except RankFailed as e:
        ...     print(e, e.rank, e.out_of_memory, e.failed_ranks, sep=" | ")
        the memory ramp ran out of memory on rank 1 of 2: CUDA out of memory | 1 | True | [1]
    """
    result: Any = None
    error: BaseException | None = None
    try:
        result = fn()
    except RankFailed:
        raise
    except passthrough:
        raise
    except Exception as e:  # every failure is agreed on; KeyboardInterrupt ends the job anyway
        error = e
    statuses = [int(s[0]) for s in world.all_gather([status_of(error)])]
    if not any(statuses):
        return result
    failed = [r for r, s in enumerate(statuses) if s]
    if error is not None:
        oom = status_of(error) == OUT_OF_MEMORY
        verb = "ran out of memory" if oom else "failed"
        mine = (f"{what} {verb} on rank {world.rank} of {world.world_size}: {_sentence(error)}", oom)
    else:
        mine = None
    sentences = world.gather_object(mine)
    first = failed[0]
    sentence, oom = sentences[first]
    raise RankFailed(sentence, first, bool(oom), failed) from error
