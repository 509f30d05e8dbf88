"""Round-trip error of int8 and int4 per weight family, group-wise.

For each 2-D weight, groups of ``group`` consecutive values along the input (last) dimension
are quantized and dequantized with round-to-nearest:

- symmetric: ``s = max|x| / (2^(b-1) - 1)``, ``q = clamp(round(x / s), -qmax, qmax)``, ``x' = q s``;
- asymmetric: ``s = (max x - min x) / (2^b - 1)``, ``q = clamp(round((x - min) / s), 0, 2^b - 1)``,
  ``x' = q s + min`` (scale and minimum per group, as GGUF's Q4_1/Q8_1 store them).

Scales are kept in float32. The error of a family is the relative Frobenius error pooled over
its tensors: ``sqrt(sum ||W - W'||^2 / sum ||W||^2)``. A family's share of a layer is its
element count over all 2-D weights of the layers (bytes at any one width are proportional).

Sources: safetensors files (or a folder of them), a GGUF file (quantized tensors dequantized
with ``gguf.quants.dequantize`` — then the error is measured against those dequantized
weights, not the original ones), a loaded model or a ``{name: tensor}`` dict.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from leadline.errors import InputError
from leadline.plan import Value

SCHEMES: dict[str, tuple[int, bool]] = {"int8_sym": (8, True), "int8_asym": (8, False), "int4_sym": (4, True),
                                        "int4_asym": (4, False)}
"""scheme name -> (bits, symmetric)."""

UNIFORM_SPREAD = 1.5  # per-layer families within 1.5x of each other: "uniform"
MAX_ELEMENTS = 1 << 25  # per tensor; larger ones are measured on evenly spaced whole rows
_FULL_PRECISION = {"F32", "F16", "BF16", "F64", "float32", "float16", "bfloat16", "float64"}

_FAMILY_NAMES: dict[str, frozenset[str]] = {
    "q": frozenset({"q_proj", "attn_q", "wq"}),
    "k": frozenset({"k_proj", "attn_k", "wk"}),
    "v": frozenset({"v_proj", "attn_v", "wv"}),
    "o": frozenset({"o_proj", "attn_output", "wo", "out_proj"}),
    "qkv": frozenset({"qkv_proj", "attn_qkv", "query_key_value", "c_attn", "Wqkv"}),
    "gate": frozenset({"gate_proj", "ffn_gate", "w1"}),
    "up": frozenset({"up_proj", "ffn_up", "w3"}),
    "down": frozenset({"down_proj", "ffn_down", "w2"}),
    "gate_up": frozenset({"gate_up_proj"}),
    "embeddings": frozenset({"embed_tokens", "token_embd", "wte", "word_embeddings", "tok_embeddings"}),
    "lm_head": frozenset({"lm_head", "output"}),
}
FAMILY_ORDER = ("q", "k", "v", "o", "qkv", "gate", "up", "down", "gate_up", "other", "embeddings", "lm_head")
_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|blk|h|blocks|block)\.(\d+)\.")


def layer_of(name: str) -> int | None:
    """The layer index in a weight's name (``model.layers.3.``, ``blk.3.``, ``h.3.``), or None.

    Examples:
        >>> layer_of("model.layers.3.mlp.up_proj.weight"), layer_of("blk.3.attn_q.weight"), layer_of("lm_head.weight")
        (3, 3, None)
    """
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def family_of(name: str) -> str:
    """The family of a 2-D weight: q/k/v/o/gate/up/down (or fused qkv/gate_up), embeddings,
    lm_head, or ``other``. Hugging Face, GGUF and Meta names are recognised; a name inside a
    layer is never lm_head (GGUF's ``output`` names the head only outside the layers).

    Examples:
        >>> [family_of(n) for n in ("model.layers.3.mlp.up_proj.weight", "blk.3.ffn_gate.weight",
        ...                         "layers.0.attention.wq.weight", "token_embd.weight", "output.weight")]
        ['up', 'gate', 'q', 'embeddings', 'lm_head']
        >>> family_of("model.layers.0.input_layernorm.weight")
        'other'
    """
    parts = name.split(".")
    in_layer = layer_of(name) is not None
    for fam, names in _FAMILY_NAMES.items():
        if fam == "lm_head" and in_layer:
            continue
        if any(p in names for p in parts):
            return fam
    return "other"


def roundtrip(w: Any, bits: int, group: int = 64, symmetric: bool = True) -> Any:
    """``w`` quantized to ``bits`` in groups of ``group`` along its last dimension and back.

    Round-to-nearest with one float32 scale per group (the formulas in the module docstring:
    symmetric ``s = max|x| / (2^(b-1) - 1)``; asymmetric ``s = (max - min) / (2^b - 1)`` and
    the minimum kept). A last dimension that is not a multiple of ``group`` is padded with its
    last value, which changes no group's scale. Returns a float32 tensor of ``w``'s shape.

    Examples:
        >>> import torch
        >>> x = torch.tensor([-1.0, -0.3, 0.2, 0.7])
        >>> [round(v, 4) for v in roundtrip(x, 4, group=4).tolist()]  # s = 1/7: -7, -2, 1, 5 steps
        [-1.0, -0.2857, 0.1429, 0.7143]
        >>> [round(v, 4) for v in roundtrip(x, 4, group=4, symmetric=False).tolist()]  # s = 1.7/15 from -1
        [-1.0, -0.32, 0.2467, 0.7]
        >>> grid = torch.arange(-7.0, 8.0)  # values on the int4 grid come back exactly
        >>> torch.equal(roundtrip(grid, 4, group=15), grid)
        True
    """
    import torch

    if bits < 2 or group < 1:
        raise InputError(f"roundtrip needs bits >= 2 and group >= 1, got bits={bits}, group={group}")
    x = torch.as_tensor(w).detach().to(torch.float32)
    shape = x.shape
    x = x.reshape(-1, shape[-1]) if x.dim() > 1 else x.reshape(1, -1)
    rows, cols = x.shape
    pad = (-cols) % group
    if pad:
        x = torch.cat([x, x[:, -1:].expand(rows, pad)], dim=1)
    g = x.reshape(rows, -1, group)
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        scale = g.abs().amax(-1, keepdim=True) / qmax
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        deq = torch.clamp(torch.round(g / scale), -qmax, qmax) * scale
    else:
        levels = 2**bits - 1
        lo = g.amin(-1, keepdim=True)
        scale = (g.amax(-1, keepdim=True) - lo) / levels
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        deq = torch.clamp(torch.round((g - lo) / scale), 0, levels) * scale + lo
    return deq.reshape(rows, -1)[:, :cols].reshape(shape)


def relative_error(w: Any, w_hat: Any) -> float:
    """``||w - w_hat||_F / ||w||_F`` in float64 (0 for an all-zero ``w`` reproduced exactly,
    inf for an all-zero ``w`` that was not).

    Examples:
        >>> import torch
        >>> relative_error(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 3.0]))  # 1 / 5
        0.2
        >>> relative_error(torch.zeros(2), torch.zeros(2)), relative_error(torch.zeros(2), torch.ones(2))
        (0.0, inf)
    """
    import torch

    a = torch.as_tensor(w).detach().to(torch.float64)
    b = torch.as_tensor(w_hat).detach().to(torch.float64)
    num, den = float(((a - b) ** 2).sum()), float((a**2).sum())
    return 0.0 if num == 0 else math.sqrt(num / den) if den > 0 else math.inf


def _squared_errors(w: Any, group: int, chunk_elements: int = 1 << 22) -> tuple[float, dict[str, float]]:
    """(||W||^2, {scheme: ||W - W'||^2}) in float64 sums, a few rows at a time."""
    import torch

    x = torch.as_tensor(w).detach().to(torch.float32)
    x = x.reshape(-1, x.shape[-1])
    step = max(1, chunk_elements // max(1, x.shape[1]))
    norm2, err2 = 0.0, dict.fromkeys(SCHEMES, 0.0)
    for i in range(0, x.shape[0], step):
        part = x[i : i + step]
        norm2 += float((part.double() ** 2).sum())
        for name, (bits, sym) in SCHEMES.items():
            err2[name] += float(((part - roundtrip(part, bits, group, sym)).double() ** 2).sum())
    return norm2, err2


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...]
    stored_as: str
    load: Callable[[int], Any]  # row step -> float32 tensor of rows[::step]


def _safetensors(paths: list[Path]) -> Iterable[_Tensor]:
    import torch
    from safetensors import safe_open

    for path in paths:
        try:
            f = safe_open(str(path), framework="pt")
        except Exception as e:
            raise InputError(f"{path} is not a readable safetensors file ({str(e).splitlines()[0][:120]}); pass a "
                             ".safetensors file, a folder of them or a .gguf") from None
        for name in f.keys():
            sl = f.get_slice(name)
            yield _Tensor(name, tuple(sl.get_shape()), str(sl.get_dtype()), lambda step,
                          sl=sl: torch.as_tensor(sl[::step]).to(torch.float32))


def _gguf(path: Path) -> Iterable[_Tensor]:
    try:
        import numpy as np
        import torch
        from gguf import GGUFReader
        from gguf.quants import dequantize
    except ImportError:
        raise InputError("reading a GGUF needs the gguf package; pip install 'leadline[hf]'") from None
    try:
        reader = GGUFReader(str(path))
    except Exception as e:
        raise InputError(f"{path} is not a readable GGUF file ({str(e).splitlines()[0][:120]}); pass a .gguf written "
                         "by llama.cpp or gguf-py") from None
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))

        def load(step: int, t: Any = t, shape: tuple[int, ...] = shape) -> Any:
            data = np.ascontiguousarray(t.data[::step] if len(shape) > 1 else t.data)
            arr = dequantize(data, t.tensor_type).reshape((-1, *shape[1:]))
            return torch.from_numpy(np.array(arr, dtype=np.float32))

        yield _Tensor(t.name, shape, t.tensor_type.name, load)


