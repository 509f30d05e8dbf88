"""The LoRA adapter a model trains through, read from its PEFT config, as the plan's values; and
its alpha set after the adapter was made.

LoRA (Hu et al. 2021) adds ``(alpha / r) * B @ A`` to each targeted weight, ``A`` of ``r`` rows,
``B`` zero at the start: the rank sets the adapter's size, alpha the scale of its update (the
rate it effectively trains at), the targets the layers it adapts, dropout the share of its input
dropped. leadline's default: rank 16 on every linear layer, alpha twice the rank, no dropout.

Reference: Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models",
<https://arxiv.org/abs/2106.09685>.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from leadline.plan import Value

if TYPE_CHECKING:
    import torch

DEFAULT_RANK = 16
"""The rank leadline's commands give an adapter where ``--lora-rank`` does not."""
ALPHA_PER_RANK = 2
"""The adapter's alpha over its rank where ``--lora-alpha`` is not given: its update scaled by 2."""


@dataclass(frozen=True)
class Lora:
    """A LoRA adapter's shape: its rank, alpha, targeted modules (by the layers' names) and dropout.

    Examples:
        >>> from types import SimpleNamespace
        >>> cfg = SimpleNamespace(r=16, lora_alpha=32, lora_dropout=0.0,
        ...                       target_modules={"layers.1.v_proj", "layers.0.q_proj", "layers.0.v_proj"})
        >>> lora = Lora.of(SimpleNamespace(peft_config={"default": cfg}))
        >>> lora
        Lora(rank=16, alpha=32, targets=['q_proj', 'v_proj'], dropout=0.0)
        >>> [(name, v.value, v.kind) for name, v in lora.as_values().items()]  # doctest: +NORMALIZE_WHITESPACE
        [('lora_rank', 16, 'given'), ('lora_alpha', 32, 'given'), ('lora_targets', ['q_proj', 'v_proj'], 'given'),
         ('lora_dropout', 0.0, 'given')]
        >>> Lora.of(object()) is None  # every weight trains: no adapter
        True
    """

    rank: int
    alpha: float
    targets: list[str] | str
    dropout: float

    @classmethod
    def of(cls, model: torch.nn.Module) -> Lora | None:
        """The model's first LoRA adapter, or None (every weight trains, or another kind of adapter)."""
        configs = getattr(model, "peft_config", None)
        cfg = next(iter(configs.values()), None) if isinstance(configs, Mapping) else None
        if cfg is None or not hasattr(cfg, "r") or not hasattr(cfg, "lora_alpha"):
            return None
        targets = cfg.target_modules  # PEFT resolves all-linear to every module's path: named by the layer's name
        targets = (sorted({str(t).rsplit(".", 1)[-1] for t in targets}) if isinstance(targets, (set, list, tuple))
                   else str(targets))
        return cls(int(cfg.r), cfg.lora_alpha, targets, float(getattr(cfg, "lora_dropout", 0.0) or 0.0))

    def as_values(self, sources: Mapping[str, tuple[str, str]] | None = None) -> dict[str, Value]:
        """``lora_rank``, ``lora_alpha``, ``lora_targets``, ``lora_dropout``; each ``given`` (the
        adapter the model came with) unless ``sources`` names its kind and sentence."""
        given = ("given", "the model's LoRA adapter, as it was given")
        said = dict(sources or {})
        out = {}
        for name, value in (("lora_rank", self.rank), ("lora_alpha", self.alpha), ("lora_targets", self.targets),
                            ("lora_dropout", self.dropout)):
            kind, source = said.get(name, given)
            out[name] = Value(value, kind, source)
        return out


def cli_sources(rank_given: bool, alpha_given: bool) -> dict[str, tuple[str, str]]:
    """The kinds and sentences of the adapter leadline's commands make (``--lora-rank``,
    ``--lora-alpha``, else their defaults).

    Examples:
        >>> cli_sources(False, False)["lora_alpha"]
        ('derived', 'twice the rank (--lora-alpha to choose): the update scaled by alpha / rank = 2')
        >>> cli_sources(True, True)["lora_rank"][0], cli_sources(True, True)["lora_alpha"][0]
        ('given', 'given')
    """
    twice = "twice the rank (--lora-alpha to choose): the update scaled by alpha / rank = 2"
    return {
        "lora_rank": ("given", "the caller's rank (--lora-rank)") if rank_given else
        ("constant", f"leadline's default rank {DEFAULT_RANK} (--lora-rank to choose)"),
        "lora_alpha": ("given", "the caller's alpha (--lora-alpha): the update scaled by alpha / rank")
        if alpha_given else ("derived", twice),
        "lora_targets": ("constant", "every linear layer of the model (PEFT's all-linear), the output layer left out"),
        "lora_dropout": ("constant", "0: the adapter's input is not dropped"),
    }


def set_alpha(model: torch.nn.Module, alpha: float) -> None:
    """Set the LoRA adapter's alpha after it was made: each LoRA layer's scale becomes alpha / rank
    (alpha / sqrt(rank) with rsLoRA), and the adapter's config says so, so the saved adapter loads
    with the same scale. Before the first step the adapter's update is zero (``B = 0``), so this is
    the adapter PEFT would have made with this alpha.

    Examples:
        >>> from types import SimpleNamespace
        >>> cfg = SimpleNamespace(r=16, lora_alpha=32, use_rslora=False)
        >>> layer = SimpleNamespace(r={"default": 16}, lora_alpha={"default": 32}, scaling={"default": 2.0})
        >>> model = SimpleNamespace(peft_config={"default": cfg}, modules=lambda: [layer])
        >>> set_alpha(model, 8)
        >>> cfg.lora_alpha, layer.lora_alpha, layer.scaling
        (8, {'default': 8}, {'default': 0.5})
    """
    configs = getattr(model, "peft_config", None) or {}
    for name, cfg in configs.items():
        cfg.lora_alpha = alpha
        rs = bool(getattr(cfg, "use_rslora", False))
        for module in model.modules():
            scaling, ranks = getattr(module, "scaling", None), getattr(module, "r", None)
            if isinstance(scaling, dict) and isinstance(ranks, dict) and name in scaling and name in ranks:
                module.lora_alpha[name] = alpha
                scaling[name] = alpha / (math.sqrt(ranks[name]) if rs else ranks[name])
