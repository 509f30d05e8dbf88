"""Quantization round-trip error: known answers first, then the readers."""

import math

import numpy as np
import pytest
import torch

from leadline.errors import InputError
from leadline.measure.quant import family_of, layer_of, quant_error, relative_error, roundtrip


def test_values_on_the_int8_grid_come_back_exactly():
    g = torch.Generator().manual_seed(0)
    s = 2.0**-7
    k = torch.randint(-127, 128, (32, 128), generator=g).to(torch.float32)
    k[:, ::64] = 127.0  # every group of 64 holds +127 steps, so its scale is exactly s
    w = k * s
    assert relative_error(w, roundtrip(w, 8, 64, symmetric=True)) == 0.0
    # asymmetric: lo + k s with k in 0..255, each group holding both ends
    k = torch.randint(0, 256, (32, 128), generator=g).to(torch.float32)
    k[:, ::64], k[:, 1::64] = 0.0, 255.0
    w = -1.0 + k * s
    assert relative_error(w, roundtrip(w, 8, 64, symmetric=False)) == 0.0
    # and the 4-bit grid is coarser: the same int8-grid matrix does not survive int4
    assert relative_error(w, roundtrip(w, 4, 64, symmetric=False)) > 0.01


# Uniform values on [-a, a], groups of n = 64. Symmetric, q = 2^(b-1) - 1 levels a side: given
# the group's max |x| = m, the other n-1 values are uniform on [-m, m] with error variance
# (m/q)^2/12 and E[m^2] = a^2 n/(n+2), so rel^2 = (n-1) n/(n+2) / (12 q^2) / (n/3).
# Asymmetric, L = 2^b - 1 steps: the n-2 interior values have error variance (R/L)^2/12 with
# E[R^2] = 4a^2 n(n-1)/((n+1)(n+2)), so rel^2 = (n-2) 4 n(n-1)/((n+1)(n+2)) / (12 L^2) / (n/3).
def _expected(bits, symmetric, n=64):
    if symmetric:
        q = 2 ** (bits - 1) - 1
        return math.sqrt((n - 1) * n / (n + 2) / (12 * q * q) / (n / 3))
    steps = 2**bits - 1
    return math.sqrt((n - 2) * 4 * n * (n - 1) / ((n + 1) * (n + 2)) / (12 * steps * steps) / (n / 3))


@pytest.mark.parametrize(("bits", "symmetric", "approx"), [(8, True, 0.003847), (4, True, 0.06979), (8, False, 0.003742), (4, False, 0.06361)])
def test_uniform_matrix_has_the_computed_error(bits, symmetric, approx):
    assert _expected(bits, symmetric) == pytest.approx(approx, rel=1e-3)
    g = torch.Generator().manual_seed(1)
    w = torch.rand(512, 1024, generator=g) * 2 - 1
    got = relative_error(w, roundtrip(w, bits, 64, symmetric))
    assert got == pytest.approx(_expected(bits, symmetric), rel=0.02)


def test_a_short_last_group_is_its_own_group():
    w = torch.randn(8, 100, generator=torch.Generator().manual_seed(2))
    for sym in (True, False):
        full = roundtrip(w, 4, 64, sym)
        assert torch.equal(full[:, :64], roundtrip(w[:, :64], 4, 64, sym))
        assert torch.equal(full[:, 64:], roundtrip(w[:, 64:], 4, 36, sym))


def test_names_to_families_and_layers():
    assert family_of("model.layers.3.self_attn.q_proj.weight") == "q"
    assert family_of("model.layers.3.mlp.down_proj.weight") == "down"
    assert family_of("blk.7.attn_output.weight") == "o"
    assert family_of("blk.7.ffn_gate.weight") == "gate"
    assert family_of("layers.1.attention.wk.weight") == "k"
    assert family_of("model.embed_tokens.weight") == "embeddings"
    assert family_of("token_embd.weight") == "embeddings"
    assert family_of("output.weight") == "lm_head" and family_of("lm_head.weight") == "lm_head"
    assert family_of("model.layers.0.self_attn.rotary.weight") == "other"
    assert layer_of("model.layers.12.mlp.up_proj.weight") == 12 and layer_of("blk.0.attn_q.weight") == 0
    assert layer_of("model.embed_tokens.weight") is None


HIDDEN, KV, INTER, VOCAB = 64, 32, 192, 100


