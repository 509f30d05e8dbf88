"""Shared pieces of the model-running commands: the model options, LoRA, the progress bar."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from leadline.errors import InputError

PLAN_INTS = ("micro_batch", "grad_accum", "total_steps", "seq_len", "warmup_steps", "rows_fit")
PLAN_RATES = ("lr", "alpha1")
RAM_SHARE = 0.9  # of the RAM available when the command starts, the most its allocations may add


def add_model_arguments(p: argparse.ArgumentParser, *, data: bool = True) -> None:
    p.add_argument("--model", required=True, help="a Hugging Face folder or a .gguf file")
    if data:
        p.add_argument("--data", required=True,
                       help="training rows, jsonl (text, prompt/completion, messages, input_ids/labels, ...)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--lora-rank", type=int, default=16, metavar="R",
                   help="train LoRA adapters of rank R on every linear layer (default 16)")
    g.add_argument("--full", action="store_true", help="train every weight (a full fine-tune)")
    p.add_argument("--device", default=None, help="cuda, cuda:1 or cpu (default: the GPU if there is one)")
    p.add_argument("--seed", type=int, default=0,
                   help="the seed of the split, the row order and the adapter's init (default 0)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the model's dtype (default float32: a bf16 forward rounds the held-out loss the rate is read "
                        "from)")
    q = p.add_mutually_exclusive_group()
    q.add_argument("--load-in-4bit", action="store_true",
                   help="QLoRA: the base in 4-bit nf4 through bitsandbytes, computing in --dtype (CUDA; with LoRA)")
    q.add_argument("--load-in-8bit", action="store_true",
                   help="the base in 8-bit through bitsandbytes (CUDA; with LoRA)")
    p.add_argument("--gradient-checkpointing", action="store_true",
                   help="recompute activations in the backward: measure and train with it on")


@contextlib.contextmanager
def ram_bound(device: str | None, share: float | None = None) -> Iterator[int | None]:
    """On the CPU, bound what the process may allocate by the machine's RAM: its data
    (``RLIMIT_DATA``: heap and private mappings) at what it holds now plus ``share`` of the RAM
    available, so an allocation past the RAM raises where it is made (an out-of-memory rung the
    ramp measures, or one sentence from the CLI) instead of the kernel's OOM killer ending the
    process, or another one. The previous limit is put back on exit. Yields the bound in bytes,
    or None where it does not apply (a CUDA device, no ``resource`` module, no /proc).
    ``share`` defaults to :data:`RAM_SHARE`."""
    share = RAM_SHARE if share is None else share
    on_cpu = device is not None and str(device).startswith("cpu")
    if not on_cpu and device is None:
        import torch

        on_cpu = not torch.cuda.is_available()
    limit = _data_limit(share) if on_cpu else None
    if limit is None:
        yield None
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    bound = limit if soft == resource.RLIM_INFINITY else min(limit, soft)
    bound = bound if hard == resource.RLIM_INFINITY else min(bound, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (bound, hard))
    try:
        yield bound
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def _data_limit(share: float) -> int | None:
    """The process's data now (VmData) plus ``share`` of the RAM available, or None off Linux."""
    try:
        import resource  # noqa: F401

        from leadline.memory.readings import host_memory_bytes

        with open("/proc/self/status", encoding="ascii") as f:
            data = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmData:"))
        available, _ = host_memory_bytes()
    except (ImportError, OSError, StopIteration, ValueError):
        return None
    return data + int(share * available)


def check_data_file(flag: str, path: str | os.PathLike[str], fix: str = "pass a jsonl file of training rows") -> None:
    """A data file must be a readable file: a missing path and a folder each get their sentence."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{flag} {p} is a folder, not a file; {fix}")
    if not p.exists():
        raise InputError(f"{flag} {p} does not exist; {fix}")
    if not p.is_file():
        raise InputError(f"{flag} {p} is not a regular file; {fix}")
    if not os.access(p, os.R_OK):
        raise InputError(f"{flag} {p} cannot be read (permission denied); make it readable or {fix}")


def check_out_file(flag: str, path: str | os.PathLike[str] | None) -> None:
    """An output file's folder must exist and be writable, and the path must not be a folder;
    checked before any work, so a refusal costs nothing and leaves nothing behind."""
    if path is None:
        return
    given = Path(path)
    p = Path(os.path.realpath(given)) if given.is_symlink() else given
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise InputError(f"{flag} {given} is a folder; pass a file path, e.g. {flag} {given / 'plan.json'}")
    if not folder.is_dir():
        raise InputError(f"{flag} {given}: the folder {folder} does not exist; create it or choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {given}: the folder {folder} is not writable; choose another path")


def check_out_folder(flag: str, path: str | os.PathLike[str]) -> None:
    """An output folder must be new or empty, and its parent must exist."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise InputError(f"{flag} {p} is a file, not a folder; choose a new folder to save the run in")
    if p.is_dir() and any(p.iterdir()):
        raise InputError(f"{flag} {p} exists and is not empty; choose a new folder")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{flag} {p}: the folder {parent} does not exist; create it or choose another path")
    if not p.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {p}: the folder {parent} is not writable; choose another path")


