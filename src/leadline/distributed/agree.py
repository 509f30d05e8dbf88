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


class RankFailed(LeadlineError):
    """A rank failed; every rank raises this with the same sentence.

    Attributes:
        rank: the first rank that failed.
        out_of_memory: that rank's failure was the allocator refusing memory.
        failed_ranks: every rank that failed.
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
    """OK, OUT_OF_MEMORY or FAILED for an exception (None: OK)."""
    if exc is None:
        return OK
    if isinstance(exc, RankFailed):
        return OUT_OF_MEMORY if exc.out_of_memory else FAILED
    from leadline.memory.readings import is_oom

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
        world: the :class:`~leadline.distributed.World`.
        fn: the local work; it must not call collectives that another rank could skip.
        what: names the work in the sentence ("the memory ramp", "micro-batch 7's forward").
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
