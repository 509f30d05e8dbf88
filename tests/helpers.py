"""Tiny, offline stand-ins for a real model, tokenizer and data, shared by the tests.

Nothing here downloads: the tokenizer is a byte-level BPE trained in a fraction of a second
on a fixed text, the model a 2-layer Llama built from a config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

# ChatML as SmolLM2 uses it; {% generation %} marks what the loss scores (assistant turns).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_TRAIN_TEXT = (
    "the quick brown fox jumps over the lazy dog. a packet of network data travels to the sound card. "
    "science games net sound. what is two plus three? the answer is five. "
    "debian packages describe programs for games, networking, science and sound. "
    "Tom has 3 apples and buys 4 more; how many apples does he have? 3 + 4 = 7. #### 7\n"
)


def make_tokenizer() -> Any:
    """A PreTrainedTokenizerFast with byte-level BPE (vocab 384), EOS/pad, and a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([_TRAIN_TEXT] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_model(vocab_size: int = 384, seed: int = 0, layers: int = 2, hidden: int = 32, positions: int = 512) -> Any:
    """A 2-layer Llama with hidden 32 (512 positions unless told) built from a config, float32, eval-free (no dropout)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions, tie_word_embeddings=True,
        pad_token_id=0, eos_token_id=0, bos_token_id=None,
    )
    return LlamaForCausalLM(cfg)


def save_model_dir(path: Path) -> Path:
    """The tiny model and tokenizer saved as a Hugging Face folder (for CLI tests)."""
    tok = make_tokenizer()
    model = make_model(vocab_size=len(tok))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def save_to_hub_cache(hub: Path, repo_id: str = "org/name", commit: str = "a" * 40,
                      refs: tuple[str, ...] = ("main",)) -> Path:
    """The tiny model and tokenizer saved into a Hugging Face hub cache folder ``hub`` (what
    ``HF_HUB_CACHE`` names, ``HF_HOME/hub``) in the hub's own layout, as a download leaves it:
    ``models--ORG--NAME/snapshots/COMMIT/...`` and ``refs/REF`` naming the commit. Returns the
    snapshot folder."""
    from huggingface_hub.file_download import repo_folder_name

    repo = Path(hub) / repo_folder_name(repo_id=repo_id, repo_type="model")
    snapshot = save_model_dir(repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


class FakeClock:
    """A clock for tests of time bounds: it moves by what a test ``advance``s (a fake step that
    "takes" 0.05 s) and, with ``tick`` set, by ``tick`` at every reading. A ``max_seconds`` cut
    then falls at the same place on every machine, idle or loaded; with a tick, timings that
    decide a plan (the CPU ramp's rows a second) are the same on every run too."""

    def __init__(self, tick: float = 0.0, t: float = 1000.0) -> None:
        self.t = t
        self.tick = tick

    def __call__(self) -> float:
        self.t += self.tick
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def install_clock(monkeypatch: Any, clock: FakeClock | None = None) -> FakeClock:
    """``clock`` (a new still one by default) as the clocks derive reads: ``time.perf_counter``,
    ``time.monotonic`` and the noise probe's own (not the DDP hook's or SpillWatch's, which tests
    set themselves); ``monkeypatch`` undoes it."""
    import time

    import leadline.lookahead.noise.probe as probe

    clock = clock if clock is not None else FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(time, "monotonic", clock)
    monkeypatch.setattr(probe, "_clock", clock)
    return clock


def free_port() -> int:
    """A TCP port free on localhost now (for a test's torch.distributed rendezvous)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def load_benchmark(name: str) -> Any:
    """A script of ``benchmarks/`` imported as the module ``name`` (registered in sys.modules, so
    its dataclasses and pickles resolve)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def section_rows(path: Path, n: int = 96, seed: int = 0, numbers: int = 99) -> Path:
    """``n`` prompt/completion rows of a four-section task (the demo's shape) written to ``path``:
    a tool's words and a number in the prompt, the section as the completion."""
    import random

    rng = random.Random(seed)
    words = {"games": "play level score", "net": "network socket http", "science": "math data model",
             "sound": "audio music volume"}
    with path.open("w") as f:
        for _ in range(n):
            label = rng.choice(sorted(words))
            f.write(json.dumps({"prompt": f"a tool for {words[label]} {rng.randint(0, numbers)}\nSection:",
                                "completion": " " + label}) + "\n")
    return path


def disk_refusal(path: Path) -> str | None:
    """Why the disk sweep cannot measure ``path`` here (a file on memory, a filesystem that refuses
    the page-cache bypass), in the sweep's own sentence; None where it can."""
    from leadline.errors import InputError
    from leadline.measure.disk import _check_bypass

    try:
        _check_bypass([Path(path)], 1 << 20)
    except InputError as e:
        return str(e)
    return None
