"""Every rank ends with the same plan: rank 0's, broadcast, checked by a hash on every rank."""

from __future__ import annotations

import hashlib
from typing import Any

from leadline.errors import LeadlineError
from leadline.plan import Plan

DECISIONS = ("rows_fit", "micro_batch", "grad_accum", "tokens_per_step", "noise_scale_tokens", "alpha1", "lr",
             "warmup_steps", "total_steps")
"""The numbers a run is configured with: compared across ranks before the broadcast."""


def plan_digest(plan: Plan | str) -> str:
    """sha256 of the plan's JSON text (:meth:`Plan.to_json`), which round-trips exactly.

    Examples:
        >>> plan_digest("{}")
        '44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a'
        >>> plan = Plan()
        >>> plan_digest(plan) == plan_digest(plan.to_json()) == plan_digest(Plan.from_json(plan.to_json()))
        True
    """
    text = plan if isinstance(plan, str) else plan.to_json()
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def disagreements(decisions: list[dict[str, Any]]) -> list[str]:
    """Sentences for every decision (:data:`DECISIONS`) a rank took differently from rank 0 (pure).

    Args:
        decisions: each rank's ``{name: number}``, indexed by rank.

    Examples:
        >>> disagreements([{"micro_batch": 4, "lr": 1e-4}, {"micro_batch": 2, "lr": 1e-4}])
        ["rank 1 derived micro_batch=2 where rank 0 derived 4; rank 0's plan stands"]
        >>> disagreements([{"micro_batch": 4}, {"micro_batch": 4}])
        []
    """
    out = []
    base = decisions[0]
    for r, d in enumerate(decisions[1:], start=1):
        for name in DECISIONS:
            if d.get(name) != base.get(name):
                out.append(f"rank {r} derived {name}={d.get(name)!r} where rank 0 derived {base.get(name)!r}; rank 0's "
                           "plan stands")
    return out


def broadcast_plan(world: Any, plan: Plan) -> Plan:
    """Rank 0's plan on every rank, checked by hash.

    Every rank's own decisions (:data:`DECISIONS`) are gathered first; where a rank decided
    differently, rank 0's plan says so in a note (the phases run in lockstep on agreed numbers,
    so this should never happen — the note is how it would show). Rank 0 then broadcasts the
    plan's JSON and its sha256; each rank checks the text it received against the hash and the
    plan it parses against the text (a round trip to the same bytes), and the ranks agree on
    the check: any mismatch raises the same sentence everywhere.

    Rank 0's ``plan.machine["world"]`` records the world size, the backend and every rank's
    device.

    Args:
        world: the :class:`~leadline.lookahead.distributed.World` (``rank``, ``world_size``, ``is_main``,
            ``backend``, ``gather_object``, ``broadcast_object``, ``all_gather``).
        plan: this rank's plan.

    Raises:
        LeadlineError: on every rank, when any rank's copy fails the check.

    Examples:
        A world of one rank, whose collectives return its own part: the plan comes back equal,
        with the world on its record.

        >>> class One:
        ...     rank, world_size, is_main, backend = 0, 1, True, "gloo"
        ...     def gather_object(self, obj): return [obj]
        ...     def broadcast_object(self, obj, src=0): return obj
        ...     def all_gather(self, values): return [list(values)]
        >>> from leadline.plan import Value
        >>> plan = Plan(machine={"device": "cpu"})
        >>> plan.set("micro_batch", Value(4, "derived", "what fits"))
        >>> got = broadcast_plan(One(), plan)
        >>> got == plan, got.micro_batch, got.machine["world"]
        (True, 4, {'world_size': 1, 'backend': 'gloo', 'ranks': [{'rank': 0, 'device': 'cpu'}]})

        A broadcast whose text does not match the digest that came with it:

        >>> class Corrupting(One):
        ...     def broadcast_object(self, obj, src=0): return obj[0], "0" * 64
        >>> broadcast_plan(Corrupting(), plan)
        Traceback (most recent call last):
        ...
        leadline.errors.LeadlineError: rank 0's copy of rank 0's plan does not match its sha256 000000000000; ...
    """
    mine = ({n: plan.get(n) for n in DECISIONS},
            {"rank": world.rank, **{k: plan.machine.get(k) for k in ("device", "device_name", "device_memory_bytes")
                                    if k in plan.machine}})
    got = world.gather_object(mine)
    if world.is_main:
        plan.notes.extend(disagreements([g[0] for g in got]))
        plan.machine["world"] = {"world_size": world.world_size, "backend": world.backend, "ranks": [g[1] for g in got]}
        text: str | None = plan.to_json()
        sent = (text, plan_digest(text))
    else:
        sent = None
    text, digest = world.broadcast_object(sent)
    ok = 0.0
    received = None
    try:
        received = Plan.from_json(text)
        ok = float(plan_digest(text) == digest and plan_digest(received) == digest)
    except LeadlineError:
        ok = 0.0
    bad = [r for r, v in enumerate(world.all_gather([ok])) if not v[0]]
    if bad or received is None:
        raise LeadlineError(f"rank {bad[0] if bad else world.rank}'s copy of rank 0's plan does not match its sha256 "
                            f"{digest[:12]}; the broadcast was corrupted, run derive again")
    return received
