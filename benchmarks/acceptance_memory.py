"""The memory ramp's acceptance on the card, case by case, from the committed memory_ramp results.

CPU only: reads ``benchmarks/results/memory_ramp/*.json`` and prints one markdown row per case
(mode, card, length) with, for each rule, the verdict of the newest file that judged it and that
file's name, and how far the watch saw the room shrink during the newest 300-step run (memory
outside the allocator growing after the ramp). The files of a case, oldest first: the ramp
against the corpus order longest first (``_longest_first*``), the ramp itself, its truth measured
again (``_truth_repeat``), the watch's cost side by side (``_watch_cost``: R4 read as paired steps
at one set of lengths, the order-balanced 2-se interval) and its re-reading
(``memory_ramp/watch_cost_rejudged.json``).

    python3 benchmarks/acceptance_memory.py --out benchmarks/results/acceptance_memory.md
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
RULES = ("R1", "R2", "R3", "R5")
ORDER = ("_longest_first", "", "_truth_repeat", "_watch_cost")


def rank(name: str) -> int:
    """A file's place among its case's files (see the module docstring), newest last."""
    for i, suffix in reversed(list(enumerate(ORDER))):
        if suffix and suffix in name:
            return i
    return ORDER.index("")


def r4_reading(case: dict[str, Any]) -> dict[str, Any] | None:
    """The order-balanced interval of a paired-steps R4, or None when the case holds another method."""
    oh = case.get("overhead") or {}
    bal = oh.get("balanced")
    if oh.get("method") != "paired steps" or not bal:
        return None
    return {"ratio": bal["ratio"], "low": bal["low"], "high": bal["high"], "verdict": bal["verdict"], "bound": oh.get("bound")}


def collect(results: Path) -> dict[tuple[str, float, int], dict[str, Any]]:
    cases: dict[tuple[str, float, int], dict[str, Any]] = {}
    files = sorted((results / "memory_ramp").glob("*.json"), key=lambda p: (rank(p.name), p.name))
    for f in files:
        data = json.loads(f.read_text())
        name = f"memory_ramp/{f.name}"
        if "cases" not in data:  # the re-reading of the watch-cost files
            continue
        for c in data["cases"]:
            if "_expandable" in f.name:
                key = (c["mode"] + " (expandable_segments)", c["card_gb"], c["seq"])
            else:
                key = (c["mode"], c["card_gb"], c["seq"])
            row = cases.setdefault(key, {})
            for rule in RULES:
                if c.get(rule):
                    row[rule] = (c[rule], name, c)
            if c.get("truth") and c["truth"].get("b_true") is not None:
                row["truth"] = (c["truth"]["b_true"], (c.get("ramp") or {}).get("micro_batch"), name)
            r4 = r4_reading(c)
            if r4 is not None and "_watch_cost" in f.name:
                row["R4"] = (r4, name)
            watch = (c.get("run") or {}).get("watch") or {}
            if watch.get("start_room_bytes") and watch.get("least_room_bytes"):
                row["room_lost"] = ((watch["start_room_bytes"] - watch["least_room_bytes"]) / 1e6, name)
            if c.get("R4b"):
                row["R4b"] = ((c.get("overhead") or {}).get("bound"), name)
    rejudged = results / "memory_ramp" / "watch_cost_rejudged.json"
    if rejudged.exists():
        for judged_name, judged in json.loads(rejudged.read_text())["judged"].items():
            m = re.match(r"(\w+?)_(\d+)gb_seq(\d+)_", judged_name)
            key = (m.group(1), float(m.group(2)), int(m.group(3))) if m else None
            if key in cases and "R4" not in cases[key] and judged:
                j = judged[0]
                cases[key]["R4"] = ({"ratio": j["ratio"], "low": j["low"], "high": j["high"], "verdict": j["verdict"]},
                                    f"memory_ramp/{rejudged.name}, re-reading {judged_name}")
    return cases


def table(cases: dict[tuple[str, float, int], dict[str, Any]]) -> str:
    head = ("| case | kept / truth | R1 | R2 (300 steps) | R3 (1 GB taken) | R4 (watch cost, order-balanced) "
            "| R4b (the watch's own time) | R5 (fit pre-flight) | room lost in R2's run (MB) |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for (mode, card, seq), row in sorted(cases.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        def cell(rule: str, row: dict[str, Any] = row) -> str:
            if rule not in row:
                return "not run"
            verdict, name, _ = row[rule]
            return f"{verdict} (`{name}`)"

        truth = row.get("truth")
        kept = f"{truth[1]} / {truth[0]} (`{truth[2]}`)" if truth else "no truth"
        if "R4" in row:
            r4, name = row["R4"]
            r4c = f"{r4['verdict']} {r4['ratio']:.3f} [{r4['low']:.3f}, {r4['high']:.3f}] (`{name}`)"
        else:
            r4c = "not run under the last rule"
        r4b = f"{row['R4b'][0]:.4f} (`{row['R4b'][1]}`)" if row.get("R4b") and row["R4b"][0] else "not run"
        lost = f"{row['room_lost'][0]:.1f} (`{row['room_lost'][1]}`)" if row.get("room_lost") else "no run"
        lines.append(f"| {mode}, {card:g} GB, {seq} | {kept} | {cell('R1')} | {cell('R2')} | {cell('R3')} | {r4c} | {r4b} | {cell('R5')} "
                     f"| {lost} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--out", default="", help="also write the table here")
    args = ap.parse_args()
    cases = collect(Path(args.results))
    text = (f"The memory ramp's acceptance from the committed results ({len(cases)} cases).\n"
            "Written by `python3 benchmarks/acceptance_memory.py --out benchmarks/results/acceptance_memory.md`.\n\n"
            + table(cases) + "\n")
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
