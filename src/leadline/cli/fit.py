"""``leadline fit``: measure whether a training shape fits the card (the real peak, not a prediction).

Loads the model, puts LoRA adapters of the given rank on every linear layer (or trains every
weight with ``--full``), runs real training steps of ``--micro-batch`` rows x ``--seq-len`` tokens
under the spill cap and prints the verdict in one sentence: the measured peak, the room and,
when it does not fit, what would (the most rows at that length, the longest length at that
batch, gradient checkpointing, a lower LoRA rank, and the adapters in the model's dtype where
PEFT keeps them in float32 on a 16-bit model), each measured. Exit 0 when it fits, 1 when
it is refused, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import warnings
from typing import TYPE_CHECKING, Any

from leadline.cli._common import BUNDLED_HELP, MODEL_HELP, Spelled, add_old_spelling, add_revision_argument

if TYPE_CHECKING:
    import torch

    from leadline.memory import FitResult
    from leadline.memory.model_step import ModelStep

DEFAULT_RANK = 16


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help=f"{MODEL_HELP} (default: {BUNDLED_HELP})")
    add_revision_argument(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--lora-rank", type=int, metavar="R",
                   help=f"LoRA adapters of rank R on every linear layer (default {DEFAULT_RANK})")
    g.add_argument("--full", action="store_true", help="a full fine-tune: every weight trained")
    p.add_argument("--seq-len", type=int, required=True, metavar="N", help="tokens per row (required)")
    batch = p.add_mutually_exclusive_group(required=True)  # required, under either spelling
    batch.add_argument("--micro-batch", type=int, metavar="M", action=Spelled,
                       help="rows a forward pass (required): the micro-batch whose step is measured")
    add_old_spelling(batch, "--batch", "micro_batch")
    p.add_argument("--data", metavar="FILE",
                   help="the training jsonl: on a GPU the step is also run through its length mix "
                   "(longest first, the full length after each), as derive's ramp confirms a batch (default: none, "
                   "every row at --seq-len)")
    p.add_argument("--device", help="cuda, cuda:N or cpu (default: the GPU if there is one)")
    p.add_argument("--card-gb", type=float, metavar="GB",
                   help="treat the card (on the CPU: the RAM) as this many GB (default: its real size)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="measure with gradient checkpointing on")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"),
                   help="the dtype the model's weights load in (default: bfloat16 on a GPU that has it, else float32)")
    q = p.add_mutually_exclusive_group()
    q.add_argument("--load-in-4bit", action="store_true",
                   help="the base quantized to 4 bits (nf4) by bitsandbytes as it loads, trained through LoRA "
                        "(QLoRA; CUDA)")
    q.add_argument("--load-in-8bit", action="store_true",
                   help="the base quantized to 8 bits by bitsandbytes as it loads, trained through LoRA (CUDA)")
    p.add_argument("--no-suggest", action="store_true", help="on a refusal, do not measure what would fit")
    p.add_argument("--json", action="store_true", help="print the measurement as JSON")


def _positive(name: str, value: Any) -> None:
    from leadline.errors import InputError

    if value is not None and value <= 0:
        raise InputError(f"{name} must be a positive number, got {value}; pass e.g. {name} 8")


def run(args: argparse.Namespace) -> int:
    from leadline.cli._common import check_data_file, located_model
    from leadline.hf.loading import check_lora_rank, load_model
    from leadline.memory.model_step import add_lora, full_finetune

    bits, rank = _checked_flags(args)
    if args.data:  # a bad file fails before the model is located (a GGUF converted) and loads
        check_data_file("--data", args.data, "pass the training jsonl whose length mix the step runs through")
    source = located_model(args, bits)  # the bundled model where --model is not given
    lengths = _lengths(args.data, source, args.seq_len) if args.data else None
    model = load_model(source, device=args.device, dtype=_dtype(args.dtype), bits=bits)
    _check_positions(model, args.seq_len)
    if rank is not None:
        check_lora_rank(model, rank)
    card_bytes = int(args.card_gb * 1e9) if args.card_gb else None
    trained_as = "full fine-tune" if rank is None else f"LoRA rank {rank}{'' if args.lora_rank else ' (the default)'}"
    model = full_finetune(model) if rank is None else add_lora(model, rank)
    if args.gradient_checkpointing:
        _checkpointing(model, True)
    _check_absurd(model, args, card_bytes)
    result = _fit_and_alternatives(args, model, rank, card_bytes, lengths)
    if args.json:
        out = result.as_dict()
        out["model"] = args.model
        out["trained_as"] = trained_as
        print(json.dumps(out, indent=1))
    else:
        shape = f"{args.micro_batch} rows x {args.seq_len} tokens"
        print(f"leadline fit: {args.model}, {trained_as}, {shape} on {result.device}")
        print(result.sentence)
    return 0 if result.fits else 1


def _checked_flags(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """The shape's flags checked before anything loads: the quantization's bits and the LoRA rank
    (None: ``--full``)."""
    from leadline.cli._common import check_device, flag_of
    from leadline.errors import InputError

    if args.micro_batch is None:
        raise InputError("--micro-batch is required: the rows a forward pass whose step is measured; pass e.g. "
                         "--micro-batch 8")
    args.batch_flag = flag_of(args, "micro_batch", "--micro-batch")
    for name in ("--seq-len", args.batch_flag, "--lora-rank", "--card-gb"):
        _positive(name, getattr(args, "micro_batch" if name == args.batch_flag else name[2:].replace("-", "_")))
    if args.seq_len < 2:
        raise InputError(f"--seq-len {args.seq_len} must be at least 2 tokens (one token leaves nothing to score after "
                         "the shift); pass the length you train at, e.g. --seq-len 512")
    check_device(args.device)
    bits = 4 if args.load_in_4bit else 8 if args.load_in_8bit else None
    if bits is not None and args.full:
        raise InputError(f"--load-in-{bits}bit trains through a LoRA adapter, not --full; drop --full or the "
                         "quantization")
    return bits, None if args.full else (args.lora_rank or DEFAULT_RANK)


def _fit_and_alternatives(args: argparse.Namespace, model: torch.nn.Module, rank: int | None,
                          card_bytes: int | None, lengths: list[int] | None) -> FitResult:
    """The step measured at the flags' shape and, where it does not fit, what would: gradient
    checkpointing, fewer adapted modules, a lower LoRA rank (each measured)."""
    from leadline.memory import estimate_step_bytes, measure_fit
    from leadline.memory.model_step import ModelStep

    step = ModelStep(model)
    result = measure_fit(step, args.micro_batch, args.seq_len, card_bytes=card_bytes, lengths=lengths,
                         estimate=lambda r, n: estimate_step_bytes(model, r, n), suggest=not args.no_suggest)
    if not result.fits and not args.no_suggest:
        if not args.gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
            _checkpointing_alternative(result, step, model, args, card_bytes)
        if rank is not None:
            _adapters_alternative(result, step, model, args, card_bytes)
        if rank is not None and rank > 1:
            del step  # the adapted model's step let go before the base is taken back for the ranks' steps
            _rank_alternative(result, model, args, rank, card_bytes)
    return result


def _checkpointing_alternative(result: FitResult, step: ModelStep, model: torch.nn.Module, args: argparse.Namespace,
                               card_bytes: int | None) -> None:
    from leadline.memory import estimate_step_bytes, measure_fit

    _checkpointing(model, True)
    try:
        ckpt = measure_fit(step, args.micro_batch, args.seq_len, card_bytes=card_bytes, suggest=False,
                           estimate=lambda r, n: estimate_step_bytes(model, r, n))
    finally:
        _checkpointing(model, False)
    peak = f"measured {_gb(ckpt.peak_bytes)}" if ckpt.peak_bytes else ckpt.verdict
    result.add_alternative("checkpointing", f"gradient checkpointing ({peak})", ckpt.fits,
                           verdict=ckpt.verdict, peak_bytes=ckpt.peak_bytes)
    result.rungs.extend(ckpt.rungs)


def _rank_alternative(result: FitResult, model: torch.nn.Module, args: argparse.Namespace, rank: int,
                      card_bytes: int | None) -> None:
    """The largest lower LoRA rank whose step fits, on the base with the adapter taken off."""
    from leadline.memory import rank_to_fit
    from leadline.memory.model_step import lora_step_factory, remove_lora

    base = remove_lora(model)
    lower = [r for r in (1, 2, 4, 8, 16, 32, 64, 128, 256) if r < rank]
    found = rank_to_fit(lora_step_factory(base), args.micro_batch, args.seq_len, ranks=lower, card_bytes=card_bytes)
    if found.rank is not None:
        result.add_alternative("rank", f"LoRA rank {found.rank}", True, rank=found.rank, tried=found.tried)
    else:
        result.add_alternative("rank", f"not even LoRA rank {lower[0]}", False, tried=found.tried)


ABSURD = 4.0  # a shape estimated over this many times the room is bad input, not a measurement


def _check_absurd(model: Any, args: argparse.Namespace, card_bytes: int | None) -> None:
    """A shape the estimate puts more than ABSURD x over the room is refused before any step
    runs, with the most rows the estimate puts within the room (the search for what would fit
    would otherwise walk real steps of up to that many rows)."""
    from leadline.errors import InputError
    from leadline.memory import estimate_step_bytes
    from leadline.memory_readings import format_bytes, memory_for

    est = estimate_step_bytes(model, args.micro_batch, args.seq_len)
    room = memory_for(next(model.parameters()).device, card_bytes=card_bytes).room()
    if est is None or not room or est <= ABSURD * room:
        return
    lo, hi = 0, args.micro_batch
    while lo < hi:  # the most rows the estimate puts within the room, by bisection
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if (estimate_step_bytes(model, mid, args.seq_len) or 0) <= room else (lo, mid - 1)
    flag = getattr(args, "batch_flag", "--micro-batch")
    fix = f"pass {flag} {lo} or fewer" if lo else "not even one row fits by the estimate: pass a shorter --seq-len"
    raise InputError(f"{flag} {args.micro_batch} x --seq-len {args.seq_len} would need about {format_bytes(est)} by "
                     f"the estimate, {est / room:.0f}x the room of {format_bytes(room)}; {fix} (the estimate's most), "
                     "and run fit on that")


def _check_positions(model: Any, seq_len: int) -> None:
    """A length beyond the model's positions is not a shape it can train at."""
    from leadline.errors import InputError

    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(positions, int) and seq_len > positions:
        raise InputError(f"--seq-len {seq_len} is longer than the model's positions (max_position_embeddings "
                         f"{positions}); pass --seq-len {positions} or less")