def _llama_like(layers=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = {"model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN, generator=g)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = torch.randint(-127, 128, (HIDDEN, HIDDEN), generator=g).float().index_fill_(1, torch.arange(0, HIDDEN, 64), 127.0) / 128
        for name, shape in (("self_attn.k_proj", (KV, HIDDEN)), ("self_attn.v_proj", (KV, HIDDEN)), ("self_attn.o_proj", (HIDDEN, HIDDEN)), ("mlp.gate_proj", (INTER, HIDDEN)), ("mlp.up_proj", (INTER, HIDDEN)), ("mlp.down_proj", (HIDDEN, INTER))):
            t[p + name + ".weight"] = torch.randn(*shape, generator=g) * 0.02
        t[p + "input_layernorm.weight"] = torch.ones(HIDDEN)
    return t


def test_safetensors_families_shares_and_known_zero(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    save_file({k: v.to(torch.bfloat16) for k, v in _llama_like(5).items()}, str(path))
    r = quant_error(path)
    assert r.format == "safetensors" and r.layers == [0, 2, 4] and r.n_layers == 5
    fams = [f.family for f in r.families]
    assert fams == ["q", "k", "v", "o", "gate", "up", "down", "embeddings"]
    layer = HIDDEN * HIDDEN * 2 + KV * HIDDEN * 2 + INTER * HIDDEN * 3
    assert r.family("gate").share_of_layer == pytest.approx(INTER * HIDDEN / layer)
    assert r.family("k").share_of_layer == pytest.approx(KV * HIDDEN / layer)
    assert r.family("embeddings").share_of_layer is None
    assert sum(f.share_of_layer for f in r.families if f.share_of_layer is not None) == pytest.approx(1.0)
    assert r.family("q").errors["int8_sym"] == 0.0  # q was built on the int8 grid (bf16-exact)
    assert r.family("gate").errors["int8_sym"] > 0 and r.family("gate").errors["int4_sym"] > 10 * r.family("gate").errors["int8_sym"]
    assert r.family("gate").tensors == 3 and r.family("gate").stored_as == ["BF16"]
    assert set(r.as_values()) == {"quant_int8_error", "quant_int4_error"}
    assert "share of layer" in r.text()


def test_gguf_reads_rows_in_numpy_order_and_flags_quantized_storage(tmp_path):
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(3)
    q = rng.standard_normal((32, 128)).astype(np.float32)
    up = rng.standard_normal((96, 128)).astype(np.float32)
    emb = rng.standard_normal((50, 128)).astype(np.float32)
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_tensor("blk.0.attn_q.weight", q)
    w.add_tensor("blk.0.ffn_up.weight", quantize(up, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("token_embd.weight", emb.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = quant_error(tmp_path / "m.gguf")
    assert r.format == "gguf" and [f.family for f in r.families] == ["q", "up", "embeddings"]
    # groups run along each row of the numpy-order matrix: the same error as on the array itself
    want = relative_error(torch.from_numpy(q), roundtrip(torch.from_numpy(q), 4, 64, True))
    assert r.family("q").errors["int4_sym"] == pytest.approx(want, rel=1e-6)
    deq = torch.from_numpy(dequantize(quantize(up, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0))
    assert r.family("up").errors["int8_asym"] == pytest.approx(relative_error(deq, roundtrip(deq, 8, 64, False)), rel=1e-6)
    assert r.family("up").stored_as == ["Q8_0"] and "stores weights as Q8_0" in r.notes[0]


def test_a_loaded_module_counts_a_tied_weight_once_and_subsamples_rows():
    import torch.nn as nn

    m = nn.Module()
    m.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
    m.layers = nn.ModuleList()
    for _ in range(2):
        block = nn.Module()
        block.q_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        block.up_proj = nn.Linear(HIDDEN, INTER, bias=False)
        m.layers.append(block)
    m.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
    m.lm_head.weight = m.embed_tokens.weight
    r = quant_error(m, layers="all", max_elements=HIDDEN * 50)
    assert [f.family for f in r.families] == ["q", "up", "embeddings"]
    assert r.family("embeddings").elements_measured == HIDDEN * 50  # every 2nd of 100 rows
    assert any("embed_tokens.weight (50 of 100 rows, one in 2)" in n for n in r.notes)


def test_bad_sources_are_one_sentence(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        quant_error(tmp_path / "missing.gguf")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(InputError, match=r"neither \.safetensors nor \.gguf"):
        quant_error(tmp_path / "x.txt")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(InputError, match="not a readable safetensors"):
        quant_error(bad)
    with pytest.raises(InputError, match="layers"):
        quant_error(_llama_like(2), layers=[7])
