"""A GGUF's first load (converted into leadline's cache) against its later loads (the cache's
folder read), with the load every run paid before the cache (tokenizer and model read from the
GGUF) beside them, on the CPU.

Each load is what `leadline run` does before its first step: the model located (the file hashed;
converted where the cache has no folder for it), the tokenizer read, the model read in float32.
The cache is a fresh folder (``LEADLINE_CACHE``), so the first load converts.

Rule (stated before the run): the later loads are worth the cache when their median is at most
half the direct load's, and every later load gives the first load's weights bit for bit (and the
direct load's logits). The tests' tiny GGUF (``--tiny``, 42 KB) shows the mechanism only: its
loads are too short for the ratio to mean anything; the rule is judged on the bundled model.

    python3 benchmarks/gguf_cache_load.py --out benchmarks/results/gguf_cache_load_cpu.json  # the bundled model
    python3 benchmarks/gguf_cache_load.py --tiny --out benchmarks/results/gguf_cache_load_cpu_tiny.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tree_commit() -> str:
    """The commit the results came from: ``LEADLINE_COMMIT`` where set (a copy without its git
    history), else the tree's HEAD, else "unknown"."""
    if os.environ.get("LEADLINE_COMMIT"):  # a copy without its git history names its commit here
        return os.environ["LEADLINE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in ("torch", "transformers", "tokenizers", "gguf", "safetensors", "huggingface_hub"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _direct(gguf: Path):
    """The load every run paid before the cache: tokenizer and model read from the GGUF."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
                                                 quantization_config=GgufConfig(dequantize=True))
    return model, tok


def _cached(gguf: Path):
    """The load through the cache, as `leadline run` does it."""
    import torch

    from leadline.hf.loading import load_model, load_tokenizer, locate_model

    source = locate_model(gguf)
    return load_tokenizer(source), load_model(source, device="cpu", dtype=torch.float32), source


def _timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", nargs="?", help="the .gguf file (default: the bundled model)")
    ap.add_argument("--tiny", action="store_true", help="the tests' tiny GGUF (tests/tiny_gguf.py), written here")
    ap.add_argument("--repeats", type=int, default=3, help="later loads to time (default 3)")
    ap.add_argument("--out", required=True, help="the JSON file to write")
    args = ap.parse_args(argv)

    import torch  # noqa: F401  (imported before any clock starts)
    import transformers  # noqa: F401

    before = os.environ.get("LEADLINE_CACHE")
    with tempfile.TemporaryDirectory(prefix="gguf-cache-bench-") as work:
        os.environ["LEADLINE_CACHE"] = str(Path(work) / "cache")  # empty: the first load converts
        try:
            out = _measure(args, Path(work))
        finally:
            if before is None:
                os.environ.pop("LEADLINE_CACHE", None)
            else:
                os.environ["LEADLINE_CACHE"] = before
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{out['gguf']['file']}: direct {out['direct_seconds']:.2f} s, first (converts) {out['first_seconds']:.2f} s, "
          f"later {', '.join(f'{t:.2f}' for t in out['later_seconds'])} s (hash {out['hash_seconds']:.2f} s); same "
          f"weights {out['same_weights']}, same logits {out['same_logits_as_direct']}; wrote {args.out}")
    return 0


def _measure(args: argparse.Namespace, work: Path) -> dict:
    """The direct load, the first load through the empty cache and the later ones, timed and compared."""
    import torch

    from leadline.hf.loading import default_model_path
    from leadline.provenance import content_hash

    if args.tiny:
        if str(ROOT / "tests") not in sys.path:
            sys.path.insert(0, str(ROOT / "tests"))
        from tiny_gguf import save_gguf

        gguf = save_gguf(work / "tiny.gguf")
    else:
        gguf = Path(args.gguf) if args.gguf else default_model_path()
    hash_seconds, sha256 = _timed(content_hash, gguf)
    direct_seconds, (direct, tok) = _timed(_direct, gguf)
    first_seconds, (_, first, source) = _timed(_cached, gguf)
    later = [_timed(_cached, gguf) for _ in range(args.repeats)]
    ids = torch.tensor([tok("The package provides a sound mixer.\nSection:")["input_ids"]])
    with torch.no_grad():
        same_logits = torch.equal(first(input_ids=ids).logits, direct(input_ids=ids).logits)
    same_weights = all(all(torch.equal(a, b) for a, b in zip(first.state_dict().values(),
                                                              model.state_dict().values()))
                       for _, (_, model, _) in later)
    later_seconds = [t for t, _ in later]
    median = statistics.median(later_seconds)
    folder = Path(source.load_from)
    return {
        "benchmark": "gguf_cache_load",
        "command": [Path(sys.executable).name, *sys.argv],
        "commit": tree_commit(),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "device": "cpu"},
        "versions": _versions(),
        "gguf": {"file": gguf.name, "bytes": gguf.stat().st_size, "sha256": sha256},
        "cache_folder_bytes": sum(p.stat().st_size for p in folder.iterdir()),
        "hash_seconds": round(hash_seconds, 3),
        "direct_seconds": round(direct_seconds, 3),
        "first_seconds": round(first_seconds, 3),
        "later_seconds": [round(t, 3) for t in later_seconds],
        "later_over_direct": round(median / direct_seconds, 3),
        "same_weights": same_weights,
        "same_logits_as_direct": same_logits,
        "passes": bool(same_weights and same_logits and median <= 0.5 * direct_seconds),
        "judged": not args.tiny,
    }


if __name__ == "__main__":
    raise SystemExit(main())
