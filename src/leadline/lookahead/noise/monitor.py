"""The noise scale read inside the training loop, from the micro-batches it computes anyway.

:class:`NoiseMonitor` reads each micro-batch's gradient as the increment it left in ``.grad``
and feeds the same estimator as the probe (:mod:`leadline.lookahead.noise.estimator`, McCandlish et al.
2018) with the micro-batches of one optimizer step as one group. No extra forward or backward,
no synchronisation per micro-batch; one synchronisation per optimizer step.

The trained tensors of one device and dtype share a flat gradient buffer in their dtype; each
``.grad`` is a view of it. At the first ``micro()`` of a step, and whenever a ``.grad`` is not
its view (after ``zero_grad(set_to_none=True)`` backward makes fresh ones), the monitor copies
``.grad`` into the view (one ``torch._foreach_copy_``; a None ``.grad`` stays None, its view
zeroed) and sets ``.grad`` to it. Autograd then adds the next micro-batches' gradients into the
views in place (as it does whenever ``.grad`` is defined and ``create_graph`` is off), so
``.grad`` holds, bit for bit, what it would without the monitor, and a micro-batch's increment
is the buffer minus a mirror of it: a handful of kernels on whole buffers and an identity check
of each ``.grad``; no list of gradients, no ``torch._foreach_*`` over the tensors, no hook.

Memory: the mirror and the token-weighted mean, two accumulator-dtype (fp32) buffers of the
trained tensors' size; the gradient buffer stands in for autograd's ``.grad``.
``zero_grad(set_to_none=False)`` zeroes it in place for the next step; after
``set_to_none=True`` the next step's first ``micro()`` copies the fresh ``.grad`` into it. A
buffer of 64 MiB or more is held until then only through the ``.grad`` that are its views, so
that zeroing frees it as it frees autograd's own; a smaller one is kept, beside the fresh
``.grad`` (making its views again would cost more time than that memory is worth).

The loop scales each micro-batch's mean loss by ``scale`` before ``backward()`` (by default
1/grad_accum); the monitor divides the increment by it, so it reads the gradient of the mean
loss whatever grad_accum is (reading the scaled increment would be off by 1/k²).

:class:`Controller` (opt-in) moves grad_accum toward B* and sets the rate to
anchor × min(1, sqrt(B/B_noise)) (Malladi et al., 2022). It stays opt-in: on a real model it
lost to the fixed plan (measured: docs/noise.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.lookahead.noise.estimator import Draw, NoiseEstimate, NoiseSums
from leadline.lookahead.noise.monitor_buffers import _Group, _is_sharded
from leadline.lookahead.noise.step import time_optimal_tokens

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Suggestion:
    """What the noise as it is now asks for.

    Attributes:
        grad_accum: micro-batches a step for B* (or None when the noise is not resolved).
        lr: anchor × min(1, sqrt(B/B_noise)) at that grad_accum (None without an anchor).
        tokens_per_step: the target B* in scored tokens; its standard error ``se_tokens``
            (B* ∝ sqrt(B_noise): half B_noise's relative error).
        estimate: the pooled estimate it came from.
        reason: why there is no suggestion, when there is none.

    Examples:
        Eight steps of 4 micro-batches of 100 tokens from a source whose true B_noise is 400 tokens:

        >>> import torch
        >>> from leadline.lookahead.noise.synthetic import KnownNoise
        >>> source = KnownNoise(b_noise_tokens=400, dim=64, tokens=(100, 100), seed=0)
        >>> w = torch.zeros(64, requires_grad=True)
        >>> mon = NoiseMonitor([w], grad_accum=4)
        >>> for i in range(32):
        ...     g, t = source(i)
        ...     (w @ g / mon.grad_accum).backward()          # a loss whose gradient is g
        ...     mon.micro(t)
        ...     if i % 4 == 3:
        ...         est = mon.step()
        ...         w.grad = None
        >>> sug = mon.suggest(tokens_per_micro_batch=100, anchor_lr=1e-3)
        >>> round(sug.estimate.b_noise_tokens), sug.grad_accum, round(sug.lr, 6)  # B* = B_noise without times
        (435, 4, 0.000959)
        >>> round(sug.se_tokens, 1) == round(sug.estimate.se_tokens / 2, 1)      # B* ∝ sqrt(B_noise)
        True
    """

    grad_accum: int | None
    lr: float | None
    tokens_per_step: float | None
    se_tokens: float | None
    estimate: NoiseEstimate
    reason: str | None = None


_RELEASE_BYTES = 64 << 20  # a gradient buffer this big is let go between steps (see the module)


class NoiseMonitor:
    """B_noise from the gradients an accumulating loop already computes.

    Args:
        params: the trained tensors (those without ``requires_grad`` are ignored).
        grad_accum: micro-batches per optimizer step; the default loss ``scale`` is 1/grad_accum.
            At least 2 for a reading: one micro-batch a step gives |G|² but no noise.
        window: pool the last this-many micro-batches (whole steps).
        tokens_per_micro_batch, t_micro_seconds, t_step_seconds, anchor_lr: the defaults of
            :meth:`suggest`.

    Use::

        mon = NoiseMonitor(trained_params, grad_accum=k)
        for step in range(steps):
            for _ in range(mon.grad_accum):
                mb = next_micro_batch()
                (model(**mb).loss / mon.grad_accum).backward()
                mon.micro(mb.scored_tokens)
            mon.step()                      # one sync; returns the pooled estimate
            opt.step(); opt.zero_grad(set_to_none=True)

    ``.grad`` must hold only this step's micro-batches: zeroed (or None) before the first.
    From the first ``micro()`` of a step each ``.grad`` is a view of the monitor's buffer; code
    that replaces a ``.grad`` (not updating it in place) costs a copy at the next ``micro()``.

    Examples:
        One-number gradients 1 and 3 of one token each in one step of grad_accum 2: S = var(1, 3) = 2,
        |G|² = 2² - S/T = 3 (as :class:`~leadline.lookahead.noise.estimator.NoiseSums` reads them).

        >>> import torch
        >>> w = torch.zeros(1, requires_grad=True)
        >>> mon = NoiseMonitor([w], grad_accum=2)
        >>> for g in (1.0, 3.0):
        ...     (w * g / mon.grad_accum).sum().backward()     # the mean loss scaled by 1/grad_accum
        ...     mon.micro(1)
        >>> est = mon.step()
        >>> est.s, est.g2, est.draws
        (2.0, 3.0, 2)
        >>> w.grad                                            # .grad as without the monitor: (1 + 3) / 2
        tensor([2.])
        >>> mon.suggest(tokens_per_micro_batch=1).reason
        'fewer than 3 micro-batches read'
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        grad_accum: int = 1,
        window: int = 128,
        tokens_per_micro_batch: float | None = None,
        t_micro_seconds: float | None = None,
        t_step_seconds: float | None = None,
        anchor_lr: float | None = None,
    ) -> None:
        self.params = list({id(p): p for p in params if p.requires_grad}.values())
        if not self.params:
            raise InputError("NoiseMonitor found no trained tensors (none with requires_grad); pass the params the "
                             "optimizer trains")
        if any(_is_sharded(p) for p in self.params):
            raise InputError("NoiseMonitor reads whole .grad tensors, and these parameters are sharded (DTensor, e.g. "
                             "FSDP's fully_shard); read the noise on one GPU or under DDP, or with "
                             "leadline.measure_noise_scale on an unsharded copy")
        if isinstance(window, bool) or not isinstance(window, int) or window < 2:
            raise InputError(f"NoiseMonitor(window={window!r}) needs a whole number of micro-batches >= 2")
        self.grad_accum = grad_accum
        self.window = window
        self.defaults = {
            "tokens_per_micro_batch": tokens_per_micro_batch, "t_micro_seconds": t_micro_seconds,
            "t_step_seconds": t_step_seconds, "anchor_lr": anchor_lr,
        }
        self._groups: list[_Group] | None = None
        self._home = self.params[0].device
        self._tokens = 0.0
        self._pending: list[tuple[float, float, Any, Any]] = []
        self._sums = NoiseSums()
        self.steps = 0
        self.history: list[dict[str, Any]] = []

    @property
    def grad_accum(self) -> int:
        """Micro-batches per optimizer step (settable; a whole number >= 1)."""
        return self._grad_accum

    @grad_accum.setter
    def grad_accum(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InputError(f"grad_accum must be a whole number of micro-batches >= 1, got {k!r}")
        self._grad_accum = k

    def _buffers(self) -> list[_Group]:
        if self._groups is None:
            by_kind: dict[Any, list[torch.Tensor]] = {}
            for p in self.params:
                by_kind.setdefault((p.device, p.dtype), []).append(p)
            self._groups = [_Group(ps) for ps in by_kind.values()]
        return self._groups

    def micro(self, scored_tokens: int, scale: float | None = None) -> None:
        """Read the micro-batch whose ``backward()`` just ran.

        Args:
            scored_tokens: the tokens its loss scored (a host int: no synchronisation).
            scale: what the loop multiplied the micro-batch's MEAN loss by before backward
                (default 1/grad_accum; with token weighting, t_j/T_step).
        """
        import torch

        if hasattr(scored_tokens, "item"):
            scored_tokens = int(scored_tokens.item())
        if isinstance(scored_tokens, bool) or not isinstance(scored_tokens, (int, float)) or scored_tokens < 0:
            raise InputError(f"NoiseMonitor.micro(scored_tokens={scored_tokens!r}) needs the tokens the loss scored, "
                             ">= 0")
        if scored_tokens == 0:
            return  # scored nothing: no gradient from it
        s = 1.0 / self._grad_accum if scale is None else float(scale)
        if not (s > 0 and math.isfinite(s)):
            raise InputError(f"NoiseMonitor.micro(scale={scale!r}) needs the loss's positive multiplier")
        groups = self._buffers()
        t_prev = self._tokens
        t_now = t_prev + float(scored_tokens)
        r: Any = None  # the squared norms, summed over the groups
        u: Any = None
        for grp in groups:
            grp.take()
            if not grp.live:
                continue  # no .grad on these tensors: g = 0 there, and so are its buffers
            grad, mirror, mean = grp.grad, grp.mirror, grp.mean
            mirror.sub_(grad)  # mirror = previous .grad - .grad = -s g
            if t_prev > 0:
                mirror.add_(mean, alpha=s)  # = -s (g - m)
            ri = torch.dot(mirror, mirror).to(self._home)
            mean.add_(mirror, alpha=-(float(scored_tokens) / t_now) / s)  # m += (t/T)(g - m)
            ui = torch.dot(mean, mean).to(self._home)
            r, u = (ri, ui) if r is None else (r + ri, u + ui)
            mirror.copy_(grad)  # mirror = .grad again
        if r is None:
            raise InputError("NoiseMonitor.micro() found no .grad on the trained tensors; call it after the "
                             "micro-batch's backward()")
        self._tokens = t_now
        self._pending.append((float(scored_tokens), s, r, u))

    def step(self) -> NoiseEstimate:
        """Close the optimizer step: one synchronisation, the step's micro-batches pooled with
        the window's, the buffers zeroed for the next step. Returns the pooled estimate."""
        import torch

        if self._pending:
            vals = torch.stack([x for _, _, r, u in self._pending for x in (r, u)]).double().cpu().tolist()
            self._sums.new_group()
            for j, (t, s, _, _) in enumerate(self._pending):
                self._sums.add(Draw(tokens=t, innovation_sq=vals[2 * j] / (s * s), mean_sq=vals[2 * j + 1]))
            while len(self._sums.groups) > 1 and self._sums.draws - self._sums.groups[0].draws >= self.window:
                self._sums.drop_oldest()
        k, tokens = len(self._pending), self._tokens
        self._pending = []
        self._tokens = 0.0
        for grp in self._groups or []:
            grp.release(_RELEASE_BYTES)
        est = self._sums.estimate()
        self.history.append({
            "step": self.steps, "k": k, "tokens": tokens, "b_noise_tokens": est.b_noise_tokens,
            "se_tokens": est.se_tokens, "resolved": est.resolved, "window_draws": est.draws,
        })
        self.steps += 1
        return est

    def estimate(self) -> NoiseEstimate:
        """The pooled estimate over the window (closed steps only)."""
        return self._sums.estimate()

    def suggest(
        self,
        tokens_per_micro_batch: float | None = None,
        t_micro_seconds: float | None = None,
        t_step_seconds: float | None = None,
        anchor_lr: float | None = None,
    ) -> Suggestion:
        """grad_accum and the rate for the noise as it is now.

        B* = sqrt(B_noise × m × t_step / t_micro) (without the times: B_noise, the knee),
        clamped to [one micro-batch, B_noise]; grad_accum = round(B*/m) >= 1;
        lr = anchor × min(1, sqrt(grad_accum × m / B_noise)) (Malladi et al., 2022: Adam's
        square-root rule). Arguments left None take the constructor's.
        """
        m = tokens_per_micro_batch if tokens_per_micro_batch is not None else self.defaults["tokens_per_micro_batch"]
        t_micro = t_micro_seconds if t_micro_seconds is not None else self.defaults["t_micro_seconds"]
        t_step = t_step_seconds if t_step_seconds is not None else self.defaults["t_step_seconds"]
        anchor = anchor_lr if anchor_lr is not None else self.defaults["anchor_lr"]
        est = self.estimate()
        if m is None:
            raise InputError("suggest() needs tokens_per_micro_batch (scored tokens a micro-batch), here or in "
                             "NoiseMonitor(...)")
        if not est.resolved or est.b_noise_tokens is None:
            why = ("fewer than 3 micro-batches read" if est.draws < 3
                   else "the noise scale does not resolve yet (|G|² or S within one SE of zero)")
            return Suggestion(None, None, None, None, est, reason=why)
        b = est.b_noise_tokens
        target = time_optimal_tokens(b, m, t_step, t_micro) if (t_micro and t_step is not None) else b
        target = max(float(m), min(target, b))
        accum = max(1, round(target / m))
        se = 0.5 * target * (est.se_tokens or 0.0) / b
        lr = anchor * min(1.0, math.sqrt(accum * m / b)) if anchor is not None else None
        return Suggestion(accum, lr, target, se, est)


class Controller:
    """Opt-in: grad_accum and the rate driven by the noise read in the loop.

    After each optimizer step's micro-batches, :meth:`step` reads the pooled B_noise, moves
    grad_accum to round(B*/m) when the move in tokens is larger than B*'s own standard error,
    and sets every param group's lr to anchor × min(1, sqrt(B/B_noise)) with B the tokens a
    step now takes. It keeps grad_accum >= ``min_grad_accum`` (2: one micro-batch a step reads
    no noise). As a context manager it puts the optimizer's rates back on exit.

    Opt-in: on a real model it lost to the fixed plan (measured: docs/noise.md).

    Examples:
        A source whose true B_noise is 400 tokens, 100 tokens a micro-batch, starting at grad_accum 2:

        >>> import torch
        >>> from leadline.lookahead.noise.synthetic import KnownNoise
        >>> source = KnownNoise(b_noise_tokens=400, dim=64, tokens=(100, 100), seed=0)
        >>> w = torch.zeros(64, requires_grad=True)
        >>> opt = torch.optim.SGD([w], lr=0.1)
        >>> draws = iter(range(1000))
        >>> with Controller([w], opt, anchor_lr=1e-3, tokens_per_micro=100, grad_accum=2) as ctl:
        ...     for step in range(6):
        ...         for _ in range(ctl.grad_accum):
        ...             g, t = source(next(draws))
        ...             (w @ g / ctl.grad_accum).backward()
        ...             ctl.micro(t)
        ...         _ = ctl.step()                      # then opt.step() in a run
        ...         opt.zero_grad(set_to_none=True)
        ...     print([d["next_grad_accum"] for d in ctl.decisions], round(opt.param_groups[0]["lr"], 6))
        [2, 4, 3, 3, 3, 3] 0.000994
        >>> opt.param_groups[0]["lr"]            # put back on exit
        0.1
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        opt: Any,
        anchor_lr: float,
        tokens_per_micro: float,
        grad_accum: int,
        t_micro: float | None = None,
        t_step: float | None = None,
        window: int = 128,
        min_grad_accum: int = 2,
    ) -> None:
        if not (anchor_lr > 0 and tokens_per_micro > 0):
            raise InputError(f"Controller needs anchor_lr > 0 and tokens_per_micro > 0, got {anchor_lr!r}, "
                             f"{tokens_per_micro!r}")
        self.opt = opt
        self.anchor_lr = float(anchor_lr)
        self.tokens_per_micro = float(tokens_per_micro)
        self.min_grad_accum = int(min_grad_accum)
        self.monitor = NoiseMonitor(
            params, grad_accum=max(int(grad_accum), self.min_grad_accum), window=window,
            tokens_per_micro_batch=tokens_per_micro, t_micro_seconds=t_micro, t_step_seconds=t_step,
            anchor_lr=anchor_lr,
        )
        self._saved_lrs = [g["lr"] for g in opt.param_groups]
        self.decisions: list[dict[str, Any]] = []

    @property
    def grad_accum(self) -> int:
        """Micro-batches the next optimizer step takes."""
        return self.monitor.grad_accum

    def micro(self, scored_tokens: int) -> None:
        """After each micro-batch's ``(loss / ctl.grad_accum).backward()``."""
        self.monitor.micro(scored_tokens)

    def step(self) -> Suggestion:
        """Before ``opt.step()``: read the noise, move grad_accum, set the rate."""
        self.monitor.step()
        sug = self.monitor.suggest()
        before = self.grad_accum
        if sug.grad_accum is not None and sug.tokens_per_step is not None:
            move = abs(sug.tokens_per_step - before * self.tokens_per_micro)
            if move > (sug.se_tokens or 0.0):
                self.monitor.grad_accum = max(self.min_grad_accum, sug.grad_accum)
            b = sug.estimate.b_noise_tokens or math.inf
            # the rate for the batch this step took; the next step's batch takes effect next time
            lr = self.anchor_lr * min(1.0, math.sqrt(before * self.tokens_per_micro / b))
            for g in self.opt.param_groups:
                g["lr"] = lr
        self.decisions.append({"step": self.monitor.steps - 1, "grad_accum": before, "next_grad_accum": self.grad_accum,
                               "lr": self.opt.param_groups[0]["lr"], "b_noise_tokens": sug.estimate.b_noise_tokens})
        return sug

    def close(self) -> None:
        """Put the optimizer's rates back as they were."""
        for g, lr in zip(self.opt.param_groups, self._saved_lrs):
            g["lr"] = lr

    def __enter__(self) -> Controller:
        """The controller itself; :meth:`close` runs on exit, an exception included."""
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
