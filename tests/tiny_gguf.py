"""A tiny Llama written as a GGUF file, offline: the tokenizer and weights of ``helpers``
(byte-level BPE, a 2-layer Llama) in llama.cpp's layout, as ``convert_hf_to_gguf.py`` writes
them, with the large matrices stored as Q8_0 blocks, so transformers reads it as it reads a
downloaded .gguf (dequantized on load, ``config.quantization_config`` marked)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers import make_model, make_tokenizer


def _permute(w: Any, heads: int) -> Any:
    """llama.cpp's row order for a query/key matrix (transformers undoes it on load)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def save_gguf(path: Path, seed: int = 0) -> Path:
    """The tiny model and its tokenizer as one .gguf file at ``path``; returns ``path``."""
    import gguf
    import numpy as np
    from gguf.quants import quantize

    tok = make_tokenizer()
    model = make_model(vocab_size=len(tok), seed=seed)
    cfg = model.config
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(cfg.vocab_size)
    spec = json.loads(tok.backend_tokenizer.to_str())
    vocab = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    specials = {t["content"]: t["id"] for t in spec["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t, _ in vocab])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])
    w.add_eos_token_id(specials["<|endoftext|>"])
    w.add_pad_token_id(specials["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(tok.chat_template)
    q8 = gguf.GGMLQuantizationType.Q8_0

    def put(name: str, array: Any, quantized: bool = False) -> None:
        array = np.ascontiguousarray(array, dtype=np.float32)
        if quantized:
            w.add_tensor(name, quantize(array, q8), raw_dtype=q8)
        else:
            w.add_tensor(name, array)

    put("token_embd.weight", state["model.embed_tokens.weight"], quantized=True)
    put("output_norm.weight", state["model.norm.weight"])
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", state[pre + "input_layernorm.weight"])
        put(f"blk.{i}.ffn_norm.weight", state[pre + "post_attention_layernorm.weight"])
        put(f"blk.{i}.attn_q.weight", _permute(state[pre + "self_attn.q_proj.weight"], cfg.num_attention_heads), True)
        put(f"blk.{i}.attn_k.weight", _permute(state[pre + "self_attn.k_proj.weight"], cfg.num_key_value_heads), True)
        put(f"blk.{i}.attn_v.weight", state[pre + "self_attn.v_proj.weight"], True)
        put(f"blk.{i}.attn_output.weight", state[pre + "self_attn.o_proj.weight"], True)
        put(f"blk.{i}.ffn_gate.weight", state[pre + "mlp.gate_proj.weight"], True)
        put(f"blk.{i}.ffn_up.weight", state[pre + "mlp.up_proj.weight"], True)
        put(f"blk.{i}.ffn_down.weight", state[pre + "mlp.down_proj.weight"], True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
