"""Write the GGUF model as a Hugging Face folder (float32 safetensors + tokenizer), once per device
machine, so that each CLI call loads it in seconds instead of dequantizing the GGUF again (26-40 s a
call on the H200, from the plans' "loading the model" notes). The weights are the GGUF's dequantized
weights, bit for bit: the script checks the folder's logits against the GGUF's on a few tokens and
refuses to finish otherwise.

    python3 benchmarks/gguf_to_folder.py /root/assets/smol.gguf /root/assets/smol_hf
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: gguf_to_folder.py MODEL.gguf OUT_DIR", file=sys.stderr)
        return 2
    import torch

    from leadline.hf.loading import load_model, load_tokenizer

    src, dst = args[0], Path(args[1])
    t = time.perf_counter()
    model = load_model(src, device="cpu", dtype=torch.float32)
    tok = load_tokenizer(src)
    t_gguf = time.perf_counter() - t
    from transformers import AutoModelForCausalLM

    config = model.config
    if hasattr(config, "quantization_config"):  # transformers marks a GGUF-loaded model quantized and will not save it
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(dst)
    tok.save_pretrained(dst)
    t = time.perf_counter()
    again = load_model(dst, device="cpu", dtype=torch.float32)
    t_folder = time.perf_counter() - t
    ids = torch.tensor([tok("The package provides a sound mixer.\nSection:")["input_ids"]])
    with torch.no_grad():
        same = torch.equal(model(input_ids=ids).logits, again(input_ids=ids).logits)
    tok2 = load_tokenizer(dst)
    same_tok = (tok2("a b c\nSection: net")["input_ids"] == tok("a b c\nSection: net")["input_ids"]
                and tok2.eos_token == tok.eos_token and tok2.pad_token == tok.pad_token
                and getattr(tok2, "chat_template", None) == getattr(tok, "chat_template", None))
    if not same or not same_tok:
        print(f"{dst}: the folder's logits or tokens differ from the GGUF's; not usable", file=sys.stderr)
        return 1
    print(f"wrote {dst}: loads in {t_folder:.1f} s against {t_gguf:.1f} s from the GGUF; logits identical on {ids.shape[1]} tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
