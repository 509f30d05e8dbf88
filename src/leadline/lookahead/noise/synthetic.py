"""A gradient source with a KNOWN noise scale, for tests, examples and benchmarks.

Micro-batch i scores t_i tokens and its gradient is the mean of t_i per-token gradients
G + L z (z standard normal, Σ = L Lᵀ = diag(λ)); the mean is drawn directly as
g_i = G + sqrt(λ) ⊙ z / sqrt(t_i), so E|g_i|² = |G|² + tr(Σ)/t_i exactly and
B_noise = tr(Σ)/|G|² = sum(λ)/|G|² by construction (McCandlish et al., 2018).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError

if TYPE_CHECKING:
    import torch


class KnownNoise:
    """``source(i) -> (gradient, t_i)``: a fixed G plus per-token noise of known variance.

    Args:
        b_noise_tokens: the true B_noise = tr(Σ)/|G|².
        dim: the gradient's length.
        tokens: (lo, hi): each micro-batch scores a whole number drawn uniformly in [lo, hi].
        micro_batches: how many there are (None: without end).
        split: tensor shapes to cut the flat gradient into (a per-tensor list), or None for
            one flat tensor. The same seed gives the same numbers either way.
        spread: λ runs from 1 to ``spread`` (log-spaced): an anisotropic Σ.
        seed: the generator's seed (G, the token counts and the noise all come from it).
        dtype: the gradient's dtype.

    Examples:
        >>> import torch
        >>> source = KnownNoise(b_noise_tokens=1_000, dim=8, micro_batches=2, seed=0)
        >>> round(source.trace / float(source.G.norm() ** 2))     # tr(Σ)/|G|² by construction
        1000
        >>> g, t = source(0)
        >>> g.shape, g.dtype, t, t == source.tokens_of(0)
        (torch.Size([8]), torch.float32, 104, True)
        >>> print(source(2))                                      # past micro_batches: the data ran out
        None
        >>> parts, _ = KnownNoise(1_000, dim=8, split=[(2, 3), (2,)], seed=0)(0)
        >>> [tuple(x.shape) for x in parts], bool((torch.cat([x.reshape(-1) for x in parts]) == g).all())
        ([(2, 3), (2,)], True)
    """

    def __init__(
        self,
        b_noise_tokens: float,
        dim: int = 4096,
        tokens: tuple[int, int] = (100, 1500),
        micro_batches: int | None = None,
        split: Sequence[Sequence[int]] | None = None,
        spread: float = 10.0,
        seed: int = 0,
        dtype: Any = None,
    ) -> None:
        import torch

        if not b_noise_tokens > 0:
            raise InputError(f"KnownNoise(b_noise_tokens={b_noise_tokens!r}) must be > 0")
        self.b_noise_tokens = float(b_noise_tokens)
        self.dim, self.tokens, self.micro_batches = dim, tokens, micro_batches
        self.dtype = dtype or torch.float32
        gen = torch.Generator().manual_seed(seed)
        lam = torch.logspace(0.0, math.log10(spread), dim, dtype=torch.float64)
        self.sqrt_lam = lam.sqrt()
        self.trace = float(lam.sum())
        g = torch.randn(dim, generator=gen, dtype=torch.float64)
        self.G = g * math.sqrt(self.trace / self.b_noise_tokens) / g.norm()
        self.seed = seed
        if split is not None and sum(math.prod(s) for s in split) != dim:
            raise InputError(f"KnownNoise(split=...) shapes hold {sum(math.prod(s) for s in split)} numbers, not "
                             f"dim={dim}")
        self.split = [tuple(s) for s in split] if split is not None else None

    def tokens_of(self, i: int) -> int:
        """Micro-batch i's scored tokens, t_i (the same for a given seed and i)."""
        import torch

        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + 2 * i + 1)
        lo, hi = self.tokens
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    def flat(self, i: int) -> torch.Tensor:
        """Micro-batch i's gradient as one flat float64 tensor."""
        import torch

        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + 2 * i + 2)
        z = torch.randn(self.dim, generator=gen, dtype=torch.float64)
        return self.G + self.sqrt_lam * z / math.sqrt(self.tokens_of(i))

    def __call__(self, i: int) -> tuple[Any, int] | None:
        """``(gradient, t_i)`` for micro-batch i in ``dtype`` (cut by ``split``), or None past the end."""
        if self.micro_batches is not None and i >= self.micro_batches:
            return None
        g = self.flat(i).to(self.dtype)
        if self.split is None:
            return g, self.tokens_of(i)
        out, at = [], 0
        for shape in self.split:
            n = math.prod(shape)
            out.append(g[at:at + n].reshape(shape).clone())
            at += n
        return out, self.tokens_of(i)
