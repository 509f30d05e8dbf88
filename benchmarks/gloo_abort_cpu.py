"""Can one rank end another rank's pending gloo collective? (CPU, 2 processes; why the stop
line's other ranks leave at the group's timeout on gloo: src/leadline/lookahead/distributed/stopline.py.)

Rank 0 enters an all_reduce that rank 1 never joins; 1 s later rank 1 does one of the arms, then
sleeps ``--hold`` seconds before it exits. Arms: ``abort_pg`` (``_abort_process_group()``, the
stop line's abort), ``shutdown`` (``ProcessGroup.shutdown()``), ``backend_abort`` (the gloo
backend's ``abort()``), ``nothing``; each with rank 1 holding a reference to the group (as FSDP
or a device mesh does: ``held``) and without. The group's timeout is ``--timeout`` seconds.
Rule, written before the run: an arm ends the pending collective when rank 0 raises within 2 s
of it (rank 0's seconds < 1 + 2); an arm that does not leaves rank 0 waiting until rank 1's
exit (1 + ``--hold``) or the timeout, whichever comes first.

    PYTHONPATH=src .venv/bin/python benchmarks/gloo_abort_cpu.py --out benchmarks/results/gloo_abort_cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import sys
import tempfile
import time
from pathlib import Path


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _worker(rank: int, port: int, arm: str, held: bool, hold: float, timeout: float, out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=timeout))
    ref = dist.group.WORLD if held else None
    if rank == 0:
        t0 = time.perf_counter()
        try:
            dist.all_reduce(torch.ones(4))
            res = {"raised": None}
        except Exception as e:
            res = {"raised": type(e).__name__, "message": str(e).splitlines()[0][:160]}
        res["seconds"] = time.perf_counter() - t0
        Path(out).write_text(json.dumps(res))
    else:
        time.sleep(1.0)
        group = ref if ref is not None else dist.group.WORLD
        if arm == "abort_pg":
            dist.distributed_c10d._abort_process_group()
        elif arm == "shutdown":
            group.shutdown()
        elif arm == "backend_abort":
            group._get_backend(torch.device("cpu")).abort()
        del group
        time.sleep(hold)
    os._exit(0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--hold", type=float, default=6.0, help="seconds rank 1 lives after its arm")
    ap.add_argument("--timeout", type=float, default=20.0, help="the group's timeout, seconds")
    args = ap.parse_args()
    import torch
    import torch.multiprocessing as mp

    results = []
    for arm in ("nothing", "abort_pg", "shutdown", "backend_abort"):
        for held in (False, True):
            with tempfile.TemporaryDirectory() as d:
                f = str(Path(d) / "rank0.json")
                mp.start_processes(_worker, args=(_free_port(), arm, held, args.hold, args.timeout, f), nprocs=2,
                                   start_method="spawn")
                r = json.loads(Path(f).read_text())
            r.update(arm=arm, held=held, ends_the_collective=r["seconds"] < 3.0)
            results.append(r)
            print(f"{arm:14s} held={held!s:5s} rank 0 raised after {r['seconds']:.2f} s: {r.get('message', r['raised'])}", flush=True)
    out = {"benchmark": "gloo_abort_cpu", "command": sys.argv,
           "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count()},
           "versions": {"torch": torch.__version__}, "hold_seconds": args.hold, "timeout_seconds": args.timeout,
           "arms": results}
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
