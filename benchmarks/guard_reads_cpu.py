"""The guard's reads against the steps' time on the CPU, in the demo's run (``make demo``'s leadline arm).

Why: the guard promises that its checks' reads cost at most ``READ_SHARE`` (5%) of the run's step
time, and sizes them by a count that reads no clock (:func:`leadline.rate.guard.check_plan`: a
training step is ``STEP_READS`` forwards of its rows). ``make demo`` on two CPU
cores stated 11.5%.
This benchmark measures the two things the count rests on, on the demo's model and rows:

1. **The parts** (``parts``): one training step of the run's micro-batch (forward, backward and
   schedule-free AdamW's step, as the run's loop takes it) against one check's read of the check's
   held-out rows at the averaged weights (:func:`leadline.rate.watch.read_averaged`, as
   :class:`leadline.rate.watch.Watch` reads them), taken in turn ``--reps`` times after ``--warm``
   untimed steps; the first read (before any step) is timed apart. ``forwards_per_step``: a
   step's seconds a row over a read's seconds a row, the measured counterpart of ``STEP_READS``.
2. **The run** (``run``): the demo's leadline arm (``run_in_one`` with ``leadline run``'s
   defaults, the demo's CPU cut of its rows); from its ``run.json`` seconds, the reads' share
   ``check_seconds / steps_seconds`` (what the plan's ``guard`` value states as its share of the
   steps' time: the scheduled checks' and the passes' end checks' reads with the copies they keep,
   the start's read and the verdict's outside it), beside the share the count predicts (the rows
   the checks read over ``STEP_READS`` x the rows the steps trained) and each read's seconds.

Other processes on the machine slow steps and reads unevenly (two threads wait for each other);
the load average before and after each part is recorded beside its figures.

Decision rule, written before the run: the budget HOLDS when the run's measured share is at most
``READ_SHARE``; it is PASSED otherwise. ``forwards_per_step`` is reported, not judged.

    PYTHONPATH=src .venv/bin/python benchmarks/guard_reads_cpu.py \\
        --out benchmarks/results/guard_reads_cpu/rows_by_budget.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from gguf_cache_load import tree_commit  # benchmarks/ is the script's own folder on sys.path

ROOT = Path(__file__).resolve().parent.parent


def pick_threads(threads: int | None) -> dict[str, Any]:
    """torch's threads: ``threads``, else as ``leadline demo`` picks them (whichever of torch's default
    and one runs the demo model's matrix product faster, measured now: on a busy machine torch's
    threads wait for each other)."""
    import torch

    from leadline.cli.demo import thread_rates

    rates = thread_rates(torch.get_num_threads()) if threads is None else {}
    torch.set_num_threads(threads if threads is not None else max(rates, key=lambda n: rates[n]))
    return {"threads": torch.get_num_threads(), "products_a_second": rates}


def load_demo_model() -> tuple[Any, Any]:
    """The demo's model as ``leadline demo`` loads it on the CPU: the bundled GGUF in float32, LoRA r16."""
    import torch
    from peft import LoraConfig, get_peft_model

    from leadline.hf.loading import default_model_path, load_model, load_tokenizer, locate_model

    source = locate_model(default_model_path(), say=lambda text: print(text, flush=True))
    tok = load_tokenizer(source)
    model = load_model(source, device="cpu", dtype=torch.float32)
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0,
                                             task_type="CAUSAL_LM"))
    return model, tok


def demo_rows(folder: Path) -> Path:
    """The demo's training rows on the CPU (its cut), written where ``run_in_one`` reads them."""
    from leadline.cli.demo import CPU_CUT, DemoRows

    data = resources.files("leadline") / "data"

    def read(name: str) -> list[dict[str, str]]:
        return [json.loads(s) for s in (data / name).read_text().splitlines() if s.strip()]

    train, _ = DemoRows(read("debian_sections_demo_train.jsonl"), read("debian_sections_demo_test.jsonl"),
                        CPU_CUT).taken()
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in train), encoding="utf-8")
    return path


