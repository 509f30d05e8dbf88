"""Shared pieces of the model-running commands: the model options, LoRA, the progress bar."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from leadline.errors import InputError


def add_model_arguments(p: argparse.ArgumentParser, *, data: bool = True) -> None:
    p.add_argument("--model", required=True, help="a Hugging Face folder or a .gguf file")
    if data:
        p.add_argument("--data", required=True, help="training rows, jsonl (text, prompt/completion, messages, input_ids/labels, ...)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--lora-rank", type=int, default=16, metavar="R", help="train LoRA adapters of rank R on every linear layer (default 16)")
    g.add_argument("--full", action="store_true", help="train every weight (a full fine-tune)")
    p.add_argument("--device", default=None, help="cuda, cuda:1 or cpu (default: the GPU if there is one)")
    p.add_argument("--seed", type=int, default=0, help="the seed of the split, the row order and the adapter's init (default 0)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the model's dtype (default float32: a bf16 forward rounds the held-out loss the rate is read from)")


def load_for_training(args: argparse.Namespace) -> tuple[Any, Any]:
    """The model (with LoRA unless --full) and tokenizer the command trains."""
    from leadline.hf.loading import load_model, load_tokenizer

    if not args.full and args.lora_rank is not None and args.lora_rank < 1:
        raise InputError(f"--lora-rank {args.lora_rank} must be >= 1; or pass --full")
    import torch

    tok = load_tokenizer(args.model)
    model = load_model(args.model, device=args.device, dtype=getattr(torch, args.dtype))
    torch.manual_seed(args.seed)  # the adapter's init: the same command gives the same plan
    if args.full:
        for p in model.parameters():
            p.requires_grad_(True)
        return model, tok
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise InputError("LoRA needs peft; pip install 'leadline[hf]' or pass --full") from None
    cfg = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM")
    return get_peft_model(model, cfg), tok


class Progress:
    """A progress bar over derive()'s phases (tqdm on a terminal, lines otherwise)."""

    def __init__(self, phases: int = 10) -> None:
        self.bar: Any = None
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=phases, unit="phase", file=sys.stderr, dynamic_ncols=True)
        except ImportError:
            pass

    def __call__(self, ev: dict[str, Any]) -> None:
        status, phase = ev.get("status"), ev.get("phase")
        text = f"{phase}: {status}" + (f" ({ev['summary']})" if ev.get("summary") else "") + (f" — {ev['reason']}" if ev.get("reason") else "")
        if self.bar is not None:
            self.bar.set_description_str(text[:70])
            if status in ("done", "skipped", "resumed"):
                self.bar.update(1)
        else:
            print(f"[{ev.get('elapsed_s', 0):7.1f}s] {text}", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
