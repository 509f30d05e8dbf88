"""How a Hugging Face model will train: its base's dtype, a bitsandbytes 4-bit/8-bit base
(QLoRA), the dtype its forward computes in, and gradient checkpointing.

The run and derive_for() measure the model as it is — the ramp's peak, the step timings, the
noise probe and the rate phases all run through the same forward and backward the run will — so
what matters is that the model is set up as the run will use it (gradient checkpointing on when the
run turns it on) and that the plan says how it was measured (``precision`` in the plan).
The held-out loss of a bf16/fp16 forward is rounded at about 1e-3 of its size; the rate phases
read it with that resolution (:data:`BF16_RESOLUTION`, against float32's :data:`RESOLUTION`).

No bitsandbytes import; nothing changed but what :func:`checkpointing` sets and puts back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.plan import Value

if TYPE_CHECKING:
    import torch

HALF = ("bfloat16", "float16")

RESOLUTION = 1e-6
"""A fall or a rise smaller than this share of the base loss is not read as one (float32's grain
on a mean loss)."""

BF16_RESOLUTION = 1e-3
"""The same for a model whose forward runs in bfloat16/float16: it rounds the loss at about this
grain, and a walk that reads that rounding as a fall stops at a step far too small (measured:
docs/rate.md)."""


@dataclass(frozen=True)
class Precision:
    """The model as it trains.

    Attributes:
        dtype: the dtype holding most of the base's floating-point entries (``"bfloat16"``).
        quantization: ``"4-bit nf4"`` / ``"4-bit fp4"`` / ``"8-bit"`` (bitsandbytes), or None.
        compute_dtype: what the forward computes in (a 4-bit base: its ``bnb_4bit_compute_dtype``).
        checkpointing: gradient (activation) checkpointing on.
        adapter: the model trains through a PEFT adapter.

    Examples:
        >>> prec = Precision("bfloat16", "4-bit nf4", "bfloat16", checkpointing=True, adapter=True)
        >>> prec.describe()
        'a LoRA adapter over a 4-bit nf4 base (bitsandbytes, computing in bfloat16), gradient checkpointing on'
        >>> prec.half, prec.as_value().kind
        (True, 'given')
        >>> Precision("float32", None, "float32", False, False).describe()
        'every weight of a float32 base, gradient checkpointing off'
        >>> Precision("float32", "gguf", "float32", checkpointing=False, adapter=True).describe()
        'a LoRA adapter over a base read from a GGUF file and dequantized to float32 by transformers, gradient ...'
    """

    dtype: str
    quantization: str | None
    compute_dtype: str
    checkpointing: bool
    adapter: bool

    @property
    def half(self) -> bool:
        """The forward computes in bf16/fp16: the held-out loss has their resolution."""
        return self.compute_dtype in HALF

    def describe(self) -> str:
        """The model as it trains, in words, naming the quantization's real source: bitsandbytes
        for 4-bit/8-bit, the GGUF file transformers dequantized for ``gguf`` (see the class's
        examples)."""
        q = self.quantization
        if not q:
            base = f"a {self.dtype} base"
        elif q.lower() == "gguf":
            base = f"a base read from a GGUF file and dequantized to {self.dtype} by transformers" + (
                f" (computing in {self.compute_dtype})" if self.compute_dtype != self.dtype else "")
        elif q[0] in "48":
            base = f"a {q} base (bitsandbytes, computing in {self.compute_dtype})"
        else:
            base = f"a {q}-quantized base (computing in {self.compute_dtype})"
        how = "a LoRA adapter over " if self.adapter else "every weight of "
        ckpt = "gradient checkpointing on" if self.checkpointing else "gradient checkpointing off"
        return f"{how}{base}, {ckpt}"

    def as_value(self) -> Value:
        """The plan's ``precision``: kind ``given``, the fields as value and evidence, the
        resolution the rate phases read the held-out loss at in the sentence."""
        grain = ("the held-out loss read at bf16/fp16's resolution (1e-3 of its size)" if self.half
                 else "the held-out loss read at float32's resolution")
        return Value(asdict(self), "given",
                     f"the model as it trains: {self.describe()}; the ramp, the timings, the noise probe "
                     f"and the rate phases ran through that forward and backward; {grain}", evidence=asdict(self))


def _name(dtype: torch.dtype | str) -> str:
    return str(dtype).replace("torch.", "")


def _quant_config(model: torch.nn.Module) -> dict[str, Any] | None:
    cfg = getattr(getattr(model, "config", None), "quantization_config", None)
    if cfg is None:
        return None
    as_dict = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg) if isinstance(cfg, dict) else vars(cfg)
    method = as_dict.get("quant_method", "bitsandbytes")
    method = str(getattr(method, "value", method))  # transformers keeps it as a str Enum
    return as_dict if "bitsandbytes" in method else {**as_dict, "_other": method}


def precision_of(model: torch.nn.Module) -> Precision:
    """Read :class:`Precision` from a (PEFT) causal LM.

    ``dtype``: the dtype holding most frozen floating-point entries (every entry for a full
    fine-tune); the quantization and compute dtype from ``config.quantization_config``;
    checkpointing from ``is_activation_checkpointing`` (``is_gradient_checkpointing`` before
    transformers 5); ``adapter`` when the model has a ``peft_config``.

    Examples:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> precision_of(torch.nn.Linear(4, 2))
        Precision(dtype='float32', quantization=None, compute_dtype='float32', checkpointing=False, adapter=False)
        >>> precision_of(torch.nn.Linear(4, 2).to(torch.bfloat16)).half
        True
        >>> base = torch.nn.Linear(4, 2)
        >>> base.config = SimpleNamespace(quantization_config={  # as a bitsandbytes 4-bit load sets it
        ...     "quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
        ...     "bnb_4bit_compute_dtype": "bfloat16"})
        >>> prec = precision_of(base)
        >>> prec.quantization, prec.compute_dtype
        ('4-bit nf4', 'bfloat16')
    """
    counts: Counter[str] = Counter()
    for p in model.parameters():
        if p.is_floating_point() and not p.requires_grad:
            counts[_name(p.dtype)] += p.numel()
    if not counts:  # a full fine-tune: every weight trained
        counts.update(_name(p.dtype) for p in model.parameters() if p.is_floating_point())
    dtype = counts.most_common(1)[0][0] if counts else "float32"
    q = _quant_config(model)
    quantization, compute = None, dtype
    if q is not None and "_other" in q:
        quantization = str(q["_other"])
    elif q is not None and q.get("load_in_4bit"):
        quantization = f"4-bit {q.get('bnb_4bit_quant_type', 'fp4')}"
        compute = _name(q.get("bnb_4bit_compute_dtype") or "float32")
    elif q is not None and q.get("load_in_8bit"):
        quantization = "8-bit"
    ckpt = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5; is_gradient_checkpointing before
    ckpt = bool(getattr(model, "is_gradient_checkpointing", False) if ckpt is None else ckpt)
    return Precision(dtype, quantization, compute, ckpt, hasattr(model, "peft_config"))


def check_trainable(model: torch.nn.Module) -> Precision:
    """The precision, or one sentence when a quantized base is trained without an adapter or
    its quantization cannot train on this machine (bitsandbytes: a CUDA GPU).

    Examples:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> check_trainable(torch.nn.Linear(4, 2)).adapter
        False
        >>> base = torch.nn.Linear(4, 2)
        >>> base.config = SimpleNamespace(quantization_config={"quant_method": "bitsandbytes", "load_in_8bit": True})
        >>> try:
        ...     check_trainable(base)
        ... except InputError as e:
        ...     print(e)
        the model's base is quantized (8-bit) and has no adapter: a quantized base trains only through one; ...
        >>> base.peft_config = {"default": None}  # an adapter, but the base sits on the CPU
        >>> try:
        ...     check_trainable(base)
        ... except InputError as e:
        ...     print(e)
        the model's base is quantized (8-bit, bitsandbytes) but sits on cpu; bitsandbytes trains a quantized base ...
    """
    prec = precision_of(model)
    if prec.quantization == "gguf" and not prec.adapter:
        raise InputError("the model was read from a GGUF file, and transformers marks it quantized though its weights "
                         "are float: load it with leadline.hf.load_model(path), which drops the mark, to train every "
                         "weight, or wrap it with peft.get_peft_model(model, LoraConfig(...)) for LoRA")
    if prec.quantization and not prec.adapter:
        raise InputError(f"the model's base is quantized ({prec.quantization}) and has no adapter: a quantized base "
                         "trains only through one; wrap it with peft.get_peft_model(model, LoraConfig(...)) or pass "
                         "peft_config= to SFTTrainer")
    if prec.quantization and prec.quantization[0] in "48":
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise InputError(f"the model's base is quantized ({prec.quantization}, bitsandbytes) but sits on {device}; "
                             "bitsandbytes trains a quantized base on a CUDA GPU: load it there (device_map='cuda') or "
                             "load it unquantized")
    return prec


@contextmanager
def checkpointing(model: torch.nn.Module, on: bool, kwargs: dict[str, Any] | None = None) -> Iterator[None]:
    """Gradient checkpointing set to ``on`` inside the block as Trainer sets it for the run
    (``activation_checkpointing_enable`` with the trainer's kwargs), put back on every exit.
    Nothing is touched when it is already as asked; a model that cannot turn it on is refused.

    Examples:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32,
        ...                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
        >>> with checkpointing(model, True, {"use_reentrant": False}):
        ...     print(precision_of(model).checkpointing)
        True
        >>> precision_of(model).checkpointing
        False
        >>> try:
        ...     with checkpointing(torch.nn.Linear(4, 2), True):
        ...         pass
        ... except InputError as e:
        ...     print(e)
        Linear does not support gradient checkpointing; turn it off (gradient_checkpointing=False, or leave out ...
    """
    was = precision_of(model).checkpointing
    if on == was:
        yield
        return
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    enable = (getattr(inner, "activation_checkpointing_enable", None)
              or getattr(inner, "gradient_checkpointing_enable", None))
    disable = (getattr(inner, "activation_checkpointing_disable", None)
               or getattr(inner, "gradient_checkpointing_disable", None))
    if on and (enable is None or not getattr(inner, "supports_gradient_checkpointing", True)):
        raise InputError(f"{type(inner).__name__} does not support gradient checkpointing; turn it off "
                         "(gradient_checkpointing=False, or leave out --gradient-checkpointing)")
    try:
        if on:
            enable(**({"activation_checkpointing_kwargs": kwargs} if kwargs and "activation" in enable.__name__ else
                      {"gradient_checkpointing_kwargs": kwargs} if kwargs else {}))
        else:
            disable()
        yield
    finally:
        if was:
            enable()
        elif disable is not None:
            disable()


