"""A causal LM's training step on synthetic token ids, for ``leadline fit`` and the benchmarks.

The memory of a step depends on its shape, not on which tokens fill it, so the pre-flight
fills ``rows`` x ``length`` with token ids drawn from a fixed generator and scores every
token (labels = the ids), the most a causal-LM step of that shape can hold. A LoRA step puts
adapters of rank r on every linear layer (PEFT's ``all-linear``), trained; a full fine-tune
trains every weight.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

from leadline.errors import InputError
from leadline.memory.step import TrainingStep

if TYPE_CHECKING:
    import torch
    from peft import PeftModel


def synthetic_loss_of(model: torch.nn.Module, seed: int = 0) -> Callable[[int, int], torch.Tensor]:
    """``loss_of(rows, length)``: the model's causal-LM loss on ``rows`` x ``length`` token ids
    drawn from a generator seeded with ``seed`` (the same ids at every call of a shape).

    Examples:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> class MeanId(torch.nn.Module):  # the causal-LM call; its "loss" is the mean token id
        ...     config = SimpleNamespace(vocab_size=50)
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w = torch.nn.Parameter(torch.zeros(1))
        ...     def forward(self, input_ids, labels, use_cache):
        ...         return SimpleNamespace(loss=input_ids.float().mean() + self.w[0])
        >>> loss_of = synthetic_loss_of(MeanId(), seed=0)
        >>> bool(loss_of(2, 8) == loss_of(2, 8)), bool(loss_of(2, 8) == loss_of(2, 9))
        (True, False)
        >>> synthetic_loss_of(torch.nn.Linear(4, 2))
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: the model's config has no vocab_size; pass a causal LM from transformers
    """
    import torch

    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0)
    if vocab < 2:
        raise InputError("the model's config has no vocab_size; pass a causal LM from transformers")
    device = next(model.parameters()).device

    def loss_of(rows: int, length: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab, (rows, length), generator=g).to(device)
        return model(input_ids=ids, labels=ids, use_cache=False).loss

    return loss_of


class ModelStep(TrainingStep):
    """A :class:`TrainingStep` over a causal LM's trained parameters on synthetic ids, with
    AdamW (the usual optimizer; its two states per parameter are in the peak). ``close()``
    removes LoRA adapters this step added (used by :func:`~leadline.memory.rank.rank_to_fit`).

    Examples:
        >>> import torch
        >>> frozen = torch.nn.Linear(4, 2).requires_grad_(False)
        >>> ModelStep(frozen)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: the model has no trained parameters (requires_grad); pass --full or a LoRA rank
    """

    def __init__(self, model: torch.nn.Module, *, lr: float = 1e-4, seed: int = 0,
                 on_close: Callable[[], torch.nn.Module] | None = None) -> None:
        import torch

        trained = [p for p in model.parameters() if p.requires_grad]
        if not trained:
            raise InputError("the model has no trained parameters (requires_grad); pass --full or a LoRA rank")
        model.train()
        super().__init__(synthetic_loss_of(model, seed), torch.optim.AdamW(trained, lr=lr))
        self.model = model
        self._on_close = on_close

    def close(self) -> torch.nn.Module:
        out = self._on_close() if self._on_close is not None else self.model
        self._on_close = None
        return out


def add_lora(model: torch.nn.Module, rank: int) -> PeftModel:
    """The model with LoRA adapters of rank ``rank`` on every linear layer (PEFT ``all-linear``,
    ``lora_alpha`` = 2 x rank, no dropout), the base frozen. ``remove_lora`` gives the base
    model back.

    Examples:
        >>> add_lora(None, 0)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: the LoRA rank must be >= 1, got 0
    """
    if rank < 1:
        raise InputError(f"the LoRA rank must be >= 1, got {rank}")
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise InputError("a LoRA step needs peft; pip install 'leadline[hf]'") from None
    for p in model.parameters():
        p.requires_grad_(False)
    cfg = LoraConfig(r=int(rank), lora_alpha=2 * int(rank), lora_dropout=0.0, target_modules="all-linear",
                     task_type="CAUSAL_LM")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers 5 renames gradient checkpointing
        return get_peft_model(model, cfg)


def remove_lora(peft_model: PeftModel) -> torch.nn.Module:
    """The base model with the adapters removed (not merged)."""
    return peft_model.unload()


def adapter_dtype_gap(model: torch.nn.Module) -> tuple[torch.dtype, torch.dtype] | None:
    """(the adapters' dtype, the base weights' dtype) when the trained LoRA tensors are float32
    on a 16-bit model, else None.

    PEFT keeps adapters in float32 on a bfloat16/float16 model by default
    (``autocast_adapter_dtype=True``); each adapted layer then casts its input to float32 and
    keeps that copy for the backward, so a LoRA step can hold more activation memory per row
    than a full fine-tune of the same model (``benchmarks/lora_adapter_dtype_cpu.py``).

    Examples:
        >>> import torch
        >>> model = torch.nn.Module()  # a bfloat16 base layer and a float32 adapter beside it
        >>> model.base = torch.nn.Linear(4, 4).to(torch.bfloat16)
        >>> model.lora_A = torch.nn.Linear(4, 2)
        >>> adapter_dtype_gap(model), adapter_dtype_gap(torch.nn.Linear(4, 2))
        ((torch.float32, torch.bfloat16), None)
    """
    import torch

    lora = [p for n, p in model.named_parameters() if "lora_" in n and p.requires_grad]
    base = [p for n, p in model.named_parameters() if "lora_" not in n and p.is_floating_point()]
    if not lora or not base:
        return None
    low = {torch.bfloat16, torch.float16}
    adapter, weights = lora[0].dtype, base[0].dtype
    return (adapter, weights) if adapter == torch.float32 and weights in low else None


def cast_adapters(model: torch.nn.Module, dtype: torch.dtype) -> Callable[[], None]:
    """Cast the LoRA tensors to ``dtype`` in place (the same Parameter objects, so an optimizer
    over them still holds them); returns the function that casts them back, values included, and
    sets their gradients to None.

    Examples:
        >>> import torch
        >>> model = torch.nn.Module()  # a bfloat16 base layer and a float32 adapter beside it
        >>> model.base = torch.nn.Linear(4, 4).to(torch.bfloat16)
        >>> model.lora_A = torch.nn.Linear(4, 2)
        >>> weight = model.lora_A.weight
        >>> restore = cast_adapters(model, torch.bfloat16)
        >>> model.lora_A.weight is weight, weight.dtype
        (True, torch.bfloat16)
        >>> restore()
        >>> weight.dtype, adapter_dtype_gap(model)
        (torch.float32, (torch.float32, torch.bfloat16))
    """
    import torch

    saved = [(p, p.data) for n, p in model.named_parameters() if "lora_" in n]
    with torch.no_grad():
        for p, data in saved:
            p.data = data.to(dtype)

    def restore() -> None:
        for p, data in saved:
            p.data = data
            p.grad = None

    return restore


def full_finetune(model: torch.nn.Module) -> torch.nn.Module:
    """Every weight trained (``requires_grad`` on every parameter); the same model back.

    Examples:
        >>> import torch
        >>> model = full_finetune(torch.nn.Linear(4, 2).requires_grad_(False))
        >>> [p.requires_grad for p in model.parameters()]
        [True, True]
    """
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def lora_step_factory(base: torch.nn.Module, **step_kw: float) -> Callable[[int], ModelStep]:
    """``step_at_rank(r)`` for :func:`~leadline.memory.rank.rank_to_fit`: adapters of rank r on
    ``base`` and a fresh optimizer; the step's ``close()`` removes the adapters."""

    def step_at_rank(rank: int) -> ModelStep:
        peft_model = add_lora(base, rank)
        return ModelStep(peft_model, on_close=lambda: remove_lora(peft_model), **step_kw)

    return step_at_rank