def measure_parts(model: Any, tok: Any, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    """A step of the run's micro-batch against a read of a check's rows, in turn (the module docstring)."""
    import torch

    from leadline.corpus.losses import row_losses
    from leadline.rate.guard import STEP_READS, check_plan
    from leadline.rate.watch import StateCopy, read_averaged
    from leadline.run.job import prepare_job
    from leadline.run.opening import optimizer
    from leadline.run.options import RunOptions

    load_before = os.getloadavg()
    job = prepare_job(model, tok, str(data), RunOptions(seed=0))
    task = job.task
    planned_rows, checks = check_plan(len(task.split.held_out), job.rows_per_step, job.steps)
    rows = args.read_rows or planned_rows
    subset = [task.rows[i] for i in task.split.held_out[:rows]]
    start = [p.detach().clone() for p in job.params]
    opt = optimizer(job.params, 0.0025, 1)
    train_step = task.train_step_of(job.rows_per_step, 1)

    def step(s: int) -> float:
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        train_step(s)
        opt.step()
        return time.perf_counter() - t

    spare = StateCopy.take(job.params, opt)

    def read() -> float:
        t = time.perf_counter()
        read_averaged(opt, model, job.params, lambda: row_losses(model, subset, None, task.device, pad_id=task.pad_id),
                      lambda: spare)
        return time.perf_counter() - t

    try:
        model.train()
        opt.train()
        first_read = read()
        for s in range(args.warm):
            step(s)
        steps, reads = [], []
        for r in range(args.reps):
            steps.append(step(args.warm + r))
            reads.append(read())
    finally:
        with torch.no_grad():
            for p, s0 in zip(job.params, start):
                p.copy_(s0)
    step_s, read_s = statistics.median(steps), statistics.median(reads)
    lengths = [len(r.input_ids) for r in subset]
    trained = [len(task.rows[i].input_ids) for i in task.split.train]
    per_row_step, per_row_read = step_s / job.rows_per_step, read_s / rows
    return {"trained_as": job.trained_as, "rows_per_step": job.rows_per_step, "read_rows": rows,
            "planned": {"rows": planned_rows, "checks": checks}, "load_average": [load_before, os.getloadavg()],
            "held_out_rows": len(task.split.held_out), "run_steps": job.steps,
            "mean_tokens": {"read_rows": statistics.mean(lengths), "training_rows": statistics.mean(trained)},
            "step_seconds": steps, "read_seconds": reads, "first_read_seconds": first_read,
            "step_seconds_median": step_s, "read_seconds_median": read_s,
            "forwards_per_step": per_row_step / per_row_read, "step_reads_counted": STEP_READS,
            "first_read_over_median": first_read / read_s}


@contextmanager
def timed_row_losses(calls: list[dict[str, float]]) -> Iterator[None]:
    """The run's reader of the checks' rows timed, each call's rows and seconds appended; put back after."""
    import leadline.run.end as end

    real = end.row_losses

    def timed(model: Any, rows: Any, *a: Any, **k: Any) -> list[float]:
        t = time.perf_counter()
        try:
            return real(model, rows, *a, **k)
        finally:
            calls.append({"rows": len(rows), "seconds": time.perf_counter() - t})

    end.row_losses = timed
    try:
        yield
    finally:
        end.row_losses = real


def measure_run(model: Any, tok: Any, data: Path, out: Path) -> dict[str, Any]:
    """The demo's leadline arm, and the reads' share of its steps' time (the module docstring)."""
    from leadline.rate.guard import READ_SHARE, STEP_READS
    from leadline.run import RunOptions, run_in_one
    from leadline.run.task import trained_as_of

    calls: list[dict[str, float]] = []
    load_before = os.getloadavg()
    t = time.perf_counter()
    with timed_row_losses(calls):
        plan, res = run_in_one(model, tok, str(data), RunOptions(seed=0), out_dir=out)
    seconds = dict(res.seconds)
    guard = plan["guard"]
    share = seconds["check_seconds"] / seconds["steps_seconds"]
    check_reads = res.cost.check_reads - 1  # the count includes the start's read, taken before the steps
    read_rows = sum(int(c["rows"]) for c in calls[:check_reads])
    trained_rows = res.steps * res.micro_batch * res.grad_accum
    trained_as = trained_as_of(model)
    return {"trained_as": trained_as, "load_average": [load_before, os.getloadavg()],
            "steps": res.steps, "rows_per_step": res.micro_batch * res.grad_accum, "check_rows": res.cost.check_rows,
            "held_out_before_rows": res.held_out_before.rows, "train_rows": res.train_rows,
            "checks": [{k: c.get(k) for k in ("step", "action", "why")} for c in res.checks],
            "seconds": seconds, "wall_seconds": time.perf_counter() - t,
            "check_reads": check_reads, "reads": calls,
            "read_seconds_in_checks": sum(c["seconds"] for c in calls[:check_reads]),
            "share_measured": share, "share_counted": read_rows / (STEP_READS * trained_rows),
            "share_stated": guard.source, "budget": READ_SHARE,
            "verdict": "HOLDS" if share <= READ_SHARE else "PASSED"}


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=None, help="torch's threads (default: as the demo picks them)")
    ap.add_argument("--reps", type=int, default=8, help="steps and reads timed in turn")
    ap.add_argument("--warm", type=int, default=2, help="untimed steps before them")
    ap.add_argument("--read-rows", type=int, default=None, help="rows a timed read reads (default: the plan's)")
    ap.add_argument("--skip-parts", action="store_true")
    args = ap.parse_args()
    threads = pick_threads(args.threads)
    t = time.perf_counter()
    model, tok = load_demo_model()
    report: dict[str, Any] = {
        "benchmark": "guard_reads_cpu", "command": sys.argv, "commit": tree_commit(),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "torch": torch.__version__, **threads},
        "load_seconds": time.perf_counter() - t}
    with tempfile.TemporaryDirectory() as tmp:
        data = demo_rows(Path(tmp))
        if not args.skip_parts:
            report["parts"] = p = measure_parts(model, tok, data, args)
            print(f"parts: step {p['step_seconds_median']:.3f} s ({p['rows_per_step']} rows), read "
                  f"{p['read_seconds_median']:.3f} s ({p['read_rows']} rows): {p['forwards_per_step']:.2f} reads a "
                  f"step's row; first read {p['first_read_over_median']:.2f}x", flush=True)
        report["run"] = r = measure_run(model, tok, data, Path(tmp) / "run")
    print(f"run: {r['steps']} steps, {r['check_reads']} check reads of {r['check_rows']} rows: "
          f"{r['share_measured']:.2%} of the steps' time measured, {r['share_counted']:.2%} counted "
          f"(budget {r['budget']:.0%}: {r['verdict']})", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
