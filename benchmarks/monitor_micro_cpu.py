"""NoiseMonitor.micro()'s own CPU time, this machine: 420 trained tensors (LoRA on
SmolLM2-135M has 420), the gradients set by hand, no model. A Python-overhead measurement:
on a GPU the kernels are launched asynchronously; the GPU figure is noise_probe.py's bound on the monitor's own time
(its rule R3b).

``--monitor-file`` loads NoiseMonitor from another copy of monitor.py (e.g. the one before the
flat buffer: ``git show 1c2b512:src/leadline/noise/monitor.py > /tmp/monitor_before.py``), so
the two are timed by the same script. No pass/fail: a measurement for the docs.

    PYTHONPATH=src .venv/bin/python benchmarks/monitor_micro_cpu.py --out benchmarks/results/monitor_micro_cpu.json
    PYTHONPATH=src .venv/bin/python benchmarks/monitor_micro_cpu.py --monitor-file /tmp/monitor_before.py --out benchmarks/results/monitor_micro_cpu_without_buffer.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import timeit
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=int, default=16, help="numbers a tensor (16: the Python overhead alone)")
    ap.add_argument("--tensors", type=int, default=420)
    ap.add_argument("--monitor-file", default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch

    if args.monitor_file:
        spec = importlib.util.spec_from_file_location("monitor_alt", args.monitor_file)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["monitor_alt"] = mod  # dataclasses look their module up
        assert spec.loader is not None
        spec.loader.exec_module(mod)
        NoiseMonitor = mod.NoiseMonitor
    else:
        from leadline.lookahead.noise import NoiseMonitor

    torch.set_num_threads(1)
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.zeros(args.numel)) for _ in range(args.tensors)]
    hand = [torch.randn(args.numel) for _ in ps]

    def fresh() -> None:  # what backward leaves after zero_grad(set_to_none=True)
        for p, g in zip(ps, hand):
            p.grad = g.clone()

    fresh()
    mon = NoiseMonitor(ps, grad_accum=4)
    mon.micro(512)
    n = 500
    within = min(timeit.repeat(lambda: mon.micro(512), number=n, repeat=5)) / n
    mon.step()

    def first_after_none() -> float:
        mon.step()
        fresh()
        t0 = timeit.default_timer()
        mon.micro(512)
        return timeit.default_timer() - t0

    first = min(first_after_none() for _ in range(50))
    out = {"benchmark": "monitor_micro_cpu", "command": " ".join(sys.argv), "platform": platform.platform(),
           "python": sys.version.split()[0], "torch": torch.__version__, "monitor_file": args.monitor_file or "leadline.lookahead.noise.monitor",
           "tensors": args.tensors, "numel": args.numel,
           "micro_within_a_step_us": within * 1e6, "first_micro_after_set_to_none_us": first * 1e6}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"micro() within a step {within * 1e6:.0f} us; the first of a step after zero_grad(set_to_none=True) {first * 1e6:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
