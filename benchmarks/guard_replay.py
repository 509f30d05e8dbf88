"""How much had the guard's rollbacks given back? Every recorded GPU run with a rollback, read
from its checks: the first rollback's check against the best check before it, as a share of the
fall from the start to that best, beside the run's passes over its rows and its test metric.

No model runs: the checks are the ones each run recorded in its ``run.json`` (kept in the
scoreboard's and the guarded run's result files). Only the first rollback of each run is read:
after it the run is another run, and no replay of the records can say what it would have done.

What it is for: the guard rolls back a significant worsening only where it gave back at least
:data:`leadline.rate.guard.GIVE_BACK` of the fall (or read no better than the start); each row says
what that rule does with the recorded rollback (``under_the_rule``), and a run recorded under the
rule shows it never rolled back less (``acceptance``: no rollback of a run under the rule whose
check gave back less than the share and read below the start).

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


def under_the_rule(got: dict[str, Any], share: float) -> str:
    """What the guard's rule 3 does with a recorded rollback: ``rolls back`` where the check gave back
    at least ``share`` of the fall or read no better than the start, else ``kept``.

    Examples:
        >>> under_the_rule({"gave_back": 0.012, "check": 0.45, "start": 8.6}, 0.05)
        'kept'
        >>> under_the_rule({"gave_back": 0.08, "check": 2.7, "start": 5.3}, 0.05)
        'rolls back'
        >>> under_the_rule({"gave_back": None, "check": 9.0, "start": 8.6}, 0.05)
        'rolls back'
    """
    if got["gave_back"] is None or not got["check"] < got["start"] or got["gave_back"] >= share:
        return "rolls back"
    return "kept"


def _metric(unit: dict[str, Any]) -> float | None:
    v = unit.get("verdict") or {}
    return v.get(v.get("metric", "")) if isinstance(v, dict) else None


def replay(paths: list[Path], share: float = 0.05) -> list[dict[str, Any]]:
    """Each run with a rollback in the result files ``paths``: where it came from, what it gave back,
    what the guard's rule at ``share`` does with it, and whether the run was recorded under that rule
    (its checks record ``gave_back``)."""
    rows = []
    for path in paths:
        data = json.loads(path.read_text())
        for name, unit in sorted((data.get("units") or {}).items()):
            run = unit.get("run") if isinstance(unit, dict) else None
            got = first_rollback((run or {}).get("checks") or [])
            if got is None:
                continue
            passes = run.get("passes") or (3 if data.get("regime") == "long" else 1)
            under = any("gave_back" in (c.get("versus_best") or {}) for c in run["checks"])
            rows.append({"file": path.name, "unit": name, "regime": data.get("regime") or "lora",
                         "passes": passes, "steps": run.get("steps"), "recorded_under_the_rule": under,
                         "under_the_rule": under_the_rule(got, share),
                         "rollbacks": sum(1 for c in run["checks"] if c["action"] == "rollback"),
                         "metric": (unit.get("verdict") or {}).get("metric"), "value": _metric(unit), **got})
    return rows


def runs_under_the_rule(paths: list[Path]) -> dict[str, int]:
    """Every recorded run whose checks record ``gave_back`` (run under the give-back rule), by its
    passes, and how many of them rolled back: the denominator of the acceptance."""
    counted = {"one_pass": 0, "one_pass_rolled_back": 0, "several_passes": 0, "several_passes_rolled_back": 0}
    for path in paths:
        data = json.loads(path.read_text())
        for unit in (data.get("units") or {}).values():
            run = unit.get("run") if isinstance(unit, dict) else None
            checks = (run or {}).get("checks") or []
            if not any("gave_back" in (c.get("versus_best") or {}) for c in checks):
                continue
            passes = run.get("passes") or (3 if data.get("regime") == "long" else 1)
            key = "one_pass" if passes == 1 else "several_passes"
            counted[key] += 1
            counted[key + "_rolled_back"] += any(c["action"] == "rollback" for c in checks)
    return counted


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(RESULTS / "guard_replay.json"))
    ap.add_argument("--results", default=str(RESULTS), help="the folder of result files to read")
    args = ap.parse_args(argv)
    folder = Path(args.results)
    paths = sorted([*folder.glob("scoreboard_*.json"), *folder.glob("guarded_run_*.json")])
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent / "src"))
    import scoreboard as sb
    from leadline.rate.guard import GIVE_BACK

    rows = replay(paths, GIVE_BACK)
    wrong = [r for r in rows if r["recorded_under_the_rule"] and r["under_the_rule"] == "kept"]

    out = {"benchmark": "guard_replay", "command": " ".join(["python3", "benchmarks/guard_replay.py", *(argv or [])]),
           "commit": sb._commit(), "machine": "none: read from the recorded checks", "files": [p.name for p in paths],
           "give_back": GIVE_BACK, "runs": rows,
           "acceptance": {"runs_under_the_rule": runs_under_the_rule(paths),
                          "rolled_back_below_the_share": [f"{r['file']}:{r['unit']}" for r in wrong]}}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for r in rows:
        print(f"{r['file']:48s} {r['unit']:22s} passes {r['passes']} step {r['step']:4d} gave back "
              f"{r['gave_back'] if r['gave_back'] is not None else float('inf'):.1%} ({r['rollbacks']} rollbacks) "
              f"{r['metric']} {r['value']}; under the rule: {r['under_the_rule']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