def _tensors_of(source: Any) -> tuple[str, str, list[_Tensor]]:
    """(description, format, tensors) of a path, a model or a dict of tensors."""
    if isinstance(source, (str, os.PathLike)):
        p = Path(source)
        if not p.exists():
            raise InputError(f"model {p} does not exist; pass a .safetensors file, a folder of them or a .gguf file")
        if p.is_dir():
            shards = sorted(p.glob("*.safetensors"))
            ggufs = sorted(p.glob("*.gguf"))
            if shards:
                return str(p), "safetensors", list(_safetensors(shards))
            if len(ggufs) == 1:
                return str(ggufs[0]), "gguf", list(_gguf(ggufs[0]))
            raise InputError(f"model folder {p} holds no .safetensors file and not exactly one .gguf; pass the file "
                             "itself")
        if p.suffix.lower() == ".gguf":
            return str(p), "gguf", list(_gguf(p))
        if p.suffix.lower() == ".safetensors":
            return str(p), "safetensors", list(_safetensors([p]))
        raise InputError(f"model {p} is neither .safetensors nor .gguf; pass one of those or a folder of safetensors")
    import torch

    if hasattr(source, "state_dict") and callable(source.state_dict):
        items, desc, fmt = source.state_dict().items(), type(source).__name__, "model"
    elif isinstance(source, Mapping):
        items, desc, fmt = source.items(), "tensors", "tensors"
    else:
        raise InputError(f"quant_error takes a path, a torch module or a dict of tensors, got {type(source).__name__}")
    seen, out = set(), []
    for name, w in items:
        w = torch.as_tensor(w)
        key = (w.data_ptr(), tuple(w.shape)) if w.numel() else None
        if key in seen:
            continue  # a tied weight (lm_head sharing the embeddings) counts once
        seen.add(key)
        out.append(_Tensor(name, tuple(w.shape), str(w.dtype).replace("torch.", ""), lambda step,
                           w=w: w.detach()[::step].to("cpu", torch.float32)))
    return desc, fmt, out


