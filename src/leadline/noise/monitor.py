"""The noise scale read inside the training loop, from the micro-batches it computes anyway.

:class:`NoiseMonitor` reads each micro-batch's gradient as the increment it left in ``.grad``
— the difference against a mirror of ``.grad`` — and feeds the same estimator as the probe
(:mod:`leadline.noise.estimator`, McCandlish et al. 2018) with the micro-batches of one
optimizer step as one group. Two fp32 buffers of the trained tensors' size (the mirror of
``.grad`` and the token-weighted mean), no extra forward or backward, no copy of the gradient,
no synchronisation per micro-batch; one synchronisation per optimizer step. The buffers are
flat (a view per tensor), so each norm and update of a whole buffer is one kernel; the two
steps that touch ``.grad`` are ``torch._foreach_*`` calls. That is a handful of launches per
micro-batch, where a hook per tensor (post-accumulate-grad) would cost a Python call and
several kernels per tensor — 420 tensors for LoRA on SmolLM2-135M.

The loop scales each micro-batch's mean loss by ``scale`` before ``backward()`` (by default
1/grad_accum); the monitor divides the increment by it, so it reads the gradient of the mean
loss whatever grad_accum is — the published monitor read the scaled increment, off by 1/k².

:class:`Controller` (opt-in) moves grad_accum toward B* and sets the rate to
anchor × min(1, sqrt(B/B_noise)) (Malladi et al., 2022). On a real model it lost to the
fixed plan (the seed's E6); it stays opt-in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.noise.estimator import Draw, NoiseEstimate, NoiseSums
from leadline.noise.step import time_optimal_tokens

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
    """

    grad_accum: int | None
    lr: float | None
    tokens_per_step: float | None
    se_tokens: float | None
    estimate: NoiseEstimate
    reason: str | None = None


