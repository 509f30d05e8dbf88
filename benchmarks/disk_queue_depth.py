"""`leadline disk` on a 2 GiB file, with the buffered arm beside it; JSON to --out.

What it runs: writes a file of --gib GiB of random bytes (fsynced) in --dir, checks that --dir
is on a disk (not tmpfs), runs ``python -m leadline disk FILE --buffered --json`` exactly as a
user would, deletes the file, and writes the machine, the command, the sweep and its table.

Decision rule, stated before it runs: the cache-bypassed sweep is the disk's number; the
buffered arm is shown only to say how far a buffered benchmark would overstate it. The
optimum is the fastest depth, "enough" the fewest readers within 5% of it, "collapsed" the
first depth past the optimum below 80% of it (leadline.measure.disk).

    .venv/bin/python benchmarks/disk_queue_depth.py --dir /tmp --out benchmarks/results/disk_devbox_2gib.json
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

from leadline.measure.disk import MEMORY_FILESYSTEMS, DepthRow, DiskSweep, filesystem_of  # noqa: E402
from leadline.measure.machine import describe_machine  # noqa: E402
from leadline.measure.virt import virtualisation  # noqa: E402


def _block_devices() -> list[dict[str, str]]:
    """What /sys says about each block device (model, rotational flag, queue limits)."""
    out = []
    for dev in sorted(Path("/sys/block").glob("*")) if Path("/sys/block").is_dir() else []:
        if dev.name.startswith(("loop", "ram", "zram")):
            continue
        info = {"name": dev.name}
        for key, rel in (("model", "device/model"), ("rotational", "queue/rotational"), ("max_sectors_kb", "queue/max_sectors_kb"), ("nr_requests", "queue/nr_requests"), ("scheduler", "queue/scheduler"), ("size_sectors", "size")):
            try:
                info[key] = (dev / rel).read_text().strip()
            except OSError:
                pass
        out.append(info)
    return out


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp", help="where to write the test file (must be on the disk to measure)")
    ap.add_argument("--gib", type=float, default=2.0, help="size of the test file in GiB")
    ap.add_argument("--rounds", type=int, default=5, help="passes over the depths (leadline disk --rounds)")
    ap.add_argument("--out", required=True, help="where to write the JSON")
    ap.add_argument("--context", default="", help="what else the machine was doing, recorded as said")
    args = ap.parse_args()

    folder = Path(args.dir)
    fs = filesystem_of(folder)
    if fs in MEMORY_FILESYSTEMS:
        print(f"{folder} is on {fs}, memory rather than a disk; pass --dir on a real disk", file=sys.stderr)
        return 2
    path = folder / f"leadline-disk-{os.getpid()}.bin"
    size = int(args.gib * 2**30)
    t0 = time.perf_counter()
    try:
        with open(path, "wb") as f:
            chunk = os.urandom(64 << 20)
            for _ in range(size // len(chunk)):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        write_s = time.perf_counter() - t0
        cmd = [sys.executable, "-m", "leadline", "disk", str(path), "--rounds", str(args.rounds), "--buffered", "--json"]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    finally:
        path.unlink(missing_ok=True)
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        return r.returncode
    sweep = json.loads(r.stdout)
    fields = {k: v for k, v in sweep.items() if k not in ("rows", "buffered_rows")}
    text = DiskSweep(rows=[DepthRow(**x) for x in sweep["rows"]], buffered_rows=[DepthRow(**x) for x in sweep["buffered_rows"]], **fields).text()
    result = {
        "benchmark": "disk_queue_depth",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": shlex.join(["python", *cmd[1:]]),
        "benchmark_command": shlex.join(["python", *sys.argv]),
        "file": {"bytes": size, "filesystem": fs, "dir": str(folder), "written_seconds": round(write_s, 3), "deleted": True},
        "machine": {**describe_machine(), "machine": platform.machine(), "block_devices": _block_devices(), "virtualisation": virtualisation().to_dict()},
        "leadline_commit": _git("rev-parse", "HEAD"),
        "leadline_tree_dirty": bool(_git("status", "--porcelain", "--", "src/leadline/measure", "src/leadline/cli")),
        "context": args.context,
        "note": "the file was written (and fsynced) just before the sweep, so its pages sat in the page cache: that is what the buffered arm read",
        "sweep": sweep,
        "text": text.splitlines(),
        "progress": r.stderr.splitlines(),
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