@dataclass
class FamilyError:
    """One family's measured error per scheme (:data:`SCHEMES`) and its share of a layer.

    Examples:
        >>> f = FamilyError("gate", 3, 3 * 576 * 1536, 0.25, 0.197, {"int4_sym": 0.1125}, ["Q4_1"])
        >>> f"{f.errors['int4_sym']:.2%} of a weight, {f.share_of_layer:.0%} of a layer"
        '11.25% of a weight, 25% of a layer'
    """

    family: str
    tensors: int
    elements_measured: int
    share_of_layer: float | None  # None for embeddings / lm_head (not in a layer)
    share_of_model: float
    errors: dict[str, float]
    stored_as: list[str]


@dataclass
class QuantReport:
    """Per-family round-trip errors of the measured layers, the embeddings, and notes.

    ``text()`` is what ``leadline quant`` prints, ``to_dict()`` its ``--json``, ``as_values()``
    the pooled symmetric int8 and int4 errors as plan values.

    Examples:
        >>> import torch
        >>> weights = {"model.layers.0.self_attn.q_proj.weight": torch.linspace(-1, 1, 256).reshape(4, 64),
        ...            "model.layers.0.mlp.up_proj.weight": torch.linspace(-1, 1, 768).reshape(12, 64),
        ...            "model.embed_tokens.weight": torch.linspace(0, 1, 512).reshape(8, 64)}
        >>> report = quant_error(weights)
        >>> print(report.text())
        leadline quant: tensors (tensors), layers 0 of 1, group 64, relative Frobenius error
        family      share of layer   int8 sym  int8 asym   int4 sym  int4 asym  stored as
        q                    25.0%      0.14%      0.10%      5.58%      1.63%  float32
        up                   75.0%      0.25%      0.03%      4.45%      0.54%  float32
        embeddings  (33.3% of all)      0.25%      0.02%      4.52%      0.41%  float32
        layers            (pooled)      0.23%      0.06%      4.76%      0.94%
        int4 symmetric across the layer families: 4.45%-5.58%, spread 1.25x: uniform (uniform means within 1.5x).
        >>> report.family("up").share_of_layer, report.uniform()
        (0.75, True)
        >>> round(report.as_values()["quant_int4_error"].value, 4)
        0.0476
    """

    source: str
    format: str
    group: int
    layers: list[int]
    n_layers: int
    families: list[FamilyError]
    layer_errors: dict[str, float]  # pooled over every measured layer matrix
    spread: dict[str, float]  # max / min error across the per-layer families
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def family(self, name: str) -> FamilyError:
        """The :class:`FamilyError` of ``name``; KeyError naming the measured families if absent."""
        for f in self.families:
            if f.family == name:
                return f
        raise KeyError(f"no family {name!r}; measured: {', '.join(f.family for f in self.families)}")

    def uniform(self, scheme: str = "int4_sym") -> bool:
        """True when the per-layer families lie within ``UNIFORM_SPREAD`` of each other."""
        return self.spread.get(scheme, math.inf) <= UNIFORM_SPREAD

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON-ready data (``leadline quant --json``)."""
        return asdict(self)

    def text(self) -> str:
        """One row per family: share of a layer, the four schemes' errors, how it was stored."""
        layers = ", ".join(map(str, self.layers)) or "none"
        lines = [f"leadline quant: {self.source} ({self.format}), layers {layers} of {self.n_layers}, group "
                 f"{self.group}, relative Frobenius error"]
        lines.append(f"{'family':<11}{'share of layer':>15}" + "".join(f"{k.replace('_', ' '):>11}" for k in SCHEMES)
                     + "  stored as")
        for f in self.families:
            share = f"{f.share_of_layer:.1%}" if f.share_of_layer is not None else f"({f.share_of_model:.1%} of all)"
            lines.append(f"{f.family:<11}{share:>15}" + "".join(f"{f.errors[k]:11.2%}" for k in SCHEMES)
                         + f"  {', '.join(f.stored_as)}")
        lines.append(f"{'layers':<11}{'(pooled)':>15}" + "".join(f"{self.layer_errors[k]:11.2%}" for k in SCHEMES))
        per = [f for f in self.families if f.share_of_layer is not None]
        if per:
            lo = min(f.errors["int4_sym"] for f in per)
            hi = max(f.errors["int4_sym"] for f in per)
            word = "uniform" if self.uniform() else "not uniform"
            lines.append(f"int4 symmetric across the layer families: {lo:.2%}-{hi:.2%}, spread "
                         f"{self.spread['int4_sym']:.2f}x: {word} (uniform means within {UNIFORM_SPREAD:g}x).")
        lines += [f"note: {x}" for x in self.notes]
        return "\n".join(lines)

    def as_values(self) -> dict[str, Value]:
        """``quant_int8_error`` and ``quant_int4_error``: the symmetric schemes pooled over the
        measured layers, the families as evidence."""
        ev = {"families": [asdict(f) for f in self.families], "layers": self.layers, "group": self.group,
              "source": self.source}
        src = (f"round-trip of layers {', '.join(map(str, self.layers))} of {Path(self.source).name}, group "
               f"{self.group}, relative Frobenius error")
        return {
            "quant_int8_error": Value(self.layer_errors["int8_sym"], "measured", f"symmetric int8 {src}", ev,
                                      self.seconds),
            "quant_int4_error": Value(self.layer_errors["int4_sym"], "measured", f"symmetric int4 {src}", ev,
                                      self.seconds),
        }


