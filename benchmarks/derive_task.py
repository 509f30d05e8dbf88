"""The step derive() plans for a task: B*, the micro-batch cut to it and grad_accum,
through the command line a user runs, on SmolLM2-135M-Instruct LoRA r16.

Tasks (rows as prompt/completion, the same formats as benchmarks/noise_probe.py):
  debian_sections  prompt = the package description[:600] + "\\nSection:", completion = " " + label
  gsm_symbolic     prompt = question + "\\n", completion = answer_cot

For each task: `leadline derive --effort EFFORT --epochs 1`, timed, and from its plan the noise
at step 0 and past the format, the rows the card fits, tokens_per_step (B*), micro_batch,
grad_accum and the rate, each with its source sentence.

Decision rules, written before the run (they check the plan's arithmetic on the real card):
  S1  the micro-batch is cut to the step: micro_batch <= rows_fit, and grad_accum = 1 whenever
      the step's rows fit in one micro-batch;
  S2  micro_batch x grad_accum x scored tokens a row covers tokens_per_step and exceeds it by
      less than one micro-batch;
  S3  derive exits 0 within --max-seconds (its own time, from the plan's note).
With --repeats N (N >= 2), the same derive N times on the same card, data and seed:
  S4  the step does not move with the card's timing jitter: tokens_per_step of the N plans within
      20% of each other (max / min <= 1.2; three derives before one row and the rows that fit were
      timed in turn took 19, 27 and 30 rows a step on gsm_symbolic);
  S5  the rate within one step of the look-ahead's grid (max / min <= 2).
The peer for scale: pichak 0.4.1 on the same H200 and debian_sections kept 242 rows a
micro-batch and took that as the step, 13 optimizer steps for the run.

    PYTHONPATH=src python3 benchmarks/derive_task.py --tasks debian_sections,gsm_symbolic --out $OUT/derive_tasks.json
    PYTHONPATH=src python3 benchmarks/derive_task.py --tasks gsm_symbolic --repeats 3 --out $OUT/derive_stability.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TASKS = {
    "debian_sections": lambda r, n: {"prompt": r["text"][:n] + "\nSection:", "completion": " " + r["label"]},
    "gsm_symbolic": lambda r, n: {"prompt": r["question"] + "\n", "completion": r["answer_cot"]},
}
KEYS = ("noise_scale_tokens", "noise_scale_past_format_tokens", "rows_fit", "tokens_per_step", "micro_batch", "grad_accum",
        "scored_tokens_per_row", "seq_len", "total_steps", "alpha1", "lr")


def derive_seconds(plan: dict[str, Any]) -> float | None:
    for note in plan.get("notes", []):
        m = re.match(r"derive took ([0-9.]+) s", note)
        if m:
            return float(m.group(1))
    return None


def rules(values: dict[str, Any], took: float | None, max_seconds: float, rc: int) -> dict[str, Any]:
    mb, acc, fit = values.get("micro_batch"), values.get("grad_accum"), values.get("rows_fit")
    tps, per_row = values.get("tokens_per_step"), values.get("scored_tokens_per_row")
    out: dict[str, Any] = {"S3": rc == 0 and took is not None and took <= max_seconds}
    if all(isinstance(x, (int, float)) for x in (mb, acc, fit, tps, per_row)):
        step_rows = math.ceil(tps / per_row - 1e-9)
        out["S1"] = mb <= fit and (acc == 1 or step_rows > fit)
        covered = mb * acc * per_row
        out["S2"] = covered >= tps * (1 - 1e-9) and covered - tps < mb * per_row
    return out


def stability(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """S4 and S5 over the plans of repeated derives (None where fewer than two plans have the value)."""
    def spread(key: str) -> float | None:
        xs = [r.get("values", {}).get(key) for r in runs]
        xs = [x for x in xs if isinstance(x, (int, float)) and x > 0]
        return max(xs) / min(xs) if len(xs) >= 2 else None

    tokens, rate = spread("tokens_per_step"), spread("lr")
    steps = [x for r in runs if isinstance(x := r.get("values", {}).get("tokens_per_step"), (int, float))]
    ses = [x for r in runs if isinstance(x := r.get("noise_past_format_se_tokens"), (int, float)) and x > 0]
    # recorded beside the rules: the steps' range against the noise reading's own error (the
    # card-independence criterion: the steps within the noise scale's error of each other)
    within = (max(steps) - min(steps)) / min(ses) if len(steps) >= 2 and ses else None
    return {"tokens_per_step_max_over_min": tokens, "lr_max_over_min": rate,
            "tokens_per_step_range_over_noise_se": within,
            "S4": None if tokens is None else tokens <= 1.2, "S5": None if rate is None else rate <= 2.0}


def derive_once(args: argparse.Namespace, data: Path, plan_path: Path, rows: int) -> dict[str, Any]:
    """One `leadline derive` of ``data`` to ``plan_path``: its exit, time, values, sources and rules."""
    argv_cli = [sys.executable, "-m", "leadline", "derive", "--model", args.model, "--data", str(data), "--lora-rank", "16",
                "--effort", args.effort, "--epochs", "1", "--max-seconds", f"{args.max_seconds:g}", "--out", str(plan_path)]
    if args.device:
        argv_cli += ["--device", args.device]
    t = time.perf_counter()
    try:
        p = subprocess.run(argv_cli, capture_output=True, text=True, timeout=args.timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        rc, tail = p.returncode, (p.stdout + p.stderr)[-4000:]
    except subprocess.TimeoutExpired:
        rc, tail = -1, f"timeout after {args.timeout:g} s"
    entry: dict[str, Any] = {"rows": rows, "rc": rc, "seconds_with_loading": time.perf_counter() - t, "output_tail": tail}
    if plan_path.exists():
        plan = json.loads(plan_path.read_text())
        vals = plan.get("values", {})
        entry["values"] = {k: vals[k].get("value") for k in KEYS if k in vals}
        entry["sources"] = {k: vals[k].get("source") for k in KEYS if k in vals}
        past = (vals.get("noise_scale_past_format_tokens") or {}).get("evidence")
        entry["noise_past_format_se_tokens"] = past.get("se_tokens") if isinstance(past, dict) else None
        step_ev = (vals.get("tokens_per_step") or {}).get("evidence")
        entry["step_resolution"] = step_ev.get("step_resolution") if isinstance(step_ev, dict) else None
        entry["notes"] = plan.get("notes", [])
        entry["derive_seconds"] = derive_seconds(plan)
    entry["rules_outcome"] = rules(entry.get("values", {}), entry.get("derive_seconds"), args.max_seconds, rc)
    return entry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/root/assets/smol.gguf")
    ap.add_argument("--data-dir", default="/root/assets/data")
    ap.add_argument("--tasks", default="debian_sections,gsm_symbolic")
    ap.add_argument("--effort", default="full", choices=("full",))
    ap.add_argument("--max-seconds", type=float, default=110.0)
    ap.add_argument("--max-chars", type=int, default=600)
    ap.add_argument("--limit", type=int, default=None, help="the first N rows only (smoke runs)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("--work", default="/tmp/derive_task")
    ap.add_argument("--repeats", type=int, default=1, help="derive each task this many times (S4, S5)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    import torch

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "benchmark": "derive_task", "command": " ".join(sys.argv),
        "rules": ["S1", "S2", "S3"] + (["S4", "S5"] if args.repeats > 1 else []),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
                    "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"},
        "tasks": {},
    }
    t0 = time.perf_counter()
    for task in args.tasks.split(","):
        raw = [json.loads(line) for line in (Path(args.data_dir) / f"{task}_train.jsonl").read_text().splitlines() if line.strip()]
        raw = raw[: args.limit] if args.limit else raw
        data = work / f"{task}.jsonl"
        data.write_text("".join(json.dumps(TASKS[task](r, args.max_chars)) + "\n" for r in raw))
        runs: list[dict[str, Any]] = []
        for k in range(args.repeats):
            plan_path = work / f"{task}_plan{'' if k == 0 else f'_{k + 1}'}.json"
            plan_path.unlink(missing_ok=True)
            entry = derive_once(args, data, plan_path, len(raw))
            runs.append(entry)
            result["tasks"][task] = {**runs[0], "repeats": [r.get("values") for r in runs],
                                     "repeat_sources": [r.get("sources") for r in runs],
                                     "repeat_step_resolution": [r.get("step_resolution") for r in runs]} if k else runs[0]
            if k:
                result["tasks"][task]["stability"] = stability(runs)
            print(f"[{time.perf_counter() - t0:6.1f}s] {task}: rc={entry['rc']} {entry.get('values')} "
                  f"{entry['rules_outcome']}", flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1, default=str))
        if args.repeats > 1:
            print(f"{task}: {result['tasks'][task]['stability']}", flush=True)
    result["seconds"] = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
