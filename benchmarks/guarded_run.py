"""The guarded run's acceptance on a GPU: ``leadline run`` at its defaults against schedule-free
AdamW at its defaults, five seeds each, on the Debian sections at 4,000 training rows.

The task: debian_sections (``DATA/debian_sections_{train,test}.jsonl``), 4,000 training rows (the
scoreboard's seeded sample of the training file), each description cut to its first 256 tokens
(the model's tokenizer) and followed by ``"\\nSection:"``, the completion the section's name; judged
by accuracy on every test row (the scoreboard's :class:`Judge`: the label whose summed log-prob
after the prompt is highest), McNemar between two models. Every arm trains SmolLM2-135M-Instruct
with LoRA r16 (alpha 32, every linear layer) in float32, each run a process of its own:

  leadline_seed<k>        ``leadline run --model M --data train.jsonl --seed k --out DIR``: the
                          command's defaults (it holds out its decisions' rows, 10% at most 256,
                          and takes no test split); k = 0..4.
  schedulefree_seed<k>    ``schedulefree.AdamWScheduleFree`` at its package defaults (lr 0.0025, no
                          warmup), 16 rows a step, one pass over every training row, judged at its
                          averaged weights (``scoreboard.py --worker schedulefree --seed k``).
  leadline_alone_seed<k>  (``--alone-seeds``) leadline_seed<k> again, one process at a time with
                          nothing else on the GPU, after the side-by-side units.
  untrained               the model as loaded: what a run that keeps no adapter leaves the user.

``--parallel 4`` runs four of the side-by-side units at once on the one GPU. A leadline run that
exits 3 (its outcome ``no_better_than_start`` or ``collapsed``) is its own verdict, not a crash:
it is judged by the adapter it wrote, or, where it wrote none, as the untrained model.

Decision rules, written before any run:
  G1  no collapse: the scoreboard's rule C (one answer on over 60% of the test rows, on a task
      whose majority class is below 40%: net, 308 of 842 test rows) at no leadline seed.
  G2  no loss to schedule-free, decided on the seeds together (the scoreboard's rule P): per
      seed McNemar (leadline's seed k against schedule-free's seed k on every test row), pooled
      McNemar on the discordant rows of every seed; a loss when every seed's difference and the
      pooled one favour schedule-free with p < 0.05.
  G3  the same adapter alone and shared: for each seed of ``--alone-seeds``, the sha256 of
      ``adapter_model.safetensors`` written alone equals the one written beside the other
      processes on the same card (where neither run kept an adapter, their outcomes are the same);
      a seed whose two runs ran on different cards (a call that landed on another machine) is
      open, not passed: run it alone again on the shared run's card.
  G4  every leadline run's exit status and ``outcome`` recorded: status 0 with an outcome in its
      run.json, or 3 with an outcome of ``no_better_than_start`` or ``collapsed``.
The acceptance passes when G1-G4 hold with every unit finished; the JSON's ``decision`` says
which held, and why not.

One JSON (``--out``): the commit, the command, the machine, every unit, written as each unit
finishes and copied into ``$OUT`` when that is set. A call that stops at ``--stop-after`` seconds
(no unit starts after it) keeps what finished; the same command again skips it. On the device tool,
whose every call starts from a fresh copy of the working tree, copy the JSON that came back in
``$OUT`` over ``--out`` here before the next call, or the next call runs every unit again.

    PYTHONPATH=src python3 benchmarks/guarded_run.py --model /tmp/smol_hf --data-dir /root/assets/data \\
        --parallel 4 --alone-seeds 0,1 --stop-after 300
    (benchmarks/on_gpu.sh guarded-run; --smoke: two steps a run, for the harness's own check on the CPU)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "src"))

import scoreboard as sb  # noqa: E402  (benchmarks/ on the path first)

T0 = time.perf_counter()
RESULT = HERE / "results" / "guarded_run_debian_4000.json"
LABELS = ["games", "net", "science", "sound"]
RULES = {
    "G1": "no collapse (scoreboard rule C: one answer on over 60% of the test rows, majority class below 40%) at "
          "any leadline seed",
    "G2": "no loss to schedule-free at its defaults by rule P over the seeds (per seed McNemar, pooled McNemar on the "
          "seeds' discordant rows; a loss when every seed and the pool favour schedule-free with p < 0.05)",
    "G3": "for each seed run alone, adapter_model.safetensors has the same sha256 as the same seed's run beside "
          "other processes (where neither kept an adapter, the same outcome)",
    "G4": "every leadline run's exit status and outcome recorded: 0, or 3 with outcome no_better_than_start or "
          "collapsed",
}
ADAPTER = "adapter_model.safetensors"


def log(*a: Any) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s]", *a, flush=True)


def proc(args: list[str], log_path: Path, timeout: float) -> dict[str, Any]:
    """One process of a unit, its wall seconds from its start (the scoreboard's runner)."""
    return sb.proc(args, log_path, timeout)


def cut_prompt(text: str, tok: Any, tokens: int) -> str:
    """The description's first ``tokens`` tokens (the model's tokenizer), then the question."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return (tok.decode(ids[:tokens]) if len(ids) > tokens else text) + "\nSection:"


def build_task(data_dir: Path, tok: Any, train_rows: int, test_rows: int, tokens: int) -> dict[str, Any]:
    """The rows every arm trains on and every test row, as the scoreboard's task record (:func:`sb.load_task`'s
    sample), the descriptions cut to ``tokens`` tokens."""
    train = sb._take(sb.read_jsonl(data_dir / "debian_sections_train.jsonl"), train_rows)
    test = sb._take(sb.read_jsonl(data_dir / "debian_sections_test.jsonl"), test_rows)
    tr = [{"prompt": cut_prompt(r["text"], tok, tokens), "completion": " " + r["label"]} for r in train]
    te = [{"prompt": cut_prompt(r["text"], tok, tokens), "completion": " " + r["label"], "label": r["label"]}
          for r in test]
    return {"name": "debian_sections", "kind": "classify", "labels": LABELS, "train": tr, "test": te, "em": False}


def sha256(path: Path) -> str | None:
    """The file's sha256, or None where it is not there."""
    if not path.is_file():
        return None
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def seeds_of(text: str) -> list[int]:
    """``"0,1"`` as [0, 1]; ``""`` as [].

    Examples:
        >>> seeds_of("0,1"), seeds_of(""), seeds_of(" 3 , 4")
        ([0, 1], [], [3, 4])
    """
    return [int(x) for x in text.split(",") if x.strip()]


