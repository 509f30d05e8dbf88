"""Stopping every rank when one leaves collectives early: a sharded model's forward or backward,
DDP's all-reducing backward.

Under FSDP a forward and a backward are collectives (parameters all-gathered, gradients
reduce-scattered); under DDP the backward all-reduces. A rank that runs out of memory (or
raises) inside one leaves the others waiting in the next all-gather, reduce-scatter or
all-reduce, where no agreement (:mod:`leadline.lookahead.distributed.agree`) can reach them: they would
wait for the backend's timeout (10 to 30 minutes), or meet the failing rank's agreement in a
mismatched collective, and end without a sentence. The stop line is a side channel through the
job's c10d store (the rendezvous key-value store; no collective):

- every rank marks the end of each stretch of sharded work (:meth:`StopLine.left`);
- a rank that failed inside it waits up to ``wait_s`` for every other rank's mark. All there:
  the others are out of the collectives too (the same OOM at the same step on identical cards,
  or a failure after the last collective), and the ordinary agreement follows. One missing: that
  rank is inside a collective this rank will not enter. The failing rank then writes its
  sentence under the stop key, aborts the job's process groups and raises :class:`WorldAborted`;
- while a rank does sharded work it watches the stop key (:meth:`StopLine.watching`: a daemon
  thread polling the store); when the key appears it aborts its own process groups. On NCCL that
  is the communicator's abort, the backend's way to end a pending collective from another
  thread. On gloo nothing ends a pending collective from outside while the group is referenced
  (as FSDP references it; measured: docs/distributed.md, "What is weak"), so the rank leaves it
  at the group's timeout.
  Either way it then raises the stopping rank's :class:`WorldAborted`
  (:meth:`StopLine.stopped`), not a timeout or a collective mismatch.

The job cannot go on after that: the process groups are gone, and neither FSDP nor DDP can
continue past one rank's failure inside their collectives. The sentence names the rank, the step
and what to change.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from leadline.lookahead.distributed.agree import RankFailed

STOP_WAIT_S = 5.0  # the least a failing rank waits for the others' marks before it stops them
POLL_S = 0.05  # how often a watching rank reads the stop key

_instances = itertools.count()  # every rank creates its stop lines in the same order


class WorldAborted(RankFailed):
    """A rank failed inside a sharded model's collectives while another rank was still inside
    them: the job's process groups were aborted on every rank, which raises this with the same
    sentence. Nothing distributed can run in the process after it.

    Examples:
        >>> e = WorldAborted("the sharded training step 3 failed on rank 1 of 2: ...", 1, False, [1])
        >>> isinstance(e, RankFailed), e.rank, e.failed_ranks    # passes through every agreement
        (True, 1, [1])
    """


def _abort_groups() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.distributed_c10d._abort_process_group()


class StopLine:
    """The side channel of one sharded phase (see the module).

    Args:
        world: the :class:`~leadline.lookahead.distributed.World`.
        store: the key-value store every rank reaches (default: the job's c10d store, held here
            so it outlives the process groups it may have to abort; without one the stop line
            does nothing and failures go to the agreements as before).
        abort: what stops this rank's collectives (default: abort every process group).

    Examples:
        Rank 1 of two stops the job; any rank reading the store then raises its sentence. An
        in-process ``HashStore`` stands for the job's store, a list for the process groups:

        >>> from types import SimpleNamespace
        >>> from torch.distributed import HashStore
        >>> aborted = []
        >>> line = StopLine(SimpleNamespace(rank=1, world_size=2), store=HashStore(),
        ...                 abort=lambda: aborted.append("process groups"))
        >>> print(line.stopped())
        None
        >>> stop = line.stop("the lockstep ramp's step at 4 rows x 512 tokens ran out of memory on rank 1 of 2", True)
        >>> aborted, stop.rank, stop.out_of_memory
        (['process groups'], 1, True)
        >>> str(line.stopped()) == str(stop)
        True

        A rank that failed when every rank has left the stretch (here the only one) does not
        stop the job: the ordinary agreement follows.

        >>> solo = StopLine(SimpleNamespace(rank=0, world_size=1), store=HashStore(), abort=lambda: None)
        >>> solo.left(True, lambda inside: f"rank(s) {inside} stayed inside", oom=True)
        >>> print(solo.stopped())
        None
    """

    def __init__(self, world: Any, store: Any = None, abort: Callable[[], None] | None = None) -> None:
        if store is None:
            import torch.distributed as dist

            try:
                store = dist.distributed_c10d._get_default_store()
            except Exception:  # a group without a store leadline can reach: no stop line (agreements only)
                store = None
        self.world, self.store = world, store
        self.abort = abort or _abort_groups
        self.prefix = f"leadline/stopline/{next(_instances)}"
        self.stage = 0
        self.fired = False

    # ---- the stop key ------------------------------------------------------------------------
    def _stop_key(self) -> str:
        return f"{self.prefix}/stop"

    def stopped(self) -> WorldAborted | None:
        """The :class:`WorldAborted` another rank stopped the job with, or None. A store that
        cannot be read (the rank that hosted it ended) reads as a stop without its sentence."""
        if self.store is None:
            return None
        try:
            if not self.store.check([self._stop_key()]):
                return None
            got = json.loads(self.store.get(self._stop_key()))
        except Exception:  # the store went with the rank that hosted it
            if not self.fired:
                return None
            got = {"sentence": "another rank stopped the job inside the sharded model's collectives (its sentence was "
                               "lost "
                               "with the store)", "rank": -1, "oom": False}
        return WorldAborted(got["sentence"], int(got["rank"]), bool(got["oom"]), [int(got["rank"])])

    @contextmanager
    def watching(self) -> Iterator[None]:
        """While inside: a thread that aborts this rank's process groups as soon as the stop
        key appears (a pending collective then ends with an error)."""
        if self.store is None:
            yield
            return
        done = threading.Event()

        def watch() -> None:
            while not done.wait(POLL_S):
                try:
                    if self.store.check([self._stop_key()]):
                        self.fired = True
                        self.abort()
                        return
                except Exception:  # the store is gone: the job is ending anyway
                    return

        t = threading.Thread(target=watch, name="leadline-stopline", daemon=True)
        t.start()
        try:
            yield
        finally:
            done.set()
            t.join(timeout=5 * POLL_S + 1.0)

    def stop(self, sentence: str, oom: bool) -> WorldAborted:
        """Write this rank's sentence under the stop key (the first rank to write it wins),
        abort this rank's process groups, and return the job's :class:`WorldAborted`."""
        payload = json.dumps({"sentence": sentence, "rank": self.world.rank, "oom": oom})
        try:
            won = self.store.compare_set(self._stop_key(), "", payload)
            got = json.loads(won)
        except Exception:  # a store without compare_set, or gone: this rank's own sentence
            got = json.loads(payload)
        self.fired = True
        self.abort()
        return WorldAborted(got["sentence"], int(got["rank"]), bool(got["oom"]), [int(got["rank"])])

    @contextmanager
    def guard(self, what: str, passthrough: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
        """Work inside collectives that is not a measurement (a sharded noise draw, training
        step or held-out read; DDP's all-reducing backward): while inside, the stop key is watched;
        any failure on this rank stops the job (its collectives may have left the others inside
        FSDP's), and a failure that the stop caused on this rank raises the stopping rank's sentence.
        ``passthrough`` exceptions (and :class:`RankFailed`) are the ones every rank raises at the same point, after an
        agreement: they pass unchanged.

        Examples:
            >>> from types import SimpleNamespace
            >>> from torch.distributed import HashStore
            >>> aborted = []
            >>> line = StopLine(SimpleNamespace(rank=0, world_size=2), store=HashStore(),
            ...                 abort=lambda: aborted.append(True))
            >>> with line.guard("step 3's backward"):
            ...     raise RuntimeError("NCCL error: unhandled system error")
            Traceback (most recent call last):
            ...
            leadline.lookahead.distributed.stopline.WorldAborted: step 3's backward failed on rank 0 of 2: ...
            >>> aborted
            [True]
        """
        from leadline.lookahead.distributed.agree import _sentence
        from leadline.memory_readings import is_oom

        with self.watching():
            try:
                yield
            except RankFailed:
                raise
            except passthrough:
                raise
            except Exception as e:
                if self.store is None:  # no stop line: the agreement that follows meets the others, or not
                    raise
                seen = self.stopped()
                if seen is not None:
                    raise seen from e
                oom = is_oom(e)
                verb = "ran out of memory" if oom else "failed"
                w, rank = self.world.world_size, self.world.rank
                raise self.stop(f"{what} {verb} on rank {rank} of {w}: {_sentence(e)}; the other ranks may be left "
                                "inside "
                                "the collectives it runs, so leadline aborted the job's process groups (derive cannot "
                                "go on "
                                f"after it)", oom) from e

    # ---- the marks ---------------------------------------------------------------------------
    def left(self, failed: bool, sentence: Callable[[list[int]], str], oom: bool, wait_s: float = STOP_WAIT_S) -> None:
        """Mark that this rank left the current stretch of sharded work; when it ``failed``
        there, wait up to ``wait_s`` for every rank's mark, and when one is missing stop the job.

        Args:
            failed: this rank left early (out of memory, an error) and may have left others
                inside a collective.
            sentence: the sentence for the stop, given the ranks still inside.
            oom: the failure was the allocator's refusal.

        Raises:
            WorldAborted: this rank stopped the job.
        """
        if self.store is None:
            return
        n, self.stage = self.stage, self.stage + 1
        w, rank = self.world.world_size, self.world.rank
        keys = [f"{self.prefix}/left/{n}/{r}" for r in range(w)]
        self.store.set(keys[rank], "1")
        if not failed:
            return
        deadline = time.monotonic() + max(wait_s, STOP_WAIT_S)
        while not self.store.check(keys):  # polled: the store's own wait logs its timeout
            if time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        else:
            return
        inside = [r for r in range(w) if r != rank and not self.store.check([keys[r]])]
        text = sentence(inside)
        self.store.set(self._stop_key(), json.dumps({"sentence": text, "rank": rank, "oom": oom}))
        self.fired = True
        self.abort()
        raise WorldAborted(text, rank, oom, [rank])
