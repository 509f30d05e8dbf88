"""The rewrite scale and the anchor rate: the rate used only where nothing could be run.

An Adam update moves every entry of a tensor by roughly lr, whatever the gradient's scale
(Kingma & Ba 2015). One step rewrites a tensor W instead of nudging it when
lr * sqrt(numel W) reaches ||W||_F, so its **rewrite scale** is

    rewrite(W) = ||W||_F / sqrt(numel W)        (the root-mean-square entry of W)

and the model's is the smallest over the trained tensors — the **binding** tensor, the first
one a too-large rate rewrites. Tensors that are all zero (classic LoRA's B) have no size and
are skipped. The anchor divides it by a divisor measured once on SmolLM2-135M (docs/rate.md):

    /32   trained as factors (LoRA/PiSSA): rewrite/32 was the first scale that learned
    /320  trained as weights (full fine-tune, grown neurons, a new head): best of four

and below the noise scale applies Adam's square-root rule (Malladi et al. 2022, "On the SDEs
and Scaling Rules for Adaptive Gradient Algorithms"):

    lr = rewrite / divisor * min(1, sqrt(B / B_noise))      never above rewrite / divisor

The divisors are constants (nobody measured them here); the measured rate comes from
``measure_first_step`` and ``lookahead_lr`` whenever they can run. The anchor rate itself is
a ``constant`` Value too: it rests on the divisor, so ``plan.constants()`` lists it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from leadline.errors import InputError
from leadline.plan import Value

DIVISORS: dict[str, int] = {"factors": 32, "weights": 320}
DIVISOR_SOURCES: dict[str, str] = {
    "factors": "LoRA r32 runs on SmolLM2-135M (docs/rate.md): rewrite/2 destroyed the model, "
               "rewrite/32 (1.41e-4) was the first scale that learned, a hand-tuned run at 2e-4 sat near rewrite/45",
    "weights": "full fine-tunes of SmolLM2-135M on MetaMathQA, 60 steps (docs/rate.md): rewrite/320 "
               "reached CE 0.568 from 0.793, best of /32 0.733, /1483 0.605, /3200 0.639",
}

LORA_ZERO_B = (
    "classic LoRA: B starts at zero and has no size, so the scale comes from A, PEFT's random "
    "init (1/sqrt(3 x fan_in) for the widest input): it follows the architecture's width and the "
    "init scheme, not what the model learned"
)
LORA_NONZERO_B = (
    "LoRA's B does not start at zero (a PiSSA/OLoRA/LoftQ/gaussian-style init): the scale comes "
    "from the factors as initialized, which the divisor was not measured on"
)


@dataclass(frozen=True)
class RewriteScale:
    """The rewrite scale of the trained tensors and the tensor that binds it."""

    scale: float
    binding: str
    per_tensor: dict[str, float] = field(default_factory=dict)
    zero_tensors: list[str] = field(default_factory=list)


def rewrite_scale(norms: Mapping[str, tuple[float, int]]) -> RewriteScale:
    """min over tensors of ||W||_F / sqrt(numel W), from ``{name: (frobenius_norm, numel)}``.

    All-zero tensors have no size and are skipped (listed in ``zero_tensors``).
    """
    per: dict[str, float] = {}
    zero: list[str] = []
    for name, (norm, numel) in norms.items():
        if numel <= 0:
            continue
        if norm == 0.0:
            zero.append(name)
            continue
        if not math.isfinite(norm):
            raise InputError(f"trained tensor {name} has a non-finite norm; check the model's weights before deriving "
                             "a rate")
        per[name] = norm / math.sqrt(numel)
    if not per:
        raise InputError("every trained tensor is zero, so no rewrite scale can be read; pass weights with a size "
                         "(e.g. LoRA's A as well as B)")
    binding = min(per, key=per.__getitem__)
    return RewriteScale(per[binding], binding, per, zero)


def adam_sqrt_cut(batch_tokens: float | None, b_noise_tokens: float | None) -> float:
    """min(1, sqrt(B / B_noise)): Adam's square-root rule below the noise scale (Malladi et al.
    2022); 1 when either is unknown, never above 1."""
    if batch_tokens is None or b_noise_tokens is None:
        return 1.0
    if batch_tokens <= 0 or b_noise_tokens <= 0:
        raise InputError(f"the batch and the noise scale must be positive token counts, got B={batch_tokens}, "
                         f"B_noise={b_noise_tokens}")
    return min(1.0, math.sqrt(batch_tokens / b_noise_tokens))


def lora_caveat(names_and_zero: Iterable[tuple[str, bool]]) -> str | None:
    """The LoRA-init caveat: says B starts at zero (classic LoRA) or not (another init)."""
    b = [(n, z) for n, z in names_and_zero if "lora_B" in n]
    if not b:
        return None
    return LORA_ZERO_B if all(z for _, z in b) else LORA_NONZERO_B


@dataclass(frozen=True)
class AnchorRate:
    """The anchor rate and what it rests on."""

    lr: float
    rewrite: RewriteScale
    trained_as: str
    divisor: int
    cut: float
    batch_tokens: float | None = None
    b_noise_tokens: float | None = None
    caveat: str | None = None

    def as_values(self) -> dict[str, Value]:
        """``rewrite_scale`` (derived from the weights), ``rate_divisor`` (constant, from the seed) and
        ``lr_anchor`` (constant: it rests on the divisor nobody measured here)."""
        caveat = f"; {self.caveat}" if self.caveat else ""
        cut = (f" x sqrt(B {self.batch_tokens:.0f} / B_noise {self.b_noise_tokens:.0f}) = x{self.cut:.3g}"
               if self.cut < 1.0 else " (no cut: the batch is at or above the noise scale, or it is unknown)")
        ev = {"binding": self.rewrite.binding, "per_tensor": self.rewrite.per_tensor,
              "zero_tensors": self.rewrite.zero_tensors, "cut": self.cut,
              "batch_tokens": self.batch_tokens, "b_noise_tokens": self.b_noise_tokens, "caveat": self.caveat}
        return {
            "rewrite_scale": Value(
                self.rewrite.scale, "derived",
                f"||W||_F/sqrt(numel W) of the binding trained tensor {self.rewrite.binding} (the smallest of "
                f"{len(self.rewrite.per_tensor)}){caveat}",
                evidence=ev, unit="per step"),
            "rate_divisor": Value(
                self.divisor, "constant",
                f"/{self.divisor} for tensors trained as {self.trained_as}, not measured here: "
                f"{DIVISOR_SOURCES[self.trained_as]}"),
            "lr_anchor": Value(
                self.lr, "constant",
                f"rewrite {self.rewrite.scale:.3g} / {self.divisor} (the constant divisor){cut}, never above the "
                f"anchor; used only where the rate could not be run{caveat}",
                evidence=ev, unit="per step"),
        }


def anchor_from_scale(rewrite: RewriteScale, trained_as: str, *, batch_tokens: float | None = None,
                      b_noise_tokens: float | None = None, caveat: str | None = None) -> AnchorRate:
    """lr = rewrite / divisor * min(1, sqrt(B / B_noise)) (pure)."""
    if trained_as not in DIVISORS:
        raise InputError("trained_as must be 'factors' (LoRA/PiSSA) or 'weights' (full fine-tune, grown neurons, a "
                         f"head), got {trained_as!r}")
    divisor = DIVISORS[trained_as]
    cut = adam_sqrt_cut(batch_tokens, b_noise_tokens)
    return AnchorRate(rewrite.scale / divisor * cut, rewrite, trained_as, divisor, cut, batch_tokens, b_noise_tokens,
                      caveat)


def anchor_rate(named_weights: Mapping[str, Any] | Iterable[tuple[str, Any]], trained_as: str, *,
                batch_tokens: float | None = None, b_noise_tokens: float | None = None,
                norms: Mapping[str, tuple[float, int]] | None = None) -> AnchorRate:
    """Read the rewrite scale off the trained tensors (``{name: tensor}`` or ``(name, tensor)``
    pairs, e.g. ``model.named_parameters()`` filtered to the trained ones) and build the anchor
    rate, with the LoRA-init caveat.

    Args:
        named_weights: the trained tensors by name.
        trained_as: ``"factors"`` (LoRA/PiSSA) or ``"weights"`` (full fine-tune, a head).
        batch_tokens: the step's scored tokens B (for the square-root cut).
        b_noise_tokens: the noise scale B_noise in scored tokens.
        norms: ``{name: (frobenius_norm, numel)}`` read already, in place of reading them off
            ``named_weights`` (a sharded model's, summed over the ranks:
            :meth:`~leadline.distributed.ShardedGradFn.weight_norms`).
    """
    import torch

    items = list(named_weights.items()) if isinstance(named_weights, Mapping) else list(named_weights)
    if not items:
        raise InputError("named_weights is empty; pass the trained tensors by name, e.g. {n: p for n, p in "
                         "model.named_parameters() if p.requires_grad}")
    if norms is None:
        read: dict[str, tuple[float, int]] = {}
        with torch.no_grad():
            for name, t in items:
                read[name] = (float(torch.linalg.vector_norm(t.detach().float())), t.numel())
        norms = read
    zero = [(name, norm == 0.0) for name, (norm, _) in norms.items()]
    return anchor_from_scale(rewrite_scale(norms), trained_as, batch_tokens=batch_tokens,
                             b_noise_tokens=b_noise_tokens, caveat=lora_caveat(zero))