def _choose_layers(present: list[int], layers: Any) -> list[int]:
    if not present:
        return []
    if layers is None:
        return sorted({present[0], present[len(present) // 2], present[-1]})
    if layers == "all":
        return present
    chosen = sorted({int(x) for x in layers})
    missing = [x for x in chosen if x not in present]
    if missing:
        raise InputError(f"layers {missing} are not in the model, which has layers {present[0]}-{present[-1]}; pass "
                         "indices in that range or 'all'")
    return chosen


def quant_error(
    source: Any,
    *,
    layers: Iterable[int] | str | None = None,
    group: int = 64,
    max_elements: int = MAX_ELEMENTS,
    on_progress: Callable[[str], None] | None = None,
) -> QuantReport:
    """int8/int4 round-trip error per weight family of ``source``.

    Args:
        source: a ``.safetensors`` file, a folder of them, a ``.gguf`` file, a torch module or a
            ``{name: tensor}`` dict.
        layers: layer indices to measure; default the first, middle and last (three complete
            layers); ``"all"`` for every layer. Embeddings always.
        group: values per quantization group along the input dimension.
        max_elements: a larger tensor is measured on evenly spaced whole rows up to this size.

    Each 2-D weight is round-tripped by :func:`roundtrip` in the four :data:`SCHEMES`; a
    family's error is ``sqrt(sum ||W - W'||^2 / sum ||W||^2)`` over its tensors, its share of a
    layer its element count over all 2-D weights of the layers.

    Raises:
        InputError: a missing or unreadable file, no 2-D weights, layers not in the model.

    Examples:
        >>> import torch
        >>> weights = {"model.layers.0.self_attn.q_proj.weight": torch.linspace(-1, 1, 256).reshape(4, 64),
        ...            "model.layers.0.mlp.up_proj.weight": torch.linspace(-1, 1, 768).reshape(12, 64),
        ...            "model.embed_tokens.weight": torch.linspace(0, 1, 512).reshape(8, 64)}
        >>> report = quant_error(weights)
        >>> report.layers, [f.family for f in report.families]
        ([0], ['q', 'up', 'embeddings'])
        >>> {k: round(v, 4) for k, v in report.layer_errors.items()}
        {'int8_sym': 0.0023, 'int8_asym': 0.0006, 'int4_sym': 0.0476, 'int4_asym': 0.0094}
        >>> quant_error(weights, layers=[5])
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: layers [5] are not in the model, which has layers 0-0; pass indices in that ...
    """
    t0 = time.perf_counter()
    if group < 1:
        raise InputError(f"group must be a positive number of values, got {group}")
    desc, fmt, tensors = _tensors_of(source)
    named = fmt in ("model", "tensors")  # a module's or dict's names need no ".weight"
    mats = [t for t in tensors if len(t.shape) == 2 and (named or t.name.endswith("weight"))]
    mats = [t for t in mats if layer_of(t.name) is not None or family_of(t.name) in ("embeddings", "lm_head")]
    if not mats:
        raise InputError(f"{desc} holds no 2-D weight matrices; pass a transformer's weights")
    present = sorted({x for t in mats if (x := layer_of(t.name)) is not None})
    chosen = _choose_layers(present, layers)
    total = sum(math.prod(t.shape) for t in mats)
    layer_total = sum(math.prod(t.shape) for t in mats if layer_of(t.name) is not None)
    by_family: dict[str, dict[str, Any]] = {}
    for t in mats:
        fam = family_of(t.name)
        d = by_family.setdefault(fam,
                                 {"all": 0, "n": 0, "el": 0, "norm2": 0.0, "err2": dict.fromkeys(SCHEMES, 0.0),
                                  "stored": set()})
        d["all"] += math.prod(t.shape)
    todo = [t for t in mats if layer_of(t.name) is None or layer_of(t.name) in chosen]
    progress = on_progress or (lambda _m: None)
    notes: list[str] = []
    sampled: list[str] = []
    for i, t in enumerate(todo):
        progress(f"{t.name} ({i + 1}/{len(todo)})")
        rows, cols = t.shape
        step = max(1, math.ceil(rows * cols / max_elements))
        w = t.load(step)
        if step > 1:
            sampled.append(f"{t.name} ({w.shape[0]:,} of {rows:,} rows, one in {step})")
        norm2, err2 = _squared_errors(w, group)
        d = by_family[family_of(t.name)]
        d["n"] += 1
        d["el"] += int(w.numel())
        d["norm2"] += norm2
        d["stored"].add(t.stored_as)
        for k in SCHEMES:
            d["err2"][k] += err2[k]
    if sampled:
        more = f" and {len(sampled) - 3} more" if len(sampled) > 3 else ""
        notes.append(f"tensors over {max_elements:,} elements were measured on evenly spaced whole rows: "
                     f"{'; '.join(sampled[:3])}{more}")
    quantized = sorted({t.stored_as for t in todo} - _FULL_PRECISION)
    if quantized:
        notes.insert(0,
                     f"the file stores weights as {', '.join(quantized)}: errors are measured against those "
                     "dequantized weights, which already sit on a coarse grid, not against the original full-precision "
                     "ones")
    families: list[FamilyError] = []
    for fam in FAMILY_ORDER:
        d = by_family.get(fam)
        if not d or not d["n"]:
            continue
        errors = {k: math.sqrt(d["err2"][k] / d["norm2"]) if d["norm2"] > 0 else 0.0 for k in SCHEMES}
        in_layer = fam not in ("embeddings", "lm_head")
        share = d["all"] / layer_total if in_layer and layer_total else None
        families.append(FamilyError(fam, d["n"], d["el"], share, d["all"] / total, errors, sorted(d["stored"])))
    per_layer = [f for f in families if f.share_of_layer is not None]
    layer_err: dict[str, float] = {}
    spread: dict[str, float] = {}
    for k in SCHEMES:
        n2 = sum(by_family[f.family]["norm2"] for f in per_layer)
        e2 = sum(by_family[f.family]["err2"][k] for f in per_layer)
        layer_err[k] = math.sqrt(e2 / n2) if n2 > 0 else math.nan
        errs = [f.errors[k] for f in per_layer if f.errors[k] > 0]
        spread[k] = max(errs) / min(errs) if errs else 1.0
    return QuantReport(desc, fmt, group, chosen, len(present), families, layer_err, spread, notes,
                       time.perf_counter() - t0)