def units_of(seeds: Sequence[int], alone: Sequence[int]) -> tuple[list[str], list[str]]:
    """The side-by-side units (leadline's and schedule-free's at each seed, interleaved so that a
    cut call leaves pairs) and the units run alone after them.

    Examples:
        >>> units_of([0, 1], [0])
        (['leadline_seed0', 'schedulefree_seed0', 'leadline_seed1', 'schedulefree_seed1'], ['leadline_alone_seed0'])
    """
    shared = [f"{arm}_seed{k}" for k in seeds for arm in ("leadline", "schedulefree")]
    return shared, [f"leadline_alone_seed{k}" for k in alone]


def by_seed(units: dict[str, Any], arm: str) -> dict[int, dict[str, Any]]:
    """``arm``'s judged units by seed (``<arm>_seed<k>``), failed ones left out."""
    out = {}
    for name, rec in units.items():
        if name.startswith(arm + "_seed") and name[len(arm) + 5:].isdigit() and not rec.get("failed") and rec.get("verdict"):
            out[int(name[len(arm) + 5:])] = rec
    return dict(sorted(out.items()))


def decide(data: dict[str, Any], seeds: Sequence[int], alone: Sequence[int]) -> dict[str, Any]:
    """Rules G1-G4 on the recorded units: each rule's outcome (True, False, or None where a unit
    it reads has not finished) and why, and ``passed`` (every rule True).

    Examples:
        >>> v = lambda preds: {"metric": "accuracy", "predictions": preds, "top_answer_share": 0.5}
        >>> lead = {"exit_status": 0, "outcome": "improved", "verdict": v(["a", "b"]), "adapter_sha256": "x"}
        >>> data = {"gold": ["a", "b", "c", "d"], "units": {"leadline_seed0": lead, "leadline_alone_seed0": lead,
        ...         "schedulefree_seed0": {"verdict": v(["a", "c"])}}}
        >>> d = decide(data, [0], [0])
        >>> d["G1"]["holds"], d["G2"]["holds"], d["G3"]["holds"], d["G4"]["holds"], d["passed"]
        (True, True, True, True, True)
        >>> data["units"]["leadline_alone_seed0"] = {**lead, "adapter_sha256": "y"}
        >>> decide(data, [0], [0])["G3"]["holds"], decide(data, [0, 1], [0])["passed"]
        (False, False)
    """
    units, gold = data.get("units") or {}, data.get("gold") or []
    lead, sf = by_seed(units, "leadline"), by_seed(units, "schedulefree")
    whole = all(k in lead for k in seeds) and all(k in sf for k in seeds)
    out: dict[str, Any] = {}
    fell = [k for k, u in lead.items() if sb.collapsed(data, u["verdict"])]
    out["G1"] = {"holds": False if fell else (True if whole else None),
                 "why": f"collapse at seed {', '.join(map(str, fell))}" if fell else
                 "no collapse at any seed" + ("" if whole else " so far")}
    c = sb.compare_seeds("classify", lead, sf, gold)
    if c is None:
        out["G2"] = {"holds": None, "why": "no seed has both arms judged yet"}
    else:
        lost = c["word"] == "loss"
        out["G2"] = {"holds": False if lost else (True if whole else None), "word": c["word"], "pooled_p": c["p"],
                     "diff": c["diff"], "seeds": dict(zip(c["seed_ids"], c["seeds"])),
                     "why": f"leadline against schedule-free: {sb.seeds_cell(c)}"}
    same, missing = [], []
    for k in alone:
        a, s = units.get(f"leadline_alone_seed{k}"), lead.get(k) or units.get(f"leadline_seed{k}")
        if not a or not s or a.get("failed") or s.get("failed"):
            missing.append(k)
            continue
        if a.get("device") != s.get("device"):  # another card computes other bits: not this rule's question
            missing.append(k)
            continue
        ha, hs = a.get("adapter_sha256"), s.get("adapter_sha256")
        same.append((k, ha == hs if (ha or hs) else a.get("outcome") == s.get("outcome")))
    differ = [k for k, ok in same if not ok]
    out["G3"] = {"holds": False if differ else (None if missing else True), "identical": dict(same),
                 "why": (f"the adapter differs alone at seed {', '.join(map(str, differ))}" if differ else
                         f"not yet run alone on the shared run's card: seed {', '.join(map(str, missing))}"
                         if missing else
                         "identical alone and shared at every seed run alone")}
    runs = {n: u for n, u in units.items() if n.startswith("leadline_")}
    bad = [n for n, u in runs.items() if not (u.get("exit_status") == 0 or (
        u.get("exit_status") == 3 and u.get("outcome") in sb.GUARDED_OUTCOMES))]
    unrecorded = [n for n, u in runs.items() if n not in bad and u.get("outcome") not in ("improved", *sb.GUARDED_OUTCOMES)]
    every = all(f"leadline_seed{k}" in units for k in seeds) and all(f"leadline_alone_seed{k}" in units for k in alone)
    out["G4"] = {"holds": False if bad or unrecorded else (True if every else None),
                 "exits": {n: [u.get("exit_status"), u.get("outcome")] for n, u in runs.items()},
                 "why": (f"unexpected exit: {', '.join(bad)}" if bad else
                         f"no outcome in run.json: {', '.join(unrecorded)}" if unrecorded else
                         "every exit 0 or 3, each with its outcome")}
    out["passed"] = all(out[g]["holds"] is True for g in ("G1", "G2", "G3", "G4"))
    return out


