"""Does the same seed give the same adapter beside other processes on one GPU, and what does
making it so cost? ``leadline run`` at seed 0 on one task, each arm twice, every process side by
side on the card, each adapter's sha256 and wall seconds.

Arms (each a ``python3 -c`` wrapper around ``leadline.cli.main``, so nothing in leadline changes):
  plain        ``leadline run`` as a user runs it.
  det_warn     ``torch.use_deterministic_algorithms(True, warn_only=True)`` and
               ``CUBLAS_WORKSPACE_CONFIG=:4096:8``: an op without a deterministic kernel warns and
               runs as before (memory-efficient attention's backward does, on CUDA).
  det_strict   the same with ``warn_only=False``: memory-efficient attention takes its deterministic
               backward; an op with no deterministic kernel stops the run (its error in the log).
  math_sdpa    plain, with ``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`` around the command:
               attention in ordinary matmuls, deterministic without the global switch.

Decision rules, written before the run:
  D1  an arm is deterministic on this card when its two runs wrote the same sha256 of
      ``adapter_model.safetensors`` (both finished with exit 0 or 3).
  D2  its cost is the sum of its two runs' wall seconds over plain's two, all side by side in
      one call (so each shares the card alike); a deterministic arm "costs little" at <= 1.10x.
  D3  leadline's default would take the cheapest deterministic arm that costs little; none
      passing D1 and D2 leaves the default as it is and says so.

    PYTHONPATH=src python3 benchmarks/determinism_probe.py --model /tmp/smol_hf \\
        --data /tmp/guarded_run/train.jsonl --steps 100 --arms plain,det_warn,det_strict,math_sdpa \\
        --out benchmarks/results/determinism_probe_h100/result.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import scoreboard as sb  # noqa: E402  (the commit and the machine, as every result file records them)

PRELUDE = {
    "plain": "",
    "det_warn": "import torch; torch.use_deterministic_algorithms(True, warn_only=True); ",
    "det_strict": "import torch; torch.use_deterministic_algorithms(True); ",
    "math_sdpa": ("import torch; from torch.nn.attention import sdpa_kernel, SDPBackend; "
                  "_k = sdpa_kernel(SDPBackend.MATH); _k.__enter__(); "),
}
RULES = {
    "D1": "an arm is deterministic when its two side-by-side runs wrote the same adapter sha256",
    "D2": "cost: the arm's two wall seconds over plain's two, side by side in one call; little at <= 1.10x",
    "D3": "the default takes the cheapest arm passing D1 and D2; none: the default stays, said so",
}


def command(arm: str, args: argparse.Namespace, out: Path) -> list[str]:
    """The arm's process: the prelude, then ``leadline run`` through its own entry point."""
    code = PRELUDE[arm] + "import sys; from leadline.cli import main; sys.exit(main(sys.argv[1:]))"
    return [sys.executable, "-c", code, "run", "--model", args.model, "--data", args.data, "--seed", str(args.seed),
            *(["--steps", str(args.steps)] if args.steps else []), "--out", str(out)]


def guarded_rows(data_dir: Path, model: str, out: Path) -> Path:
    """The guarded run's training rows (its :func:`guarded_run.build_task`), written to ``out``."""
    import guarded_run
    from leadline.hf import load_tokenizer

    task = guarded_run.build_task(data_dir, load_tokenizer(model), 4000, 1, 256)
    out.write_text("".join(json.dumps({"prompt": r["prompt"], "completion": r["completion"]}) + "\n"
                           for r in task["train"]))
    return out


def sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def decide(units: dict[str, dict[str, Any]], arms: list[str]) -> dict[str, Any]:
    """D1-D3 on the finished units.

        >>> u = {f"{a}_{k}": {"exit": 0, "sha256": s, "wall": w} for a, k, s, w in
        ...      [("plain", 0, "x", 10), ("plain", 1, "y", 10), ("det", 0, "z", 10.5), ("det", 1, "z", 10.5)]}
        >>> d = decide(u, ["plain", "det"]); d["det"]["deterministic"], d["det"]["cost"], d["default"]
        (True, 1.05, 'det')
    """
    walls = {a: sum(units[f"{a}_{k}"]["wall"] for k in (0, 1)) for a in arms
             if all(f"{a}_{k}" in units for k in (0, 1))}
    out: dict[str, Any] = {}
    for a in walls:
        runs = [units[f"{a}_{k}"] for k in (0, 1)]
        finished = all(r["exit"] in (0, 3) for r in runs)
        out[a] = {"deterministic": finished and runs[0]["sha256"] is not None and runs[0]["sha256"] == runs[1]["sha256"],
                  "cost": round(walls[a] / walls["plain"], 3) if "plain" in walls else None}
    passing = [a for a in out if a != "plain" and out[a]["deterministic"] and (out[a]["cost"] or 9) <= 1.10]
    out["default"] = min(passing, key=lambda a: out[a]["cost"]) if passing else None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="/tmp/smol_hf")
    ap.add_argument("--data", help="the training rows (prompt/completion JSONL)")
    ap.add_argument("--data-dir", help="without --data: build the guarded run's rows from this folder "
                    "(benchmarks/guarded_run.py: 4,000 Debian sections rows, descriptions cut to 256 tokens)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--arms", default="plain,det_warn,det_strict,math_sdpa")
    ap.add_argument("--work", default="/tmp/determinism_probe")
    ap.add_argument("--out", default=str(HERE / "results" / "determinism_probe_h100" / "result.json"))
    args = ap.parse_args(argv)
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in PRELUDE]
    if unknown:
        raise SystemExit(f"--arms {','.join(unknown)}: not an arm; pass some of {', '.join(PRELUDE)}")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if not args.data:
        if not args.data_dir:
            raise SystemExit("--data or --data-dir: pass the training rows or the folder to build them from")
        args.data = str(guarded_rows(Path(args.data_dir), args.model, work / "train.jsonl"))
    env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    procs = {}
    for arm in arms:
        for k in (0, 1):
            name = f"{arm}_{k}"
            log = open(work / f"{name}.log", "w")  # closed when its process ends
            procs[name] = (subprocess.Popen(command(arm, args, work / name), stdout=log, stderr=subprocess.STDOUT,
                                            env=env if arm.startswith("det") else os.environ), time.perf_counter(), log)
    units: dict[str, dict[str, Any]] = {}
    while len(units) < len(procs):  # each process's wall seconds at its own end, not at the next wait
        for name, (p, t0, log) in procs.items():
            if name not in units and p.poll() is not None:
                units[name] = {"exit": p.returncode, "wall": round(time.perf_counter() - t0, 2),
                               "sha256": sha256(work / name / "adapter_model.safetensors")}
                log.close()
                if p.returncode not in (0, 3):  # why it failed, in the result itself
                    units[name]["log_tail"] = (work / f"{name}.log").read_text(errors="replace")[-600:]
        time.sleep(0.2)
    result = {"benchmark": "determinism_probe", "rules": RULES, "command": " ".join(sys.argv), "commit": sb._commit(),
              "machine": sb._machine(), "units": units, "decision": decide(units, arms)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["decision"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