def check_device(device: str | None) -> None:
    """``--device``: a name torch knows, and a CUDA card only where this torch has one."""
    if device is None:
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise InputError(f"--device {device} is not a device torch knows; pass cpu, cuda or cuda:N") from None
    if dev.type != "cuda":
        return
    if not torch.cuda.is_available():
        why = (f"this torch ({torch.__version__}) is built without CUDA" if torch.version.cuda is None
               else "no CUDA card is visible to this process")
        raise InputError(f"--device {device}: {why}; pass --device cpu, or install a CUDA build of torch on a machine "
                         "with a card")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise InputError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA card(s), "
                         f"numbered from 0; pass --device cuda:0")


def check_positive(flag: str, value: float | None, *, whole: bool = False, upper: float | None = None,
                   example: str = "") -> None:
    """A number that must be finite and above zero (and at most ``upper`` where one is given)."""
    if value is None:
        return
    if not math.isfinite(value) or value <= 0 or (upper is not None and value > upper):
        bound = f" and at most {upper:g}" if upper is not None else ""
        kind = "a whole number" if whole else "a number"
        raise InputError(f"{flag} {value:g} must be {kind} above 0{bound}; pass e.g. {flag} {example or 1}")


def read_plan(flag: str, path: str) -> Any:
    """The plan at ``path``, refused in one sentence when a newer leadline wrote it or a value
    the run reads has the wrong type (a hand-edited plan)."""
    from leadline._version import __version__
    from leadline.plan import Plan

    if Path(path).is_dir():
        raise InputError(f"{flag} {path} is a folder; pass the plan file `leadline derive --out` wrote")
    plan = Plan.from_json(path)
    written = str(getattr(plan, "version", "") or "")
    if _major(written) is not None and _major(__version__) is not None and _major(written) > _major(__version__):
        raise InputError(f"{flag} {path} was written by leadline {written}, newer than this leadline {__version__}; "
                         f"upgrade leadline (pip install -U leadline) or derive the plan again with this one")
    for name in PLAN_INTS:
        v = plan.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v,
                                                                    int) or v < (0 if name == "warmup_steps" else 1)):
            low = "0 or more" if name == "warmup_steps" else "1 or more"
            raise InputError(f"{flag} {path}: its {name} is {v!r}, not a whole number {low}; derive the plan again "
                             f"rather than editing it, or correct {name} in the file")
    for name in PLAN_RATES:
        v = plan.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0):
            raise InputError(f"{flag} {path}: its {name} is {v!r}, not a rate above 0; derive the plan again "
                             f"rather than editing it, or correct {name} in the file")
    return plan


def _major(version: str) -> int | None:
    head = version.split(".")[0].strip().lstrip("v")
    return int(head) if head.isdigit() else None


def check_lora_rank(model: Any, rank: int) -> None:
    """A LoRA rank above the model's width trains nothing a smaller one would not: refused."""
    cfg = getattr(model, "config", None)
    width = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", None) or getattr(cfg, "d_model", None)
    if isinstance(width, int) and rank > width:
        raise InputError(f"--lora-rank {rank} is larger than the model's width ({width}); a rank above it adds "
                         f"nothing, pass --lora-rank {min(width, 16)} or less, or --full")


def load_for_training(args: argparse.Namespace) -> tuple[Any, Any]:
    """The model (with LoRA unless --full) and tokenizer the command trains."""
    from leadline.hf.loading import load_model, load_tokenizer

    if not args.full and args.lora_rank is not None and args.lora_rank < 1:
        raise InputError(f"--lora-rank {args.lora_rank} must be >= 1; or pass --full")
    import torch

    check_device(args.device)
    bits = 4 if getattr(args, "load_in_4bit", False) else 8 if getattr(args, "load_in_8bit", False) else None
    if bits is not None and args.full:
        raise InputError(f"--load-in-{bits}bit trains through a LoRA adapter, not --full; drop --full (and pass "
                         "--lora-rank R) or load the base unquantized")
    tok = load_tokenizer(args.model)
    model = load_model(args.model, device=args.device, dtype=getattr(torch, args.dtype), bits=bits)
    if not args.full:
        check_lora_rank(model, args.lora_rank)
    if getattr(args, "gradient_checkpointing", False):
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise InputError(f"--gradient-checkpointing: {type(model).__name__} does not support gradient "
                             "checkpointing; leave the flag out")
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    torch.manual_seed(args.seed)  # the adapter's init: the same command gives the same plan
    if args.full:
        for p in model.parameters():
            p.requires_grad_(True)
        return model, tok
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise InputError("LoRA needs peft; pip install 'leadline[hf]' or pass --full") from None
    cfg = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, target_modules="all-linear", lora_dropout=0.0,
                     task_type="CAUSAL_LM")
    import warnings

    with warnings.catch_warnings():  # PEFT reads a property transformers 5 renamed: its warning is not the user's
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return get_peft_model(model, cfg), tok


def Progress() -> Any:
    """The bar over derive()'s phases on stderr: :class:`leadline.progress.PhaseBar`."""
    from leadline.progress import PhaseBar

    return PhaseBar()