class Result:
    """The acceptance's JSON: every finished unit written at once (and into ``$OUT``)."""

    def __init__(self, path: Path, argv: list[str], meta: dict[str, Any]) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        self.data.setdefault("units", {})
        self.data.update({"benchmark": "guarded_run", "rules": RULES, **meta,
                          "command": " ".join(["python3", "benchmarks/guarded_run.py", *argv]),
                          "commit": sb._commit(), "machine": sb._machine()})
        self.data.setdefault("invocations", []).append({k: self.data[k] for k in ("command", "commit", "machine")})

    def has(self, unit: str) -> bool:
        u = self.data["units"].get(unit)
        return bool(u) and not u.get("failed")

    def put(self, unit: str, rec: dict[str, Any]) -> None:
        with self.lock:
            self.data["units"][unit] = rec
            self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)
        if os.environ.get("OUT"):
            copy = Path(os.environ["OUT"]) / self.path.name
            copy.parent.mkdir(parents=True, exist_ok=True)
            if copy.resolve() != self.path.resolve():
                shutil.copyfile(self.path, copy)


class Units:
    """The units' runs: each its own process, judged one at a time by the one :class:`sb.Judge`."""

    def __init__(self, args: argparse.Namespace, task: dict[str, Any], result: Result, judge: Any) -> None:
        self.args, self.task, self.result, self.judge = args, task, result, judge
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.train = self.work / "train.jsonl"
        self.train.write_text("".join(json.dumps({"prompt": r["prompt"], "completion": r["completion"]}) + "\n"
                                      for r in task["train"]))
        self.judge_lock = threading.Lock()

    def verdict(self, adapter: Path | None) -> dict[str, Any]:
        with self.judge_lock:
            return self.judge.verdict(adapter)

    def untrained(self) -> None:
        if not self.result.has("untrained"):
            self.result.put("untrained", {"verdict": self.verdict(None)})

    def leadline(self, unit: str, seed: int, alone: bool) -> None:
        run_dir = self.work / f"run_{unit}"
        sb._rm(run_dir)
        steps = ["--steps", "2"] if self.args.smoke else []
        t = proc(["-m", "leadline", "run", "--model", self.args.model, "--data", str(self.train), "--seed", str(seed),
                  *steps, "--out", str(run_dir)], self.work / f"{unit}.log", self.args.timeout)
        run = sb.run_json(run_dir)
        rec: dict[str, Any] = {"arm": "leadline", "seed": seed, "timed_alone": alone, "wall_seconds": t["seconds"],
                               "device": self.result.data["machine"].get("device"),
                               "process": t, "run": run, **sb.leadline_exit(t["rc"], run),
                               "train_rows": (run or {}).get("train_rows"), **sb.unseen_fields(run),
                               "adapter_sha256": sha256(run_dir / ADAPTER)}
        kept = (run_dir / "adapter_config.json").exists()
        if (t["rc"] == 0 or rec["guarded_exit"]) and kept:
            rec["verdict"] = self.verdict(run_dir)
        elif rec["guarded_exit"]:
            rec["verdict"], rec["judged_as"] = self.verdict(None), "untrained"
        else:
            rec["failed"] = True
        self.done(unit, rec)

    def schedulefree(self, unit: str, seed: int) -> None:
        run_dir = self.work / f"run_{unit}"
        sb._rm(run_dir)
        t = proc([str(HERE / "scoreboard.py"), "--worker", "schedulefree", "--model", self.args.model,
                  "--train", str(self.train), "--seed", str(seed), "--worker-out", str(run_dir),
                  *(["--smoke"] if self.args.smoke else [])], self.work / f"{unit}.log", self.args.timeout)
        run = sb.run_json(run_dir)
        rec: dict[str, Any] = {"arm": "schedulefree", "seed": seed, "timed_alone": False, "wall_seconds": t["seconds"],
                               "process": t, "run": run, "train_rows": (run or {}).get("train_rows")}
        if t["rc"] == 0 and (run_dir / "adapter_config.json").exists():
            rec["verdict"] = self.verdict(run_dir)
        else:
            rec["failed"] = True
        self.done(unit, rec)

    def done(self, unit: str, rec: dict[str, Any]) -> None:
        v = rec.get("verdict") or {}
        log(unit, "FAILED" if rec.get("failed") else f"accuracy {v.get('accuracy', float('nan')):.4f}",
            f"exit {rec.get('exit_status', rec['process']['rc'])}", rec.get("outcome") or "")
        self.result.put(unit, rec)

    def run(self, unit: str, alone: bool = False) -> None:
        if self.result.has(unit):
            return
        if time.perf_counter() - T0 > self.args.stop_after:
            log(unit, "not started: --stop-after reached; the same command goes on")
            return
        seed = int(unit.rsplit("_seed", 1)[1])
        try:
            if unit.startswith("schedulefree"):
                self.schedulefree(unit, seed)
            else:
                self.leadline(unit, seed, alone)
        except Exception:  # recorded; the other units still run
            self.result.put(unit, {"failed": True, "traceback": traceback.format_exc()})
            log(unit, "raised; recorded")


