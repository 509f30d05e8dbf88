"""How much had the guard's rollbacks given back? Every recorded GPU run with a rollback, read
from its checks: the first rollback's check against the best check before it, as a share of the
fall from the start to that best, beside the run's passes over its rows and its test metric.

No model runs: the checks are the ones each run recorded in its ``run.json`` (kept in the
scoreboard's and the guarded run's result files). Only the first rollback of each run is read:
after it the run is another run, and no replay of the records can say what it would have done.

What it is for: a rule that rolls back only a worsening that gives back a large share of the
fall (say half) would spare the runs whose share is small; this lists which runs those are and how
each ended, so that the rule is judged on the boards, not on this table.

    python3 benchmarks/guard_replay.py --out benchmarks/results/guard_replay.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def first_rollback(checks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first rollback's step, its check's loss, the best before it, the start, and the share
    of the start-to-best fall the check gave back; None where the run rolled nothing back.

    Examples:
        >>> checks = [{"step": 0, "action": "start", "loss": 8.0}, {"step": 10, "action": "best", "loss": 0.4},
        ...           {"step": 20, "action": "keep", "loss": 0.45}, {"step": 30, "action": "rollback", "loss": 0.5}]
        >>> first_rollback(checks)["gave_back"]
        0.0132
        >>> first_rollback(checks[:3]) is None
        True
    """
    if not checks:
        return None
    start = best = float(checks[0]["loss"])
    for c in checks[1:]:
        if c["action"] == "rollback":
            fall = start - best
            return {"step": c["step"], "check": c["loss"], "best": best, "start": start,
                    "gave_back": round((c["loss"] - best) / fall, 4) if fall > 0 else None}
        if c["action"] == "best":
            best = float(c["loss"])
    return None


def _metric(unit: dict[str, Any]) -> float | None:
    v = unit.get("verdict") or {}
    return v.get(v.get("metric", "")) if isinstance(v, dict) else None


def replay(paths: list[Path]) -> list[dict[str, Any]]:
    """Each run with a rollback in the result files ``paths``: where it came from and what it gave back."""
    rows = []
    for path in paths:
        data = json.loads(path.read_text())
        for name, unit in sorted((data.get("units") or {}).items()):
            run = unit.get("run") if isinstance(unit, dict) else None
            got = first_rollback((run or {}).get("checks") or [])
            if got is None:
                continue
            rows.append({"file": path.name, "unit": name, "regime": data.get("regime") or "lora",
                         "passes": 3 if (data.get("regime") == "long") else 1, "steps": run.get("steps"),
                         "rollbacks": sum(1 for c in run["checks"] if c["action"] == "rollback"),
                         "metric": (unit.get("verdict") or {}).get("metric"), "value": _metric(unit), **got})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(RESULTS / "guard_replay.json"))
    ap.add_argument("--results", default=str(RESULTS), help="the folder of result files to read")
    args = ap.parse_args(argv)
    folder = Path(args.results)
    paths = sorted([*folder.glob("scoreboard_*.json"), *folder.glob("guarded_run_*.json")])
    rows = replay(paths)
    sys.path.insert(0, str(HERE))
    import scoreboard as sb

    out = {"benchmark": "guard_replay", "command": " ".join(["python3", "benchmarks/guard_replay.py", *(argv or [])]),
           "commit": sb._commit(), "machine": "none: read from the recorded checks", "files": [p.name for p in paths],
           "runs": rows}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for r in rows:
        print(f"{r['file']:48s} {r['unit']:22s} passes {r['passes']} step {r['step']:4d} gave back "
              f"{r['gave_back']:.1%} ({r['rollbacks']} rollbacks) {r['metric']} {r['value']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