def _dtype(name: str | None) -> Any:
    if name is None:
        return None
    import torch

    return getattr(torch, name)


def _adapters_alternative(result: FitResult, step: ModelStep, model: torch.nn.Module, args: argparse.Namespace,
                          card_bytes: int | None) -> None:
    """Where PEFT keeps the adapters in float32 on a 16-bit model, measure the step with them in
    the model's dtype and add it to what would fit."""
    from leadline.memory import estimate_step_bytes, measure_fit
    from leadline.memory.model_step import adapter_dtype_gap, cast_adapters

    gap = adapter_dtype_gap(model)
    if gap is None:
        return
    name = str(gap[1]).replace("torch.", "")
    restore = cast_adapters(model, gap[1])
    try:
        m = measure_fit(step, args.micro_batch, args.seq_len, card_bytes=card_bytes, suggest=False,
                        estimate=lambda r, n: estimate_step_bytes(model, r, n))
    finally:
        restore()
    peak = f"measured {_gb(m.peak_bytes)}" if m.peak_bytes else m.verdict
    result.add_alternative("adapter_dtype", f"the LoRA adapters in {name}, not float32 "
                           f"(get_peft_model(..., autocast_adapter_dtype=False); {peak})", m.fits,
                           verdict=m.verdict, peak_bytes=m.peak_bytes, adapter_dtype=name)
    result.rungs.extend(m.rungs)


def _lengths(data: str, model_path: Any, seq_len: int) -> list[int]:
    """The rows' lengths in tokens as the loader reads them, cut at the configured length."""
    from leadline.corpus import tokenize_rows
    from leadline.hf.loading import load_tokenizer

    tok = load_tokenizer(model_path)
    return [min(seq_len, len(r.input_ids)) for r in tokenize_rows(data, tok)]


def _gb(n: int | None) -> str:
    from leadline.memory_readings import format_bytes

    return format_bytes(n)


def _checkpointing(model: Any, on: bool) -> None:
    """Gradient checkpointing on or off (transformers 5 calls it activation checkpointing)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if on:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_disable()