def run_all(units: Units, shared: list[str], alone: list[str], parallel: int,
            pool: Callable[[int], Any] = ThreadPoolExecutor) -> None:
    """The side-by-side units ``parallel`` at a time, then the alone units one at a time."""
    if parallel > 1:
        with pool(parallel) as ex:
            list(ex.map(units.run, shared))
    else:
        for unit in shared:
            units.run(unit)
    for unit in alone:
        units.run(unit, alone=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="/tmp/smol_hf")
    ap.add_argument("--data-dir", default="/root/assets/data")
    ap.add_argument("--out", default=str(RESULT))
    ap.add_argument("--work", default="/tmp/guarded_run")
    ap.add_argument("--seeds", default="0,1,2,3,4", help="the seeds each arm runs at (default 0,1,2,3,4)")
    ap.add_argument("--alone-seeds", default="", help="leadline's seeds run again alone after the others, e.g. 0,1")
    ap.add_argument("--parallel", type=int, default=4, help="side-by-side units at once on the GPU (default 4)")
    ap.add_argument("--train-rows", type=int, default=4000)
    ap.add_argument("--test-rows", type=int, default=0, help="test rows (0: every one)")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=900, help="seconds a unit's process may run")
    ap.add_argument("--stop-after", type=float, default=1e9, help="start no unit after this many seconds")
    ap.add_argument("--smoke", action="store_true", help="two steps a run: the harness's own check on the CPU")
    args = ap.parse_args(argv)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    from leadline.hf import load_tokenizer

    seeds, alone = seeds_of(args.seeds), seeds_of(args.alone_seeds)
    task = build_task(Path(args.data_dir), load_tokenizer(args.model), args.train_rows, args.test_rows,
                      args.prompt_tokens)
    meta = {"task": "debian_sections", "train_rows": len(task["train"]), "test_rows": len(task["test"]),
            "prompt_tokens": args.prompt_tokens, "lora_rank": 16, "dtype": sb.ARM_DTYPE, "smoke": args.smoke,
            "gold": [r["label"] for r in task["test"]]}
    result = Result(Path(args.out), argv, meta)
    result.save()
    units = Units(args, task, result, sb.Judge(args.model, task, 0))
    units.untrained()
    shared, alone_units = units_of(seeds, alone)
    run_all(units, shared, alone_units, args.parallel)
    result.data["decision"] = decide(result.data, seeds, alone)
    with result.lock:
        result.save()
    d = result.data["decision"]
    for g in ("G1", "G2", "G3", "G4"):
        log(g, {True: "holds", False: "FAILS", None: "open"}[d[g]["holds"]], "-", d[g]["why"])
    log("passed" if d["passed"] else "not passed", "; wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