class _Flat:
    """The two buffers for the trained tensors on one device: flat, with a view per tensor,
    so each norm and each update of the whole buffer is one kernel."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        import torch

        from leadline.noise._stream import accumulator_dtype

        dtype = params[0].dtype
        for p in params[1:]:
            dtype = torch.promote_types(dtype, p.dtype)
        dtype = accumulator_dtype(torch.empty(0, dtype=dtype))
        n = sum(p.numel() for p in params)
        self.params = params
        self.mirror = torch.zeros(n, dtype=dtype, device=params[0].device)
        self.mean = torch.zeros_like(self.mirror)
        self.mirror_views, at = [], 0
        for p in params:
            self.mirror_views.append(self.mirror[at:at + p.numel()].view(p.shape))
            at += p.numel()


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
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise InputError("NoiseMonitor found no trained tensors (none with requires_grad); pass the params the optimizer trains")
        if isinstance(window, bool) or not isinstance(window, int) or window < 2:
            raise InputError(f"NoiseMonitor(window={window!r}) needs a whole number of micro-batches >= 2")
        self.grad_accum = grad_accum
        self.window = window
        self.defaults = {
            "tokens_per_micro_batch": tokens_per_micro_batch, "t_micro_seconds": t_micro_seconds,
            "t_step_seconds": t_step_seconds, "anchor_lr": anchor_lr,
        }
        self._flats: list[_Flat] | None = None
        self._home = self.params[0].device
        self._tokens = 0.0
        self._pending: list[tuple[float, Any, Any]] = []
        self._sums = NoiseSums()
        self.steps = 0
        self.history: list[dict[str, Any]] = []

    @property
    def grad_accum(self) -> int:
        return self._grad_accum

    @grad_accum.setter
    def grad_accum(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InputError(f"grad_accum must be a whole number of micro-batches >= 1, got {k!r}")
        self._grad_accum = k

    def _buffers(self) -> list[_Flat]:
        if self._flats is None:
            by_device: dict[Any, list[int]] = {}
            for i, p in enumerate(self.params):
                by_device.setdefault(p.device, []).append(i)
            self._flats = [_Flat([self.params[i] for i in idx]) for idx in by_device.values()]
        return self._flats

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
            raise InputError(f"NoiseMonitor.micro(scored_tokens={scored_tokens!r}) needs the tokens the loss scored, >= 0")
        if scored_tokens == 0:
            return  # scored nothing: no gradient from it
        s = 1.0 / self._grad_accum if scale is None else float(scale)
        if not (s > 0 and math.isfinite(s)):
            raise InputError(f"NoiseMonitor.micro(scale={scale!r}) needs the loss's positive multiplier")
        flats = self._buffers()
        t_prev = self._tokens
        t_now = t_prev + float(scored_tokens)
        r: Any = 0.0
        u: Any = 0.0
        seen = False
        for f in flats:
            pairs = [(p.grad, v) for p, v in zip(f.params, f.mirror_views) if p.grad is not None]
            if not pairs:
                continue  # no gradient on this device: g = 0 there, and so are its buffers
            seen = True
            grads = [g for g, _ in pairs]
            mirror = [v for _, v in pairs]
            torch._foreach_sub_(mirror, grads)  # mirror = previous .grad - .grad = -s g
            if t_prev > 0:
                f.mirror.add_(f.mean, alpha=s)  # = -s (g - m)
            r = r + torch.dot(f.mirror, f.mirror).to(self._home)
            f.mean.add_(f.mirror, alpha=-(float(scored_tokens) / t_now) / s)  # m += (t/T)(g - m)
            u = u + torch.dot(f.mean, f.mean).to(self._home)
            torch._foreach_copy_(mirror, grads)  # mirror = .grad again
        if not seen:
            raise InputError("NoiseMonitor.micro() found no .grad on the trained tensors; call it after the micro-batch's backward()")
        self._tokens = t_now
        self._pending.append((float(scored_tokens), r / (s * s), u))

    def step(self) -> NoiseEstimate:
        """Close the optimizer step: one synchronisation, the step's micro-batches pooled with
        the window's, the buffers zeroed for the next step. Returns the pooled estimate."""
        import torch

        if self._pending:
            vals = torch.stack([torch.stack([r, u]) for _, r, u in self._pending]).double().cpu().tolist()
            self._sums.new_group()
            for (t, _, _), (r, u) in zip(self._pending, vals):
                self._sums.add(Draw(tokens=t, innovation_sq=r, mean_sq=u))
            while len(self._sums.groups) > 1 and self._sums.draws - self._sums.groups[0].draws >= self.window:
                self._sums.drop_oldest()
        k, tokens = len(self._pending), self._tokens
        self._pending = []
        self._tokens = 0.0
        for f in self._flats or []:
            f.mirror.zero_()
            f.mean.zero_()
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
            raise InputError("suggest() needs tokens_per_micro_batch (scored tokens a micro-batch), here or in NoiseMonitor(...)")
        if not est.resolved or est.b_noise_tokens is None:
            why = "fewer than 3 micro-batches read" if est.draws < 3 else "the noise scale does not resolve yet (|G|² or S within one SE of zero)"
            return Suggestion(None, None, None, None, est, reason=why)
        b = est.b_noise_tokens
        target = time_optimal_tokens(b, m, t_step, t_micro) if (t_micro and t_step is not None) else b
        target = max(float(m), min(target, b))
        accum = max(1, round(target / m))
        se = 0.5 * target * (est.se_tokens or 0.0) / b
        lr = anchor * min(1.0, math.sqrt(accum * m / b)) if anchor is not None else None
        return Suggestion(accum, lr, target, se, est)


class Controller:
    """Opt-in: grad_accum and the rate driven by the noise read in the loop (the seed's Controller).

    After each optimizer step's micro-batches, :meth:`step` reads the pooled B_noise, moves
    grad_accum to round(B*/m) when the move in tokens is larger than B*'s own standard error,
    and sets every param group's lr to anchor × min(1, sqrt(B/B_noise)) with B the tokens a
    step now takes. It keeps grad_accum >= ``min_grad_accum`` (2: one micro-batch a step reads
    no noise). As a context manager it puts the optimizer's rates back on exit.

    On SmolLM2-135M (the seed's E6) this lost to the fixed plan: 0.5706 against B*'s 0.5233.
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
            raise InputError(f"Controller needs anchor_lr > 0 and tokens_per_micro > 0, got {anchor_lr!r}, {tokens_per_micro!r}")
        self.opt = opt
        self.anchor_lr = float(anchor_lr)
        self.tokens_per_micro = float(tokens_per_micro)
        self.min_grad_accum = int(min_grad_accum)
        self.monitor = NoiseMonitor(
            params, grad_accum=max(int(grad_accum), self.min_grad_accum), window=window,
            tokens_per_micro_batch=tokens_per_micro, t_micro_seconds=t_micro, t_step_seconds=t_step, anchor_lr=anchor_lr,
        )
        self._saved_lrs = [g["lr"] for g in opt.param_groups]
        self.decisions: list[dict[str, Any]] = []

    @property
    def grad_accum(self) -> int:
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
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
