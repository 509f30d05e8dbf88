"""The noise scale read from DDP's own all-reduce: a communication hook and its drivers.

:class:`NoiseHook` is a DDP communication hook (``ddp.register_comm_hook(None, hook)``). For
each gradient bucket it reads, before handing the bucket to the ordinary all-reduce
(``allreduce_hook``: divide by the world size, sum), this rank's local gradient against the
running mean M_p — r = |g - M_p|², x = (g - M_p)·M_p — and, when the all-reduce completes,
D = m - M_p and |D|² (see :mod:`leadline.lookahead.distributed.noise_math`). No extra forward or
backward, no copy of the gradient kept, no host synchronisation inside the backward; the
scalars are read once per step. DDP's result is unchanged: the hook returns the all-reduced
bucket exactly as ``allreduce_hook`` does.

Two ways to hold M:

- ``carry_mean=True`` (derive: the weights do not move between steps): M is the running
  token-weighted mean of every step so far, one fp32 buffer of the trained gradients' size in
  each bucket's layout (re-laid out when DDP rebuilds its buckets after the first step), so all
  the steps' draws form one group — on 2 ranks exactly the draws the single-process probe
  records for the same micro-batches in the same order.
- ``carry_mean=False`` (a training loop: the weights move every step): M = 0, each step is a
  group of its own (:meth:`NoiseSums.new_group`), no buffer at all; it needs 2 ranks (with
  more, one all-reduce does not separate the ranks' contributions).

:class:`DDPNoise` is derive()'s noise phase under DDP: it draws micro-batch ``s W + r`` on rank
r at step s, agrees on the tokens and on the forward before any rank enters the backward (an
OOM or an error in a forward is the same sentence on every rank), and stops as the probe does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from leadline.errors import InputError
from leadline.lookahead.distributed.agree import agreed
from leadline.lookahead.distributed.noise_math import world_draws
from leadline.lookahead.noise.estimator import Draw, NoiseSums
from leadline.lookahead.noise.gradfn import batch_inputs
from leadline.lookahead.noise.probe import DEFAULT_MAX_K, MIN_DRAWS, NoiseScale

_clock: Callable[[], float] = time.perf_counter

METHOD = (
    "McCandlish et al. (2018) B_noise = tr(Σ)/|G|², read from DDP's all-reduce by a communication hook: each rank's "
    "local micro-batch gradient is the small batch, the all-reduced token-weighted mean the big one; draws against the "
    "running token-weighted mean (Welford), standard error by the delta method on the Helmert innovations"
)


class NoiseHook:
    """A DDP communication hook that reads the noise scale's scalars from every bucket.

    Args:
        carry_mean: keep the running mean M across steps (fixed weights) or not (M = 0).
        process_group: the group DDP all-reduces over (None: the default group).

    Per step: :meth:`begin` (this rank's loss multiplier and the Welford weight) before the
    backward that synchronises, :meth:`read` after it, which returns ``(r, x, dd)`` with one
    host synchronisation. While ``active`` is False the hook is the plain all-reduce.

    Examples:
        :meth:`communicate` runs inside DDP's backward; outside one, the hook holds the step's
        numbers and refuses a read that no all-reduce preceded. Rank 0 of 2 scored 300 of the
        step's 500 tokens, so its loss is multiplied by W t_r / T_s = 2 × 300 / 500:

        >>> hook = NoiseHook(carry_mean=False)
        >>> hook.active, hook.carry_mean, hook.calls
        (True, False, 0)
        >>> hook.begin(scale=2 * 300 / 500, weight=1.0)
        >>> hook.scale, hook.weight
        (1.2, 1.0)
        >>> hook.read()
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: NoiseHook.read(): no bucket was all-reduced since begin(); run the backward ...
        >>> hook.begin(scale=0.0, weight=1.0)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: NoiseHook.begin(scale=0.0) needs the positive multiplier of this rank's loss
        >>> hook.release()
        >>> hook.active                    # a plain all-reduce from now on
        False
    """

    def __init__(self, carry_mean: bool = True, process_group: Any = None) -> None:
        self.carry_mean = carry_mean
        self.process_group = process_group
        self.active = True
        self.scale = 1.0
        self.weight = 0.0
        self._flat: dict[tuple[int, ...], Any] = {}
        self._views: dict[int, Any] = {}
        self._acc: Any = None
        self.calls = 0

    def begin(self, scale: float, weight: float) -> None:
        """Before a synchronising backward: ``scale`` multiplied this rank's mean loss
        (W t_r / T_s), ``weight`` = T_s / (T_p + T_s) moves the running mean."""
        if not (scale > 0 and math.isfinite(scale)):
            raise InputError(f"NoiseHook.begin(scale={scale!r}) needs the positive multiplier of this rank's loss")
        self.scale, self.weight = float(scale), float(weight)
        self._acc = None

    def read(self) -> tuple[float, float, float]:
        """(r, x, dd) summed over the buckets of the last synchronising backward."""
        if self._acc is None:
            raise InputError("NoiseHook.read(): no bucket was all-reduced since begin(); run the backward through the "
                             "DDP model")
        vals = self._acc.double().cpu().tolist()
        self._acc = None
        return vals[0], vals[1], vals[2]

    def release(self) -> None:
        """Free the running mean's buffers (the hook stays a plain all-reduce)."""
        self._flat.clear()
        self._views.clear()
        self.active = False

    def _mean_for(self, params: list[Any], buf: Any) -> Any:
        """The running mean in this bucket's layout (zeros for parameters never seen)."""
        import torch

        key = tuple(id(p) for p in params)
        flat = self._flat.get(key)
        if flat is not None:
            return flat
        dtype = torch.promote_types(buf.dtype, torch.float32)
        if sum(p.numel() for p in params) != buf.numel():
            raise InputError("a DDP gradient bucket is not its parameters' gradients laid end to end; leadline's noise "
                             "hook cannot read it")
        parts = [self._views[id(p)].reshape(-1) if id(p) in self._views
                 else torch.zeros(p.numel(), dtype=dtype, device=buf.device) for p in params]
        flat = torch.cat(parts).to(dtype) if parts else torch.zeros(0, dtype=dtype, device=buf.device)
        for old in [k for k in self._flat if set(k) & set(key)]:
            del self._flat[old]
        at = 0
        for p in params:
            self._views[id(p)] = flat[at:at + p.numel()]
            at += p.numel()
        self._flat[key] = flat
        return flat

    def communicate(self, state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects any annotation but its own
        """(state, GradBucket) -> Future[Tensor]: read the bucket, then all-reduce it as
        ``allreduce_hook`` does."""
        import torch
        import torch.distributed as dist

        buf = bucket.buffer()
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        if not self.active:
            buf.div_(group.size())
            return dist.all_reduce(buf, group=group, async_op=True).get_future().then(lambda f: f.value()[0])
        self.calls += 1
        if self._acc is None:
            self._acc = torch.zeros(3, dtype=torch.float64, device=buf.device)
        acc = self._acc
        local = buf.to(torch.promote_types(buf.dtype, torch.float32)) / self.scale
        if self.carry_mean:
            mean = self._mean_for(list(bucket.parameters()), buf)
            d = local - mean
            acc[0] += torch.dot(d, d).double()
            acc[1] += torch.dot(d, mean).double()
        else:
            mean = None
            acc[0] += torch.dot(local, local).double()
        del local
        buf.div_(group.size())
        weight = self.weight

        def after(fut: Any) -> Any:
            red = fut.value()[0]
            diff = red.to(torch.promote_types(red.dtype, torch.float32))
            if mean is not None:
                diff = diff - mean
            acc[2] += torch.dot(diff, diff).double()
            if mean is not None:
                mean.add_(diff, alpha=weight)
            return red

        return dist.all_reduce(buf, group=group, async_op=True).get_future().then(after)


class DDPNoise:
    """derive()'s noise phase under DDP: ``measure(budget_s)`` -> :class:`~leadline.lookahead.noise.NoiseScale`.

    Args:
        ddp: the DDP-wrapped model with a :class:`NoiseHook` registered (``hook``).
        hook: that hook (``carry_mean=True``).
        micro_batch_of: ``micro_batch_of(i)`` -> micro-batch i (a dict of model inputs with
            ``scored_tokens``, or the corpus's ``MicroBatch``), None or IndexError at the end;
            rank r reads i = s W + r at step s, the probe's order.
        world: the :class:`~leadline.lookahead.distributed.World`.
        k / max_k: as :func:`~leadline.lookahead.noise.measure_noise_scale`.

    Per step: an agreement on reading the micro-batch, one small all-reduce (the tokens, who ran
    out of data, who is out of time), the forward on every rank and an agreement on it (did any
    forward fail?), the backward through DDP (the hook reads the bucket), one all-gather of
    three scalars a rank. The draws are the
    same on every rank, so every rank stops at the same step.

    Examples:
        Rank 1 of two reads micro-batch 1 first (i = s W + r); when a rank's data has run out,
        every rank stops there (the replies stand for rank 0 reporting the same as rank 1):

        >>> import torch
        >>> from types import SimpleNamespace
        >>> class RankOneOfTwo:
        ...     rank, world_size = 1, 2
        ...     def all_gather(self, values): return [list(values), list(values)]
        ...     def all_reduce(self, values, op="sum"): return [2 * v for v in values]
        >>> ddp = SimpleNamespace(module=torch.nn.Linear(4, 2))   # measure() reads ddp.module's parameters
        >>> def micro_batch_of(i):
        ...     print("micro-batch", i)
        ...     return None                                        # None: the data ran out
        >>> noise = DDPNoise(ddp, NoiseHook(), micro_batch_of, RankOneOfTwo()).measure()
        micro-batch 1
        >>> noise.k, noise.stopped_because, noise.b_noise_tokens, noise.world_size
        (0, 'data', None, 2)
    """

    def __init__(self, ddp: Any, hook: NoiseHook, micro_batch_of: Callable[[int], Any], world: Any,
                 k: int | None = None, max_k: int | None = None) -> None:
        self.ddp, self.hook, self.micro_batch_of, self.world = ddp, hook, micro_batch_of, world
        self.line: Any = None
        self.k, self.max_k = k, max_k

    def _prepare(self, i: int) -> tuple[Any, dict[str, Any], int]:
        """Micro-batch i, its model inputs and its scored tokens (counted on the host)."""
        try:
            mb = self.micro_batch_of(i)
        except IndexError:
            mb = None
        if mb is None:
            return None, {}, 0
        kwargs, t_r = batch_inputs(mb, i)
        if t_r is None:
            labels = kwargs.get("labels")
            if labels is None:
                raise InputError(f"micro-batch {i} has neither labels nor scored_tokens; pass labels (-100 where not "
                                 "scored) or scored_tokens")
            t_r = int((labels[..., 1:] != -100).sum())
        return mb, kwargs, int(t_r)

    def _step(self, i: int, batch: dict[str, Any], t_r: int, total: float, prev_t: float, prev_sq: float,
              params: list[Any], per_rank: bool) -> list[Draw]:
        """One step: the forward (agreed), the backward through DDP with this rank's loss scaled
        by W t_r / T (so the all-reduce is the token-weighted mean), the hook's scalars
        all-gathered, the draws."""
        import torch

        world, hook = self.world, self.hook

        def forward() -> Any:
            with torch.enable_grad():
                loss = self.ddp(**batch).loss
            if loss is None or not bool(torch.isfinite(loss.detach())):
                raise InputError(f"the loss of micro-batch {i} is {None if loss is None else float(loss.detach())} "
                                 "(noise-scale probe under DDP); check these rows and the model's dtype")
            return loss

        loss = agreed(world, forward, f"the noise scale's forward of micro-batch {i}")
        scale = world.world_size * t_r / total
        hook.begin(scale=scale, weight=total / (prev_t + total))
        if self.line is None:  # one per probe: its marks and stop key in the job's store
            from leadline.lookahead.distributed.stopline import StopLine

            self.line = StopLine(world)
        # the backward all-reduces: a rank that fails inside it leaves the others in the all-reduce
        with self.line.guard(f"the noise scale's backward of micro-batch {i}"):
            (loss * scale).backward()
        del loss
        r, x, dd = hook.read()
        for p in params:
            p.grad = None
        got = world.all_gather([float(t_r), r, x])
        return world_draws(prev_t, prev_sq, [g[0] for g in got], [g[1] for g in got], [g[2] for g in got], dd,
                           per_rank=per_rank)

    def measure(self, budget_s: float | None = None) -> DDPNoiseScale:
        """Draw until the estimate settles (or k, max_k, the data, the time): the probe's rule
        (:func:`~leadline.lookahead.noise.measure_noise_scale`), decided on draws every rank shares.
        A rank that expects its next step to end past ``budget_s`` stops every rank."""
        import torch

        world, hook = self.world, self.hook
        n_w, rank = world.world_size, world.rank
        per_rank = n_w <= 2
        limit = int(self.k if self.k is not None else (self.max_k if self.max_k is not None else DEFAULT_MAX_K))
        sums = NoiseSums()
        micro_tokens: list[int] = []
        records: list[Draw] = []
        draws: list[dict[str, Any]] = []
        prev_t, prev_sq = 0.0, 0.0
        skipped, step, stopped = 0, 0, ""
        est = sums.estimate()
        params = [p for p in self.ddp.module.parameters() if p.requires_grad]
        device = params[0].device if params else torch.device("cpu")
        start = _clock()
        hook.active = True
        try:
            while not stopped:
                if len(micro_tokens) >= limit:
                    stopped = "k" if self.k is not None else "max_k"
                    break
                i = step * n_w + rank
                mb, kwargs, t_r = agreed(world, lambda i=i: self._prepare(i), f"the noise scale's micro-batch {i}")
                elapsed = _clock() - start
                late = budget_s is not None and step > 0 and elapsed + elapsed / step > budget_s
                total, missing, out_of_time, empty = world.all_reduce(
                    [float(t_r or 0), float(mb is None), float(late), float(mb is not None and not t_r)], "sum")
                if missing:
                    stopped = "data"
                    break
                if out_of_time:
                    stopped = "time"
                    break
                step += 1
                if empty:  # a rank's micro-batch scores nothing: the step is skipped on every rank
                    skipped += n_w
                    continue
                moved = {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
                         for k, v in kwargs.items()}
                new = self._step(i, moved, t_r, total, prev_t, prev_sq, params, per_rank)
                for d in new:
                    sums.add(d)
                    records.append(d)
                    micro_tokens.append(int(d.tokens))
                    prev_t += d.tokens
                    est = sums.estimate()
                    draws.append({"k": len(micro_tokens), "tokens": int(prev_t),
                                  "estimate": est.b_noise_tokens if est.resolved else None,
                                  "se": est.se_tokens, "g2": est.g2, "s": est.s})
                prev_sq = new[-1].mean_sq
                if self.k is None and len(micro_tokens) >= MIN_DRAWS and est.settled:
                    stopped = "settled"
        finally:
            hook.active = False
            for p in params:
                p.grad = None
        b = est.b_noise_tokens
        return DDPNoiseScale(
            b_noise_tokens=b, se_tokens=est.se_tokens, confirmed_tokens=None if b is None else min(b, prev_t),
            k=len(micro_tokens), micro_tokens=micro_tokens, resolved=est.resolved, settled=est.settled,
            lower_bound=est.lower_bound, upper_bound=est.upper_bound, stopped_because=stopped, estimate=est,
            draws=draws, skipped=skipped, seconds=max(0.0, _clock() - start), records=records, world_size=n_w,
        )


@dataclass
class DDPNoiseScale(NoiseScale):
    """The noise scale read from DDP's all-reduce: a :class:`~leadline.lookahead.noise.NoiseScale` whose
    plan values say where they were read (``world_size`` ranks, through the hook).

    Examples:
        What :meth:`DDPNoise.measure` returns; here from a world of one rank with no data:

        >>> import torch
        >>> from types import SimpleNamespace
        >>> class One:
        ...     rank, world_size = 0, 1
        ...     def all_gather(self, values): return [list(values)]
        ...     def all_reduce(self, values, op="sum"): return list(values)
        >>> ddp = SimpleNamespace(module=torch.nn.Linear(4, 2))
        >>> noise = DDPNoise(ddp, NoiseHook(), lambda i: None, One()).measure()
        >>> v = noise.as_values()["noise_scale_tokens"]
        >>> v.source.endswith("read from DDP's all-reduce on 1 ranks (each rank's micro-batch the small batch)")
        True
        >>> v.evidence["via"], v.evidence["world_size"]
        ('ddp_hook', 1)
    """

    world_size: int = 1

    def as_values(self) -> dict[str, Any]:
        """The plan's noise values, their sentence saying where they were read."""
        from leadline.plan import Value

        n = self.world_size
        how = (f"read from DDP's all-reduce on {n} ranks (each rank's micro-batch the small batch)" if n <= 2 else
               f"read from DDP's all-reduce on {n} ranks (the world's step mean is each draw)")
        out = {}
        for name, v in super().as_values().items():
            ev = dict(v.evidence) if isinstance(v.evidence, dict) else {"evidence": v.evidence}
            ev.update(via="ddp_hook", world_size=n)
            if name == "noise_scale_tokens":
                ev["method"] = METHOD
            out[name] = Value(v.value, v.kind, f"{v.source}; {how}", ev, v.seconds, v.unit)
        return out
