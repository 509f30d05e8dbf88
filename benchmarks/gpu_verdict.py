"""`leadline gpu` on the card: the whole report as JSON, with the machine and versions, to --out.

What it runs: ``python -m leadline gpu --json`` exactly as a user would (``--repeat`` times, to
show how far the figures move between runs), plus the raw ``nvidia-smi -q`` it was judged
from. Nothing is retried or dropped: every run's exit code, stderr and JSON are kept.

Decision rule, stated before it runs (leadline.measure.gpu): the timings are not trusted when
the driver reports a vGPU card, a kernel launch costs over 10 µs, or one transfer direction is
over 2x slower than the other; matmul and device copy are read against the datasheet
(H200 SXM: 989 TFLOP/s dense bf16, 4.8 TB/s), below half of it is reported as a note.

    PYTHONPATH=src python3 benchmarks/gpu_verdict.py --out $OUT/gpu_h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def _run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> dict[str, object]:
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
        return {"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr, "seconds": round(time.perf_counter() - t0, 3)}
    except (OSError, subprocess.SubprocessError) as e:
        return {"rc": None, "stdout": "", "stderr": f"{type(e).__name__}: {e}", "seconds": round(time.perf_counter() - t0, 3)}


def _versions() -> dict[str, object]:
    out: dict[str, object] = {"python": sys.version.split()[0], "platform": platform.platform()}
    try:
        import torch

        out.update(torch=torch.__version__, cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(), cuda_available=torch.cuda.is_available(), device_count=torch.cuda.device_count())
    except ImportError:
        out["torch"] = None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="where to write the JSON")
    ap.add_argument("--repeat", type=int, default=2, help="full runs of leadline gpu (default: %(default)s)")
    ap.add_argument("--plan", default=None, help="passed on: judge costs as shares of this plan's step")
    ap.add_argument("--launches-per-step", default=None, help="passed on to leadline gpu")
    args = ap.parse_args()

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "leadline", "gpu", "--json"]
    if args.plan:
        cmd += ["--plan", args.plan]
    if args.launches_per_step:
        cmd += ["--launches-per-step", str(args.launches_per_step)]
    runs = []
    for i in range(max(1, args.repeat)):
        r = _run(cmd, env)
        try:
            r["report"] = json.loads(str(r["stdout"]))
            r["stdout"] = "(parsed into report)"
        except json.JSONDecodeError:
            r["report"] = None
        runs.append(r)
        rep = r["report"] or {}
        print(f"run {i + 1}: rc={r['rc']} {rep.get('device_name')} launch {rep.get('launch_us')} µs, matmul {rep.get('matmul_tflops')} TFLOP/s, verdict: {rep.get('verdict')}", flush=True)
    from leadline.measure.machine import describe_machine

    try:
        machine = describe_machine("cuda")
    except Exception as e:  # recorded, never fatal: the runs above are the result
        machine = {**describe_machine(), "error": f"{type(e).__name__}: {e}"}
    text = _run([sys.executable, "-m", "leadline", "gpu", "--quick"], env)
    result = {
        "benchmark": "gpu_verdict",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": shlex.join(["python", *cmd[1:]]),
        "benchmark_command": shlex.join(["python", *sys.argv]),
        "machine": machine,
        "versions": _versions(),
        "nvidia_smi_q": _run(["nvidia-smi", "-q"], timeout=60),
        "runs": runs,
        "quick_text_run": text,
    }
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(text["stdout"])
    print(f"wrote {args.out}")
    measured = all(r["rc"] in (0, 1) and (r["report"] or {}).get("device_name") for r in runs)
    return 0 if measured else 1


if __name__ == "__main__":
    sys.exit(main())
