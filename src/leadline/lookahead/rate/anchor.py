"""The rewrite scale and the anchor rate: the rate used only where nothing could be run.

An Adam update moves every entry of a tensor by roughly lr, whatever the gradient's scale
(Kingma & Ba 2015). One step rewrites a tensor W instead of nudging it when
lr * sqrt(numel W) reaches ||W||_F, so its **rewrite scale** is

    rewrite(W) = ||W||_F / sqrt(numel W)        (the root-mean-square entry of W)

and the model's is the smallest over the trained tensors — the **binding** tensor, the first
one a too-large rate rewrites. Tensors that are all zero (classic LoRA's B) have no size and
are skipped. The anchor divides it by a constant divisor (measured once: docs/rate.md, "The anchor"):

    /32   trained as factors (LoRA/PiSSA)
    /320  trained as weights (full fine-tune, grown neurons, a new head)

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
    """The rewrite scale of the trained tensors and the tensor that binds it.

    Attributes:
        scale: the smallest ||W||_F / sqrt(numel W) over the tensors that are not all zero.
        binding: the name of the tensor that has it.
        per_tensor: every such tensor's own scale.
        zero_tensors: the all-zero tensors, skipped.

    Examples:
        >>> r = RewriteScale(0.5, "A", {"A": 0.5, "W": 2.0}, ["B"])
        >>> r.scale, r.binding, r.zero_tensors
        (0.5, 'A', ['B'])
    """

    scale: float
    binding: str
    per_tensor: dict[str, float] = field(default_factory=dict)
    zero_tensors: list[str] = field(default_factory=list)


def rewrite_scale(norms: Mapping[str, tuple[float, int]]) -> RewriteScale:
    """min over tensors of ||W||_F / sqrt(numel W), from ``{name: (frobenius_norm, numel)}``.

    All-zero tensors have no size and are skipped (listed in ``zero_tensors``); a non-finite
    norm, or no tensor left, is an :class:`~leadline.errors.InputError`.

    Examples:
        A 4 x 4 tensor of norm 2 has a root-mean-square entry of 2 / sqrt(16) = 0.5:

        >>> rewrite_scale({"A": (2.0, 16), "B": (0.0, 16), "W": (8.0, 16)})
        RewriteScale(scale=0.5, binding='A', per_tensor={'A': 0.5, 'W': 2.0}, zero_tensors=['B'])
        >>> rewrite_scale({"B": (0.0, 16)})
        Traceback (most recent call last):
            ...
        leadline.errors.InputError: every trained tensor is zero, so no rewrite scale can be read; ...
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
    """min(1, sqrt(B / B_noise)): Adam's square-root rule below the noise scale; 1 when either is
    unknown, never above 1.

    References:
        Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms",
        <https://arxiv.org/abs/2205.10287>.

    Examples:
        >>> adam_sqrt_cut(1000, 4000), adam_sqrt_cut(8000, 4000), adam_sqrt_cut(None, 4000)
        (0.5, 1.0, 1.0)
    """
    if batch_tokens is None or b_noise_tokens is None:
        return 1.0
    if batch_tokens <= 0 or b_noise_tokens <= 0:
        raise InputError(f"the batch and the noise scale must be positive token counts, got B={batch_tokens}, "
                         f"B_noise={b_noise_tokens}")
    return min(1.0, math.sqrt(batch_tokens / b_noise_tokens))


def lora_caveat(names_and_zero: Iterable[tuple[str, bool]]) -> str | None:
    """The LoRA-init caveat from ``(name, all_zero)`` pairs: :data:`LORA_ZERO_B` when every
    ``lora_B`` tensor is zero (classic LoRA), :data:`LORA_NONZERO_B` when one is not (another
    init), None when there is no ``lora_B``.

    Examples:
        >>> lora_caveat([("q.lora_A", False), ("q.lora_B", True)]) == LORA_ZERO_B
        True
        >>> lora_caveat([("q.lora_A", False), ("q.lora_B", False)]) == LORA_NONZERO_B
        True
        >>> lora_caveat([("mlp.weight", False)]) is None
        True
    """
    b = [(n, z) for n, z in names_and_zero if "lora_B" in n]
    if not b:
        return None
    return LORA_ZERO_B if all(z for _, z in b) else LORA_NONZERO_B


@dataclass(frozen=True)
class AnchorRate:
    """The anchor rate and what it rests on: lr = rewrite.scale / divisor x cut.

    Attributes:
        lr: the anchor rate.
        rewrite: the rewrite scale it divides.
        trained_as: ``"factors"`` or ``"weights"``, which picks the divisor.
        divisor: 32 or 320 (:data:`DIVISORS`).
        cut: min(1, sqrt(B / B_noise)) (:func:`adam_sqrt_cut`).
        caveat: the LoRA-init caveat, if any (:func:`lora_caveat`).

    Examples:
        >>> a = anchor_from_scale(RewriteScale(0.5, "w"), "factors", batch_tokens=1000, b_noise_tokens=4000)
        >>> {name: (v.value, v.kind) for name, v in a.as_values().items()}
        {'rewrite_scale': (0.5, 'derived'), 'rate_divisor': (32, 'constant'), 'lr_anchor': (0.0078125, 'constant')}
    """

    lr: float
    rewrite: RewriteScale
    trained_as: str
    divisor: int
    cut: float
    batch_tokens: float | None = None
    b_noise_tokens: float | None = None
    caveat: str | None = None

    def as_values(self) -> dict[str, Value]:
        """``rewrite_scale`` (derived from the weights), ``rate_divisor`` (constant, measured once
        elsewhere: docs/rate.md) and ``lr_anchor`` (constant: it rests on the divisor nobody
        measured here)."""
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
    """lr = rewrite / divisor * min(1, sqrt(B / B_noise)) (pure): the anchor from a rewrite scale
    read already.

    Examples:
        rewrite 0.5 / 32, then halved by sqrt(1000 / 4000):

        >>> anchor_from_scale(RewriteScale(0.5, "w"), "factors").lr
        0.015625
        >>> anchor_from_scale(RewriteScale(0.5, "w"), "factors", batch_tokens=1000, b_noise_tokens=4000).lr
        0.0078125
        >>> anchor_from_scale(RewriteScale(0.5, "w"), "lora")
        Traceback (most recent call last):
            ...
        leadline.errors.InputError: trained_as must be 'factors' (LoRA/PiSSA) or 'weights' (...), got 'lora'
    """
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
            :meth:`~leadline.lookahead.distributed.ShardedGradFn.weight_norms`).

    Returns:
        :class:`AnchorRate`; ``.as_values()`` gives the plan's ``rewrite_scale``,
        ``rate_divisor`` and ``lr_anchor``.

    Examples:
        A 4 x 4 tensor of 0.5s has rewrite scale 0.5; trained as weights, 0.5 / 320; the
        all-zero bias is skipped:

        >>> import torch
        >>> a = anchor_rate({"w": torch.full((4, 4), 0.5), "b": torch.zeros(4)}, "weights")
        >>> a.lr, a.rewrite.binding, a.rewrite.zero_tensors
        (0.0015625, 'w', ['b'])
        >>> anchor_rate({"w": torch.full((4, 4), 0.5)}, "weights", batch_tokens=1000, b_noise_tokens=4000).lr
        0.00078125
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
