"""The scoreboard: leadline against the searches it replaces, side by side, task by task.

"Should I run leadline, or sweep, or just use 2e-4?" Every arm trains SmolLM2-135M-Instruct
with LoRA r16 (alpha 32, every linear layer) on the same training rows given, seed 0 (``--seed``),
and is judged on the same test rows, which no arm trains or decides on.

Each arm trains as its users run it. Every comparison arm (the recipe, schedule-free at its
defaults and at AlgoPerf's settings, Prodigy, lr_find's range test and its run, the A/A control)
trains on every row given; a search (the sweep, Optuna) keeps 10% of the rows (seeded) to read each
run's loss and pick by, as a user's search must, and each of its runs trains on the other 90%;
leadline's arms pay their own split (``leadline run`` holds out 10% of the rows, at most 256, for
its decisions and takes no test split). Each unit records the rows it trained on (``train_rows``;
a unit from before the record: "leadline's split") and its ``seed``.

Tasks (``--task``):
  debian_sections  4-class topic of a Debian package from its description; accuracy by the
                   summed log-prob of each label after the prompt; McNemar.
  man_sections     4-class manual section (1 commands, 2 system calls, 3 library functions,
                   8 administration) from a man page's one-line description
                   (benchmarks/data/README.md); accuracy as above; McNemar.
  gsm_symbolic     a worked solution to a grade-school word problem; test cross-entropy per
                   completion token (paired t over rows) and exact match of the number after
                   ``####`` in a greedy generation (McNemar; for the sweep and optuna, of
                   the unit the search picks only).
  debian_summary   a package's one-line summary written from its long description
                   (benchmarks/data/README.md); test cross-entropy per token (paired t).
  py_modules       18-class standard-library module (asyncio, email, turtle, xml, ...) of a
                   CPython 3.11 function from its name and docstring, module names masked
                   (benchmarks/data/README.md); accuracy as above; McNemar.
  code_trace       the return value of a generated Python function of two arguments (two or
                   three assignments and a return), worked line by line and ending ``#### <value>``
                   (benchmarks/data/README.md); test cross-entropy per completion token (paired t)
                   and exact match as for gsm_symbolic.

Arms (``--arms``), each the way its users run it; an arm's cost is the wall seconds of its own
processes (model loading included, the same for every arm), deciding and training:
  recipe           AdamW 2e-4 (no weight decay), 16 rows a step, 3% warmup from 0, linear decay
                   to zero, one pass over every row given (``--worker recipe``: a process of its
                   own, leadline's tokenization, collation and loss, Hugging Face's ``linear``
                   schedule).
  sweep            the recipe at 8 rates log-spaced over 1e-5..3e-3, each run on 90% of the rows
                   given; the swept optimum is the rate with the lowest loss on the other 10% (the
                   search's validation rows, not the test rows); the grid's summed time is the
                   sweep's cost.
  lr_find          Lightning's LR range test (``Tuner.lr_find``: 100 steps, 1e-8..1, its
                   ``suggestion()``), then the recipe at the suggested rate.
  lr_find_log      the same range test (lr_find's, when it recorded one), its suggestion taken
                   where the loss falls fastest against log10(lr) instead of lr: Lightning's
                   ``suggestion()`` differentiates against the rate itself over log-spaced rates,
                   which pulls it to the smallest ones (Lightning-AI/pytorch-lightning#21141,
                   the open fix #21171); then the recipe at that rate.
  optuna           TPE (seed 0, 3 random start-up trials so that TPE proposes the other 5;
                   the default 10 would leave all 8 random) over the rate (1e-5..3e-3, log),
                   rows a step (4, 8, 16, 32) and the warmup's share (0..0.1), 8 trials of the
                   full run on 90% of the rows given; each trial's objective is its loss on the
                   other 10% (the search's validation rows, as the sweep's); the best trial is
                   the arm; the trials' summed time its cost.
  schedulefree     ``schedulefree.AdamWScheduleFree`` at its documented defaults (lr 0.0025,
                   no warmup), 16 rows a step, one pass over every row given, evaluated at its
                   averaged weights. schedulefree_algoperf and prodigy alike (:data:`OPTIMIZERS`).
  schedulefree_again  schedulefree again in a process of its own at the same seed: the A/A
                   control (rule AA).
  leadline         ``leadline run`` with the model, the data and the seed: the command a user
                   runs. Exit status 3 (its outcome ``no_better_than_start`` or ``collapsed``) is
                   its own verdict, not a crash: the unit records the status and the outcome, and
                   is judged by the adapter it wrote (``collapsed``) or, where it wrote none, as
                   the untrained model (what the user gets).
  leadline_full    ``leadline derive --effort full`` then ``leadline train --plan``, at derive's
                   default step: the least-time step until rule R passed, the step for the rows
                   since (the unit's commit says which it ran).
  leadline_full_half_ending  leadline_full's plan trained again with ``--ending-share 0.5``:
                   the raced ending over the run's last half (rule H).
  leadline_run     ``leadline run`` (the full effort): the same derive and run in one process,
                   the model loaded once; its cost is that one process's wall seconds.
  leadline_full_16rows  ``leadline derive --effort full --rows-per-step 16`` then ``leadline
                   train``: the recipe's batch, everything else measured. Beside leadline_full
                   it isolates the step: rule S below.
  leadline_full_rows  ``leadline derive --effort full --step-for rows`` then ``leadline train``:
                   the step for the rows (the smallest whose time a row is what the least-time step
                   pays a row to the loss its rows reach at a small step), everything else as
                   leadline_full: rule R below (decided on the least-time leadline_full units;
                   a leadline_full run after it repeats this arm with the flag left out).
  leadline_full_to_zero, leadline_full_16rows_to_zero, leadline_full_rows_to_zero  the plan
                   of leadline_full (of leadline_full_16rows, of leadline_full_rows) trained again with ``leadline train --ending to-zero``:
                   the rate falls linearly to zero over the run under the same checks, instead
                   of the raced ending over the last 2h steps. The same plan, so the pair isolates
                   the ending (rule E); the deciding seconds are the plan's own. The plan comes
                   from this machine's work folder where its arm ran in the same call (with its
                   look-ahead's branch), else from the arm's record (the run then starts over).
                   Judged on the task's metric alone (no exact match).
  pichak_quick     pichak 0.4.1's ``derive(effort="quick")`` then ``race()`` over its grid, as its
                   README prescribes (benchmarks/pichak_arm.py says where it had to adapt).
  pichak_full      pichak's full ``derive()`` then its ``LookaheadSchedule``.

Decision rules, written before any run (``RULES`` below is what the table prints):
  W   a leadline arm WINS against an arm when its test metric is better with p < 0.05
      (McNemar for accuracy and exact match; paired t over rows for cross-entropy);
  L   it LOSES when the metric is worse with p < 0.05; otherwise the two TIE;
  C   an arm COLLAPSED when one answer takes over 60% of the test rows on a task whose
      majority class is below 40%;
  $   leadline's cost is reported as a ratio to the sweep's summed cost; "a fraction of a
      search's cost" means below 0.5. A cost ratio (the boards table's leadline against the
      recipe) is quoted only between units each timed alone (``--alone``): each arm its own
      process, nothing else on the GPU, wall seconds from the process's start (imports and the
      model's load included).
  P   with ``--seeds K`` (K >= 2) the seeded arms (leadline, schedulefree, the recipe) run at
      seeds 0..K-1 (units ``<arm>`` and ``<arm>_seed<k>``), and a comparison between two of them
      is decided on the seeds together, seed k against seed k: per seed the paired test (McNemar
      on accuracy, paired t over the test rows on cross-entropy), pooled McNemar on the discordant
      rows of every seed (accuracy) or a paired t over the seeds' mean differences (cross-entropy,
      df K-1). leadline WINS when every seed's difference favours it and the pooled test gives
      p < 0.05; it LOSES when every seed's and the pooled difference go the other way with
      p < 0.05; otherwise the two TIE. A collapse (rule C) at any seed is shown with its seed.
      Written before any run at several seeds in one board.
  AA  schedulefree_again is schedulefree at the same seed in another process, run beside the
      board's other processes (``--parallel``): the table says whether its answers are identical
      to schedulefree's, and if not, by how much and with which p they differ.
  S   the measured step costs quality in a one-pass run when leadline_full_16rows beats
      leadline_full with p < 0.05 (and the reverse when it loses): the step leadline measures
      minimizes the time to a loss, not the loss a fixed number of rows reaches.
  R   the step for the rows replaces the least-time step as derive's default when
      leadline_full_rows beats leadline_full with p < 0.05 on at least one task and loses
      (p < 0.05) on none; otherwise the least-time step stays.
  E   the ending to zero replaces the raced ending as the schedule's default when, on the same
      plan, leadline_full_to_zero beats leadline_full (or leadline_full_16rows_to_zero beats
      leadline_full_16rows) with p < 0.05 on at least one task and loses (p < 0.05) on none;
      otherwise the raced ending stays.
  Z   at the step for the rows (derive's default once rule R passed), the ending to zero
      replaces the raced ending as the schedule's default when leadline_full_rows_to_zero beats
      leadline_full_rows with p < 0.05 on at least one task and loses (p < 0.05) on none;
      otherwise the raced ending stays. Written after rule E failed at the least-time step and
      won at 16 rows, before this arm ran anywhere.
  H   the raced ending over the run's last half (``--ending-share 0.5``: the copy at T/2,
      constant against a linear fall to zero over the half) replaces the raced ending over two
      check intervals as the schedule's default when, on leadline_full's plan,
      leadline_full_half_ending beats leadline_full with p < 0.05 on at least one task and loses
      (p < 0.05) on none; otherwise the two-interval ending stays. Written after rules E and Z
      failed (the whole run's fall to zero won on gsm_symbolic and lost on debian_sections: a
      fall over the whole run at a rate measured constant leaves a low rate too low), before
      this arm ran anywhere: a race keeps the constant ending where the longer fall loses.
Every arm is compared with the recipe and with the swept optimum; losses are reported as wins
are. Each test within one seed compares two trained models; ``--seed N`` runs the arms again at
another seed (the split into trained and held-out rows, their order and the adapter's init; the
rows given and the test rows stay) into ``_seedN``, and the table then lists a task's arms seed
by seed with each rule's comparison at every seed: an outcome that moves with the seed is the
training's noise, not the procedure's. ``--seeds K`` instead runs the seeded arms at K seeds in
one board (rule P).

One arm at a time, resumable: each finished unit (an arm, or one rate of the sweep, or one
optuna trial) is written into ``--out`` at once, and a rerun skips what is there, so a cut
call loses one unit.

    PYTHONPATH=src python3 benchmarks/scoreboard.py --task debian_sections \\
        --model /root/assets/smol.gguf --data-dir /root/assets/data \\
        --out benchmarks/results/scoreboard_debian_sections.json --stop-after 520
    (add ``--card-gb 6`` for a 6 GB card: a second process holds the rest; the file gets ``_6gb``;
    the recipe-shaped arms then take their 16 rows a step as ``--recipe-micro-batch`` rows a pass,
    4 by default, the rest accumulated, as a user of the recipe on a small card would set it)
    python3 benchmarks/scoreboard.py --table --readme README.md --results docs/results.md
    (``--seeds 3 --arms recipe,schedulefree,schedulefree_again,leadline --parallel 4``: the quick
    board at three seeds; ``benchmarks/boards_on_gpu.sh`` runs six boards so, SEEDS=3)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
T0 = time.perf_counter()
SWEEP_RATES = [1e-5 * (3e-3 / 1e-5) ** (k / 7) for k in range(8)]
OPTUNA_TRIALS = 8
RULES = {
    "W": "a leadline arm wins against an arm when its test metric is better with p < 0.05 (McNemar for accuracy "
         "and exact match, paired t over rows for cross-entropy)",
    "L": "it loses when the metric is worse with p < 0.05; otherwise the two tie",
    "C": "an arm collapsed when one answer takes over 60% of the test rows (majority class below 40%)",
    "$": "leadline's cost against the sweep's summed cost; a fraction of a search's cost means below 0.5",
    "S": "the measured step costs quality in a one-pass run when leadline_full_16rows beats leadline_full with "
         "p < 0.05 (and the reverse when it loses)",
    "R": "the step for the rows replaces the least-time step as the default when leadline_full_rows beats "
         "leadline_full with p < 0.05 on at least one task and loses on none",
    "E": "the ending to zero replaces the raced ending as the default when, on the same plan, leadline_full_to_zero "
         "or leadline_full_16rows_to_zero beats its raced arm with p < 0.05 on at least one task and loses on none",
    "Z": "at the step for the rows, the ending to zero replaces the raced ending as the default when "
         "leadline_full_rows_to_zero beats leadline_full_rows with p < 0.05 on at least one task and loses on none",
    "H": "the raced ending over the run's last half (--ending-share 0.5) replaces the raced ending over two check "
         "intervals as the default when, on the same plan, leadline_full_half_ending beats leadline_full with "
         "p < 0.05 on at least one task and loses on none",
    "P": "with several seeds, each seed's paired test (McNemar on accuracy, paired t over rows on cross-entropy) "
         "and a pooled one (McNemar on the seeds' pooled discordant rows; a paired t over the seeds' mean "
         "differences); a win when every seed's difference favours leadline and the pooled test gives p < 0.05, "
         "a loss the same the other way, otherwise a tie",
    "T": "every comparison arm trains on every training row given (the sweep and Optuna on all but the 10% they "
         "pick by); leadline's arm pays its own held-out split; a unit without the record trained on leadline's split",
    "AA": "schedule-free's arm run twice at one seed, the second beside the board's other processes: identical "
          "answers mean the GPU's sharing does not move a run; a difference is what two runs of one method differ by",
    "HO": "leadline run --train-held-out (the held-out rows no check reads train after the opening) becomes the "
          "default when, on the six seeded boards, leadline_held_out against leadline (rule P, 3 seeds) wins on at "
          "least one board and loses on none, and its process costs at most 1.1x leadline's timed alike",
    "SW": "schedule-free AdamW on every row at c/4, c/2, c, 2c and 4c (c = 2.5e-3 for an adapter, 2.5e-4 for every "
          "weight) at the board's passes and at c over 1, 3 and 5 passes, seed 0; the user's pick is the run whose "
          "loss is lowest on a seeded quarter of the test rows (the pick's own split), the ceiling the best test "
          "metric on the other rows (reported, never a bar); an arm's regret is rule P against the pick on those "
          "other rows; the sweep's cost is its runs' summed seconds",
    "D": "leadline run's defaults of this version (the held-out rows no check reads train after the opening; the "
         "guard rolls back a check no better than the start at once and a significant worsening only where it gave "
         "back 5% of the start-to-best fall, the end keeps the best check where it is significantly worse; a run "
         "of no given length goes on pass by pass while its check at a pass's end is significantly below the check "
         "half a pass before it, or its held-out answers have collapsed to one, at most 5 passes; the version with the check just before it took no second pass "
         "on any board and was replaced before this rule's next run) stay the default when, on the "
         "boards with the sweep, leadline (3 seeds) loses by rule P to none of the sweep's pick, schedule-free at its "
         "defaults and the recipe, and no longer loses to schedule-free on the boards where the earlier default lost "
         "(py_modules, code_trace, man_sections); a piece is judged where it acted: the rows trained on py_modules "
         "and code_trace, the rollbacks (guard_replay) on man_sections, the passes taken on the small boards",
    "RATE": "the opening's candidates stay c and c/4 unless the sweep's pick (rule SW) sits at 2c or more, or at c/4, "
            "on at least two boards, each at the board's passes; where c (or c/2, within 2x) is the pick on every "
            "board, docs/rate.md says so with the boards and the race's cost stays zero where c learns",
    "$$": "a cost ratio is quoted only between units each timed alone on the GPU (its own process, wall seconds from "
          "its start, imports and the model's load included)",
}
REGIMES = {
    "lora": "LoRA r16 (alpha 32, every linear layer), one pass over the rows given",
    "full": "every weight trained (a full fine-tune), one pass; the recipe at 2e-5 (TRL's default)",
    "short": "LoRA r16, one pass over 1,000 rows given: about 50 of the recipe's 16-row steps",
    "long": "LoRA r16, three passes over 1,000 rows given: about 150 of the recipe's 16-row steps",
    "rank64": "LoRA r64 (alpha 128, every linear layer), one pass over the rows given",
    "small": "LoRA r16, one pass over 320 rows given: 20 of the recipe's 16-row steps (a user's own small task)",
}
"""The regimes a board runs in (``--regime``); ``--card-gb`` holds the card to a small size in any of them."""
REGIME_ROWS = {"lora": 2000, "full": 2000, "short": 1000, "long": 1000, "rank64": 2000, "small": 320}
REGIME_EPOCHS = {"long": 3}
REGIME_RANK = {"rank64": 64}
"""The LoRA rank of a regime's every arm (16 where unnamed; alpha twice the rank, as ``leadline``'s)."""
SF_SWEEP_C = {"factors": 2.5e-3, "weights": 2.5e-4}
"""The sweep's centre ``c``: schedule-free AdamW's default rate for an adapter, a tenth of it for
every weight (the ratio of TRL's defaults), as ``leadline run``'s opening race takes them."""
SF_SWEEP_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
"""The sweep's rates as multiples of ``c``: c/4, c/2, c, 2c, 4c, each at the board's passes."""
SF_SWEEP_PASSES = (1, 3, 5)
"""The passes the sweep runs at ``c`` (the board's own among them)."""
PICK_SHARE = 0.25
"""The share of the test rows the sweep's pick reads (seeded, fixed per board): the user's
validation split. Every regret is judged on the other test rows, which nothing picks by."""
TO_ZERO = ["leadline_full_to_zero", "leadline_full_16rows_to_zero", "leadline_full_rows_to_zero"]
RETRAINED = [*TO_ZERO, "leadline_full_half_ending"]  # another leadline arm's plan, trained with another ending
BASELINES = ["recipe", "schedulefree", "schedulefree_algoperf", "prodigy"]
"""The defaults a user would otherwise type: the board's bar (each runs with no deciding)."""
ARMS = ["recipe", "leadline", "schedulefree_algoperf", "prodigy", "leadline_full", "leadline_run",
        "leadline_full_16rows", "leadline_full_rows", *RETRAINED,
        "schedulefree", "lr_find", "lr_find_log",
        "sweep", "optuna", "pichak_quick", "pichak_full", "sf_sweep"]


def log(*a: Any) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s]", *a, flush=True)


# ---- the tasks ----------------------------------------------------------------------------
def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _take(rows: list[dict[str, Any]], n: int, seed: int = 0) -> list[dict[str, Any]]:
    if n <= 0 or n >= len(rows):
        return rows
    pick = list(range(len(rows)))
    random.Random(seed).shuffle(pick)
    return [rows[i] for i in sorted(pick[:n])]


def load_task(name: str, data_dir: Path, train_rows: int, test_rows: int) -> dict[str, Any]:
    """The task's training rows (prompt/completion) and test rows, as every arm sees them."""
    local = HERE / "data"
    if name == "debian_sections":
        def pc(r: dict[str, Any]) -> dict[str, Any]:
            return {"prompt": r["text"][:600] + "\nSection:", "completion": " " + r["label"]}
        train = read_jsonl(data_dir / "debian_sections_train.jsonl")
        test = read_jsonl(data_dir / "debian_sections_test.jsonl")
        kind, labels = "classify", ["games", "net", "science", "sound"]
    elif name == "man_sections":
        def pc(r: dict[str, Any]) -> dict[str, Any]:
            return {"prompt": "Manual page: " + r["text"] + "\nSection:", "completion": " " + r["label"]}
        train = read_jsonl(local / "man_sections_train.jsonl")
        test = read_jsonl(local / "man_sections_test.jsonl")
        kind, labels = "classify", ["1", "2", "3", "8"]
    elif name == "gsm_symbolic":
        def pc(r: dict[str, Any]) -> dict[str, Any]:
            return {"prompt": r["question"] + "\n", "completion": r["answer_cot"], "answer": r.get("answer")}
        train = read_jsonl(data_dir / "gsm_symbolic_train.jsonl")
        test = read_jsonl(data_dir / "gsm_symbolic_test.jsonl")
        kind, labels = "generate", None
    elif name == "debian_summary":
        def pc(r: dict[str, Any]) -> dict[str, Any]:
            return {"prompt": r["prompt"][:600] + "\nSummary:", "completion": " " + r["completion"]}
        train = read_jsonl(local / "debian_summary_train.jsonl")
        test = read_jsonl(local / "debian_summary_test.jsonl")
        kind, labels = "generate", None
    elif name == "py_modules":
        def pc(r: dict[str, Any]) -> dict[str, Any]:
            return {"prompt": f"Python function {r['function']}: {r['text']}\nModule:", "completion": " " + r["label"]}
        train = read_jsonl(local / "py_modules_train.jsonl")
        test = read_jsonl(local / "py_modules_test.jsonl")
        kind, labels = "classify", sorted({r["label"] for r in train})
    elif name == "code_trace":
        def pc(r: dict[str, Any]) -> dict[str, Any]:
            return {"prompt": r["prompt"], "completion": r["completion"], "answer": r["answer"]}
        train = read_jsonl(local / "code_trace_train.jsonl")
        test = read_jsonl(local / "code_trace_test.jsonl")
        kind, labels = "generate", None
    else:
        raise SystemExit(f"--task {name} is not a task; pass one of debian_sections, man_sections, gsm_symbolic, "
                         "debian_summary, py_modules, code_trace")
    tr = [pc(r) for r in _take(train, train_rows)]
    te = []
    for r in _take(test, test_rows):
        row = pc(r)
        if kind == "classify":
            row["label"] = r["label"]
        te.append(row)
    return {"name": name, "kind": kind, "labels": labels, "train": tr, "test": te,
            "em": name in ("gsm_symbolic", "code_trace")}


# ---- running an arm's processes -----------------------------------------------------------
def proc(args: list[str], log_path: Path, timeout: float) -> dict[str, Any]:
    """One process of an arm, timed; its output kept beside the results."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t = time.perf_counter()
    with log_path.open("w") as f:
        try:
            rc: int | str = subprocess.run([sys.executable, *args], stdout=f, stderr=subprocess.STDOUT, env=env,
                                           timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = f"timeout after {timeout:g} s"
    secs = time.perf_counter() - t
    log(" ".join(a for a in args[:3]), f"rc={rc}", f"{secs:.1f}s")
    return {"argv": args, "rc": rc, "seconds": secs, "output_tail": log_path.read_text()[-1500:]}


HOLDER = r"""
import sys, torch
free, total = torch.cuda.mem_get_info()
block = torch.empty(max(0, free - int(float(sys.argv[1]) * 2**30)), dtype=torch.uint8, device="cuda")
print(f"held {block.numel() / 2**30:.2f} GiB of {total / 2**30:.2f}", flush=True)
sys.stdin.read()
"""


def hold_card(keep_gb: float) -> subprocess.Popen:
    """A second process holding all but ``keep_gb`` of the card until its stdin closes."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(keep_gb)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    log("holder:", child.stdout.readline().strip() if child.stdout else "")
    return child


def leadline(args: list[str], log_path: Path, timeout: float) -> dict[str, Any]:
    return proc(["-m", "leadline", *args], log_path, timeout)


def run_json(run_dir: Path) -> dict[str, Any] | None:
    p = run_dir / "run.json"
    if not p.exists():
        return None
    r = json.loads(p.read_text())
    r.pop("curve", None)
    return r


UNSEEN_FROM = ("test_loss_after", "validation_loss", "held_out_after")
"""Where a run records a loss on rows it did not train on, in the order read: its test split
(``leadline run --test-share``/``--eval``, the earlier runs' default), a search's validation rows
(:func:`worker_recipe`), ``leadline run``'s held-out rows (what its own decisions read: not unseen
by its choices, the only such loss a default run records)."""


def unseen_of(run: dict[str, Any] | None) -> tuple[float | None, str | None]:
    """The run's loss on rows it did not train on, and the record it came from (:data:`UNSEEN_FROM`).

    Examples:
        >>> unseen_of({"test_loss_after": {"mean": 1.5}, "held_out_after": {"mean": 1.2}})
        (1.5, 'test_loss_after')
        >>> unseen_of({"held_out_after": {"mean": 1.2, "se": 0.1}})
        (1.2, 'held_out_after')
        >>> unseen_of({"test_loss_after": None}), unseen_of(None)
        ((None, None), (None, None))
    """
    for key in UNSEEN_FROM:
        m = ((run or {}).get(key) or {}).get("mean")
        if isinstance(m, (int, float)) and math.isfinite(m):
            return float(m), key
    return None, None


def unseen_loss(run: dict[str, Any] | None) -> float | None:
    """The run's loss on rows it did not train on (:func:`unseen_of`)."""
    return unseen_of(run)[0]


def unseen_fields(run: dict[str, Any] | None) -> dict[str, Any]:
    """A unit's ``unseen_loss`` and ``unseen_loss_from`` (which record it read)."""
    value, key = unseen_of(run)
    return {"unseen_loss": value, "unseen_loss_from": key}


GUARDED_OUTCOMES = ("no_better_than_start", "collapsed")
"""``leadline run``'s outcomes other than ``improved``: it exits 3 with either. With
``no_better_than_start`` it writes no adapter (the user keeps the model they started from), with
``collapsed`` it writes the adapter and marks it."""


def leadline_exit(rc: int | str, run: dict[str, Any] | None) -> dict[str, Any]:
    """A ``leadline run`` unit's exit status, the outcome its run.json records, and whether the exit
    is the run's own verdict (status 3 with an outcome of :data:`GUARDED_OUTCOMES`): such a unit is
    judged, not failed (by its adapter where it wrote one, else as the untrained model).

    Examples:
        >>> leadline_exit(0, {"outcome": "improved"})
        {'exit_status': 0, 'outcome': 'improved', 'guarded_exit': False}
        >>> leadline_exit(3, {"outcome": "no_better_than_start"})["guarded_exit"]
        True
        >>> leadline_exit(3, None)["guarded_exit"], leadline_exit(1, {"outcome": "collapsed"})["guarded_exit"]
        (False, False)
    """
    outcome = (run or {}).get("outcome")
    return {"exit_status": rc, "outcome": outcome, "guarded_exit": rc == 3 and outcome in GUARDED_OUTCOMES}


class Board:
    """The task's results file: every finished unit written at once."""

    def __init__(self, path: Path, task: dict[str, Any], argv: list[str]) -> None:
        self.path = path
        self.data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        self.data.setdefault("units", {})
        self.data.update({
            "benchmark": "scoreboard", "task": task["name"], "kind": task["kind"], "rules": RULES,
            "train_rows": len(task["train"]), "test_rows": len(task["test"]),
            "command": " ".join(["python3", "benchmarks/scoreboard.py", *argv]), "commit": _commit(),
            "machine": _machine(),
        })
        self.data.setdefault("invocations", []).append({k: self.data[k] for k in ("command", "commit", "machine")})

    rerun: frozenset[str] = frozenset()
    """Units to run again though recorded (:func:`drop_units`): each stays until its new run is put."""

    def has(self, unit: str) -> bool:
        return unit in self.data["units"] and unit not in self.rerun and not self.data["units"][unit].get("failed")

    def put(self, unit: str, rec: dict[str, Any]) -> None:
        if unit in self.rerun and unit in self.data["units"]:
            self.data.setdefault("superseded", {})[unit] = self.data["units"][unit]
        self.data["units"][unit] = rec
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


def _commit() -> str:
    if os.environ.get("LEADLINE_COMMIT"):  # a copy without its git history names its commit here
        return os.environ["LEADLINE_COMMIT"]
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        head = ""
    return head or os.environ.get("LEADLINE_COMMIT", "unknown")


def _machine() -> dict[str, Any]:
    out: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version()}
    try:
        import torch

        out["torch"] = torch.__version__
        out["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except ImportError:
        pass
    return out


# ---- the judge ----------------------------------------------------------------------------
class Judge:
    """The test verdict of an adapter: the base model loaded once, each adapter put on and taken
    off in turn. Between verdicts the model waits in host memory and the allocator's cache is
    emptied, so the arms' own processes find the card as the run left it (on a card held to
    ``card_gb``, this process's memory would count against their room). ``token_budget``: the most
    tokens a scoring pass holds logits for (None: 64 rows a pass, the uncapped card's setting)."""

    def __init__(self, model_path: str, task: dict[str, Any], em_rows: int, token_budget: int | None = None) -> None:
        import torch

        from leadline.hf import load_model, load_tokenizer

        self.task = task
        self.tok = load_tokenizer(model_path)
        self.base = load_model(model_path, dtype=getattr(torch, ARM_DTYPE))  # the precision every arm trained in

        self.dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.em_rows = em_rows
        self.token_budget = token_budget

    def verdict(self, adapter: Path | None, em: bool = True) -> dict[str, Any]:
        """The adapter's test verdict; ``em=False`` leaves out the exact match by greedy decoding
        (most of a generation task's judging time), for the units a search does not pick."""
        import torch

        if adapter is not None and not (adapter / "adapter_config.json").exists() and (adapter / "config.json").exists():
            return self._full(adapter, em)  # a full fine-tune's saved weights
        model, wrapped = self.base.to(self.dev), None
        try:  # whatever raises, the base goes back to host memory without the adapter
            if adapter is not None:
                from peft import PeftModel

                wrapped = PeftModel.from_pretrained(self.base, str(adapter)).to(self.dev)
                model = wrapped
            if self.task["kind"] == "classify":
                return self._classify(model)
            return self._generate(model, em)
        finally:
            if wrapped is not None:
                self.base = wrapped.unload()
            del model, wrapped
            self.base.to("cpu")
            if self.dev.type == "cuda":
                torch.cuda.empty_cache()

    def _full(self, folder: Path, em: bool) -> dict[str, Any]:
        """The verdict of a full fine-tune: its saved weights loaded on their own, then freed."""
        import torch

        from leadline.hf import load_model

        model = load_model(str(folder), device=str(self.dev), dtype=getattr(torch, ARM_DTYPE))
        try:
            return self._classify(model) if self.task["kind"] == "classify" else self._generate(model, em)
        finally:
            del model
            if self.dev.type == "cuda":
                torch.cuda.empty_cache()

    def _seq_scores(self, model: Any, seqs: list[tuple[list[int], int]], batch: int = 64) -> list[tuple[float, int]]:
        """(summed log-prob, scored tokens) of each sequence's tail after its prompt."""
        import torch

        out: list[tuple[float, int]] = []
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        model.eval()
        with torch.no_grad():
            i = 0
            while i < len(seqs):
                rows = batch
                if self.token_budget is not None:  # the longest row sets a pass's padded length
                    rows = max(1, min(batch, self.token_budget // max(len(s) for s, _ in seqs[i:i + batch])))
                chunk = seqs[i:i + rows]
                i += rows
                n = max(len(s) for s, _ in chunk)
                ids = torch.full((len(chunk), n), pad, dtype=torch.long)
                mask = torch.zeros((len(chunk), n), dtype=torch.long)
                for j, (s, _) in enumerate(chunk):
                    ids[j, :len(s)] = torch.tensor(s)
                    mask[j, :len(s)] = 1
                logits = model(input_ids=ids.to(self.dev), attention_mask=mask.to(self.dev)).logits.float()
                logp = torch.log_softmax(logits[:, :-1], dim=-1)
                tgt = ids[:, 1:].to(self.dev)
                tok_lp = logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
                for j, (s, plen) in enumerate(chunk):
                    out.append((float(tok_lp[j, plen - 1:len(s) - 1].sum()), len(s) - plen))
        return out

    def _enc(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def _classify(self, model: Any) -> dict[str, Any]:
        labels = self.task["labels"]
        seqs = []
        for r in self.task["test"]:
            p = self._enc(r["prompt"])
            for lab in labels:
                seqs.append((p + self._enc(" " + lab) + [self.tok.eos_token_id], len(p)))
        sc = self._seq_scores(model, seqs)
        k = len(labels)
        preds = [labels[max(range(k), key=lambda x: sc[k * i + x][0])] for i in range(len(self.task["test"]))]
        gold = [r["label"] for r in self.task["test"]]
        nll = []  # the gold answer's cross-entropy among the task's answers: the sweep's pick reads it
        for i, g in enumerate(gold):
            row = [sc[k * i + x][0] for x in range(k)]
            top = max(row)
            nll.append(top + math.log(sum(math.exp(v - top) for v in row)) - row[labels.index(g)] if g in labels
                       else None)  # a gold answer outside the task's answers: no loss to read
        c = Counter(preds)
        return {"metric": "accuracy", "accuracy": sum(p == g for p, g in zip(preds, gold)) / len(gold),
                "top_answer_share": c.most_common(1)[0][1] / len(preds), "counts": dict(c), "predictions": preds,
                "row_nll": nll}

    @property
    def has_em(self) -> bool:
        return bool(self.task.get("em")) and self.em_rows > 0

    def _generate(self, model: Any, em: bool = True) -> dict[str, Any]:
        seqs = []
        for r in self.task["test"]:
            p = self._enc(r["prompt"])
            seqs.append((p + self._enc(r["completion"]) + [self.tok.eos_token_id], len(p)))
        sc = self._seq_scores(model, seqs, batch=32)
        ce = [-s / max(1, n) for s, n in sc]
        out: dict[str, Any] = {"metric": "test_ce", "test_ce": sum(ce) / len(ce), "row_ce": ce}
        if self.has_em and em:
            rows = self.task["test"][:self.em_rows]
            texts = self._greedy(model, [r["prompt"] for r in rows], 256)
            got = [_final_number(t) for t in texts]
            right = [g is not None and g == _norm_number(str(r["answer"])) for g, r in zip(got, rows)]
            c = Counter(g for g in got if g is not None)  # the share among rows that gave an answer
            out.update({"exact_match": sum(right) / len(right), "em_rows": len(rows), "em_right": right,
                        "answers": got, "answered": sum(g is not None for g in got) / len(got),
                        "top_answer_share": c.most_common(1)[0][1] / sum(c.values()) if c else 0.0,
                        "sample": texts[:2]})
        return out

    def _greedy(self, model: Any, prompts: list[str], max_new: int, batch: int = 64) -> list[str]:
        import torch

        texts: list[str] = []
        self.tok.padding_side = "left"
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        model.eval()
        with torch.no_grad():
            for i in range(0, len(prompts), batch):
                enc = self.tok(prompts[i:i + batch], return_tensors="pt", padding=True, add_special_tokens=False).to(self.dev)
                gen = model.generate(**enc, max_new_tokens=max_new, do_sample=False, pad_token_id=self.tok.pad_token_id)
                texts += self.tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        return texts


def _norm_number(s: str) -> str | None:
    s = s.replace(",", "").strip()
    try:
        v = float(s)
    except ValueError:
        return None
    return str(int(v)) if v == int(v) else repr(v)


def _final_number(text: str) -> str | None:
    m = re.search(r"####\s*(-?[\d,]*\.?\d+)", text)
    return _norm_number(m.group(1)) if m else None


# ---- the arms ------------------------------------------------------------------------------
class Arms:
    def __init__(self, args: argparse.Namespace, task: dict[str, Any], board: Board, judge: Judge) -> None:
        self.args, self.task, self.board, self.judge = args, task, board, judge
        self.work = Path(args.work) / task["name"]
        self.work.mkdir(parents=True, exist_ok=True)
        self.train = self.work / "train.jsonl"
        self.train.write_text("".join(json.dumps({k: r[k] for k in ("prompt", "completion")}) + "\n" for r in task["train"]))
        self.regime = getattr(args, "regime", "lora")
        self.trains = ["--full"] if self.regime == "full" else ["--lora-rank", str(REGIME_RANK.get(self.regime, 16))]
        self.common = self.common_at(args.seed)
        self.epochs = REGIME_EPOCHS.get(self.regime, 1)
        self.lock = threading.Lock()  # arms run side by side (--parallel): one verdict and one write at a time
        # --smoke: every arm's run two steps long; a long regime's recipe-shaped arms: its passes in 16-row steps
        self.short = (["--steps", "2"] if args.smoke else
                      ["--steps", str(self.epochs * trained_rows(len(task["train"])) // 16)] if self.epochs > 1 else [])
        self.length = (["--steps", "2"] if args.smoke else  # leadline's own arms: the run's length in passes
                       ["--epochs", str(self.epochs)] if self.epochs > 1 else [])

    def common_at(self, seed: int) -> list[str]:
        """The model, the rows, the regime's adapter and ``seed``: what every leadline call of a unit gets."""
        return ["--model", self.args.model, "--data", str(self.train), *self.trains, "--seed", str(seed)]

    def seed_of(self, unit: str) -> int:
        """A unit's seed: ``k`` for ``<arm>_seed<k>`` (:func:`seed_units`), the board's ``--seed`` for any other."""
        m = re.search(r"_seed(\d+)$", unit)
        return int(m.group(1)) if m else int(self.args.seed)

    def out_of_time(self) -> bool:
        return time.perf_counter() - T0 > self.args.stop_after

    def fits(self, arm: str) -> bool:
        """Whether a run as long as ``arm``'s recorded one (:func:`arm_seconds`) ends before
        ``--deadline``; True without a deadline or a record."""
        deadline = getattr(self.args, "deadline", None)
        if deadline is None:
            return True
        took = arm_seconds(arm, [self.board.data, *(json.loads(f.read_text()) for f in RESULTS.glob("scoreboard_*.json")
                                                    if f.resolve() != self.board.path.resolve())])
        left = deadline - (time.perf_counter() - T0)
        if took is not None and took > left:
            log(f"{arm} not started: its recorded run took {took:.0f} s, {left:.0f} s are left of --deadline")
            return False
        return True

    def finish(self, unit: str, rec: dict[str, Any], adapter: Path | None, em: bool = True,
               as_untrained: bool = False) -> None:
        """The unit judged and written: its adapter's verdict where the run left one; the untrained
        model's where ``as_untrained`` (``leadline run`` exited 3 and kept no adapter: the user gets
        the model they started from), marked ``judged_as``; else failed."""
        rec.setdefault("seed", self.seed_of(unit))
        rec.setdefault("train_rows", (rec.get("run") or {}).get("train_rows"))  # None: leadline's split, not recorded
        rec["regime"] = self.regime
        rec["parallel"] = int(getattr(self.args, "parallel", 1) or 1)  # processes side by side on the GPU
        rec["timed_alone"] = bool(getattr(self.args, "alone", False))  # its seconds shared the GPU with no process
        rec["invocation"] = len(self.board.data.get("invocations", [])) - 1  # the call that ran it (side by side with?)
        rec["dtype"] = ARM_DTYPE  # the precision it trained and was judged in
        if adapter is not None and ((adapter / "adapter_config.json").exists() or (adapter / "config.json").exists()):
            with self.lock:
                t = time.perf_counter()
                rec["verdict"] = self.judge.verdict(adapter, em=em)
                rec["judge_seconds"] = time.perf_counter() - t
            m = rec["verdict"]["metric"]
            log(unit, m, f"{rec['verdict'][m]:.4f}", f"cost {rec.get('decide_seconds', 0) + rec.get('train_seconds', 0):.0f}s")
        elif as_untrained:
            with self.lock:
                rec["verdict"] = self.judge.verdict(None)
            rec["judged_as"] = "untrained"
            log(unit, "kept no adapter (exit 3):", rec.get("outcome"), "judged as the untrained model")
        else:
            rec["failed"] = True
            log(unit, "FAILED")
        with self.lock:
            self.board.put(unit, rec)

    def recipe_train(self, unit: str, lr: float, batch: int, warmup: float) -> tuple[dict[str, Any], Path]:
        """The recipe at these numbers (:func:`worker_recipe`, a process of its own) into the unit's
        folder: on every row given, or a search's unit on all but its validation share (:func:`validation_of`)."""
        run_dir = self.work / f"run_{unit}"
        _rm(run_dir)
        micro = recipe_micro(batch, self.args.recipe_micro_batch)
        t = proc([str(HERE / "scoreboard.py"), "--worker", "recipe", "--model", self.args.model, "--train", str(self.train),
                  "--seed", str(self.seed_of(unit)), "--worker-out", str(run_dir), "--regime", self.regime,
                  "--lr", f"{lr:.6g}", "--rows-per-step", str(batch), "--warmup-ratio", f"{warmup:.4g}",
                  "--validation", f"{validation_of(unit):g}", *(["--recipe-micro-batch", str(micro)] if micro else []),
                  *(["--smoke"] if self.args.smoke else [])], self.work / f"{unit}.log", self.args.timeout)
        return t, run_dir

    def recipe_run(self, unit: str, lr: float, batch: int = 16, warmup: float = 0.03, decide: float = 0.0,
                   extra: dict[str, Any] | None = None, em: bool = True) -> dict[str, Any]:
        t, run_dir = self.recipe_train(unit, lr, batch, warmup)
        rec = {"lr": lr, "rows_per_step": batch, "warmup_ratio": warmup, "decide_seconds": decide, "train_seconds": t["seconds"],
               "train": t, "run": run_json(run_dir), **(extra or {})}
        rec.update(unseen_fields(rec["run"]))
        self.finish(unit, rec, run_dir if t["rc"] == 0 else None, em=em)
        return rec

    def em_for_best(self, prefix: str, n: int) -> None:
        """A search's units are judged without the exact match (the greedy decoding is most of a
        generation task's judging time); once all ``n`` have run, the one the search picks (the
        lowest unseen loss) gets it. Its adapter is judged where this machine still holds it,
        else the same run is trained again (seed 0) and its unseen loss recorded beside the first."""
        if not self.judge.has_em:
            return
        units = {f"{prefix}_{k}": self.board.data["units"].get(f"{prefix}_{k}") for k in range(n)}
        ok = {name: u for name, u in units.items() if u and not u.get("failed") and u.get("unseen_loss") is not None}
        if not ok or any(u is None for u in units.values()):
            return
        name, best = min(ok.items(), key=lambda kv: kv[1]["unseen_loss"])
        if "exact_match" in (best.get("verdict") or {}):
            return
        run_dir = self.work / f"run_{name}"
        if not (run_dir / "adapter_config.json").exists():
            t, run_dir = self.recipe_train(name, best["lr"], best["rows_per_step"], best["warmup_ratio"])
            best["em_retrained"] = {"train": t, "unseen_loss": unseen_loss(run_json(run_dir))}
            if t["rc"] != 0:
                return
        t0 = time.perf_counter()
        best["verdict"] = self.judge.verdict(run_dir)
        best["em_judge_seconds"] = time.perf_counter() - t0
        log(name, "exact match", f"{best['verdict']['exact_match']:.3f}", "(the search's pick)")
        self.board.put(name, best)

    def untrained(self) -> None:
        if not self.board.has("untrained"):
            rec = {"decide_seconds": 0.0, "train_seconds": 0.0, "verdict": self.judge.verdict(None)}
            self.board.put("untrained", rec)

    @property
    def recipe_lr(self) -> float:
        """The recipe's rate: 2e-4 with LoRA, 2e-5 for a full fine-tune (TRL's SFTConfig default)."""
        return 2e-5 if self.regime == "full" else 2e-4

    def recipe(self, unit: str = "recipe") -> None:
        if not self.board.has(unit):
            self.recipe_run(unit, self.recipe_lr)

    def sweep(self) -> None:
        for k, lr in enumerate(self.board.data["sweep_rates"]):
            unit = f"sweep_{k}"
            if self.board.has(unit):
                continue
            if self.out_of_time() or not self.fits("recipe"):
                return
            self.recipe_run(unit, lr, em=False)
        self.em_for_best("sweep", len(self.board.data["sweep_rates"]))

    def lr_find(self) -> None:
        if self.board.has("lr_find"):
            return
        out = self.work / "lr_find.json"
        micro = recipe_micro(16, self.args.recipe_micro_batch)
        f = proc([str(HERE / "scoreboard.py"), "--worker", "lr_find", "--model", self.args.model, "--train", str(self.train),
                  "--seed", str(self.args.seed), "--worker-out", str(out), "--regime", self.regime,
                  *(["--recipe-micro-batch", str(micro)] if micro else []),
                  *(["--smoke"] if self.args.smoke else [])],
                 self.work / "lr_find_range.log", self.args.timeout)
        found = json.loads(out.read_text()) if f["rc"] == 0 and out.exists() else None
        if not found or not found.get("suggestion"):
            self.board.put("lr_find", {"failed": True, "range_test": f, "found": found})
            return
        self.recipe_run("lr_find", float(found["suggestion"]), decide=f["seconds"], extra={"range_test": found})

    def lr_find_log(self) -> None:
        if self.board.has("lr_find_log"):
            return
        if not self.board.has("lr_find"):
            self.lr_find()  # the range test it reads
        found = (self.board.data["units"].get("lr_find") or {}).get("range_test") or {}
        lr = log_suggestion(found) if found.get("lr") and found.get("loss") else None
        if lr is None:
            self.board.put("lr_find_log", {"failed": True, "run": {"error": "lr_find recorded no range test to read"}})
            return
        self.recipe_run("lr_find_log", lr, decide=float(found.get("seconds") or 0.0),
                        extra={"range_test_of": "lr_find", "lightning_suggestion": found.get("suggestion")})

    def optimizer_arm(self, unit: str) -> None:
        """An optimizer at the settings its users type (:data:`OPTIMIZERS`), 16 rows a step, the
        regime's passes, by leadline's rows, collation and loss (:func:`worker_optimizer`)."""
        if self.board.has(unit):
            return
        run_dir = self.work / f"run_{unit}"
        _rm(run_dir)
        micro = recipe_micro(16, self.args.recipe_micro_batch)
        t = proc([str(HERE / "scoreboard.py"), "--worker", re.sub(r"_seed\d+$", "", unit), "--model", self.args.model,
                  "--train", str(self.train), "--seed", str(self.seed_of(unit)), "--worker-out", str(run_dir),
                  "--regime", self.regime, *(["--recipe-micro-batch", str(micro)] if micro else []),
                  *(["--smoke"] if self.args.smoke else [])],
                 self.work / f"{unit}.log", self.args.timeout)
        rec = {"decide_seconds": 0.0, "train_seconds": t["seconds"], "train": t, "run": run_json(run_dir)}
        rec.update(unseen_fields(rec["run"]))
        self.finish(unit, rec, run_dir if t["rc"] == 0 else None)

    def schedulefree(self) -> None:
        self.optimizer_arm("schedulefree")

    def sf_sweep_run(self, unit: str) -> None:
        """One run of the sweep (:func:`sweep_units`): schedule-free on every row given at its rate
        and passes, judged on every test row (no exact match: the pick reads the loss)."""
        if self.board.has(unit):
            return
        lr, passes = next((lr, p) for u, lr, p in sweep_units(self.regime) if u == unit)
        run_dir = self.work / f"run_{unit}"
        _rm(run_dir)
        micro = recipe_micro(16, self.args.recipe_micro_batch)
        t = proc([str(HERE / "scoreboard.py"), "--worker", "sf_sweep", "--model", self.args.model,
                  "--train", str(self.train), "--seed", str(self.args.seed), "--worker-out", str(run_dir),
                  "--regime", self.regime, "--lr", f"{lr:.6g}", "--passes", str(passes),
                  *(["--recipe-micro-batch", str(micro)] if micro else []),
                  *(["--smoke"] if self.args.smoke else [])],
                 self.work / f"{unit}.log", self.args.timeout)
        rec = {"lr": lr, "passes": passes, "decide_seconds": 0.0, "train_seconds": t["seconds"], "train": t,
               "run": run_json(run_dir)}
        self.finish(unit, rec, run_dir if t["rc"] == 0 else None, em=False)

    def leadline_default(self, unit: str = "leadline") -> None:
        """``leadline run`` with nothing but the model, the data and the regime's length: the
        command a user runs. Its cost is the one process's wall seconds, the model's load
        included; its deciding is the overhead its plan records (steps not kept, held-out reads).
        ``leadline_held_out`` (and its seeds): the same with ``--train-held-out`` (rule HO)."""
        if self.board.has(unit):
            return
        extra = ["--train-held-out"] if unit.startswith("leadline_held_out") else []
        self.one_process(unit, [*self.length, *extra])

    def one_process(self, unit: str, flags: list[str]) -> None:
        """``leadline run`` with ``flags`` into the unit's folder: deciding is the run's recorded
        derive and load seconds, training the rest of the one process's wall time."""
        run_dir = self.work / f"run_{unit}"
        _rm(run_dir)
        seed = self.seed_of(unit)
        t = leadline(["run", *self.common_at(seed), *flags, "--out", str(run_dir)], self.work / f"{unit}.log",
                     self.args.timeout)
        run = run_json(run_dir)
        decide = float((run or {}).get("derive_seconds") or 0.0) + float((run or {}).get("load_seconds") or 0.0)
        rec: dict[str, Any] = {"decide_seconds": decide, "train_seconds": t["seconds"] - decide, "train": t, "run": run,
                               "seed": seed, **leadline_exit(t["rc"], run), **unseen_fields(run)}
        if (run_dir / "plan.json").exists():
            rec["plan"] = json.loads((run_dir / "plan.json").read_text())
        guarded = rec["guarded_exit"]
        self.finish(unit, rec, run_dir if t["rc"] == 0 or guarded else None, as_untrained=guarded)

    def leadline_arm(self, effort: str, rows_per_step: int | None = None, step_for: str = "time") -> None:
        unit = f"leadline_{effort}" + (f"_{rows_per_step}rows" if rows_per_step else "") + (
            "_rows" if step_for == "rows" else "")
        if self.board.has(unit):
            return
        name = unit.removeprefix("leadline_")
        plan = self.work / f"{name}.json"
        _rm(plan)
        fixed = (["--rows-per-step", str(rows_per_step)] if rows_per_step else []) + (
            ["--step-for", "rows"] if step_for == "rows" else [])
        d = leadline(["derive", *self.common, "--effort", effort, *fixed, *self.short, "--out", str(plan)],
                     self.work / f"derive_{name}.log", self.args.timeout)
        rec: dict[str, Any] = {"derive": d, "decide_seconds": d["seconds"]}
        if d["rc"] != 0 or not plan.exists():
            rec["failed"] = True
            self.board.put(unit, rec)
            return
        rec["plan"] = json.loads(plan.read_text())
        run_dir = self.work / f"run_{unit}"
        _rm(run_dir)
        t = leadline(["train", *self.common, "--plan", str(plan), *self.short, "--out", str(run_dir)],
                     self.work / f"train_{name}.log", self.args.timeout)
        rec.update({"train_seconds": t["seconds"], "train": t, "run": run_json(run_dir)})
        rec.update(unseen_fields(rec["run"]))
        self.finish(unit, rec, run_dir if t["rc"] == 0 else None)

    def to_zero(self, base: str) -> None:
        """``base``'s plan trained again with ``--ending to-zero`` (rules E and Z)."""
        self.ending_variant(base, f"{base}_to_zero", ["--ending", "to-zero"])

    def ending_variant(self, base: str, unit: str, flags: list[str]) -> None:
        """``base``'s plan trained again with another ending (``flags``): the plan file and its
        look-ahead's branch where ``base`` ran in this work folder, else the plan ``base`` recorded."""
        if self.board.has(unit):
            return
        rec_base = self.board.data["units"].get(base)
        if not rec_base or rec_base.get("failed") or "plan" not in rec_base:
            log(unit, f"needs {base} first; skipped")
            return
        name = base.removeprefix("leadline_")
        plan = self.work / f"{name}.json"
        if not plan.exists() or json.loads(plan.read_text()).get("created") != rec_base["plan"].get("created"):
            plan = self.work / f"{name}_recorded.json"  # no branch beside it: the run starts over
            plan.write_text(json.dumps(rec_base["plan"]))
        run_dir = self.work / f"run_{unit}"
        _rm(run_dir)
        t = leadline(["train", *self.common, "--plan", str(plan), *flags, *self.short, "--out", str(run_dir)],
                     self.work / f"train_{unit}.log", self.args.timeout)
        rec: dict[str, Any] = {"plan_of": base, "decide_seconds": rec_base.get("decide_seconds", 0.0),
                               "train_seconds": t["seconds"], "train": t, "run": run_json(run_dir)}
        rec.update(unseen_fields(rec["run"]))
        # rules E, Z and H read the task's metric (test CE on a generation task): no exact match, which is
        # most of a generation task's judging time
        self.finish(unit, rec, run_dir if t["rc"] == 0 else None, em=False)

    def leadline_run(self) -> None:
        """``leadline run --effort full``: derive and train in one process; deciding is the derive's
        seconds and the model's one load, training the rest of the process's wall time."""
        unit = "leadline_run"
        if self.board.has(unit):
            return
        # no time bound: what an arm measures must not depend on the load
        self.one_process(unit, ["--effort", "full", *self.short])

    def pichak(self, effort: str) -> None:
        """pichak 0.4.1 as its README prescribes (benchmarks/pichak_arm.py): quick + race(), full +
        LookaheadSchedule."""
        unit = f"pichak_{effort}"
        if self.board.has(unit):
            return
        run_dir = self.work / f"run_{unit}"
        _rm(run_dir)
        extra = ["--full-train", "schedule"] if effort == "full" else []
        t = proc([str(HERE / "pichak_arm.py"), "--effort", effort, "--model", self.args.model, "--train", str(self.train),
                  "--seed", str(self.args.seed), "--out", str(run_dir), *extra], self.work / f"{unit}.log", self.args.timeout)
        run = run_json(run_dir)
        derive = float((run or {}).get("derive_seconds") or 0.0)
        rec = {"decide_seconds": derive, "train_seconds": t["seconds"] - derive, "train": t, "run": run,
               **unseen_fields(run)}
        self.finish(unit, rec, run_dir if t["rc"] == 0 else None)

    def optuna(self) -> None:
        if self.board.has("optuna"):
            return
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        trials = int(self.board.data["optuna_trials"])
        study, dists = optuna_study(self.board.data["units"], trials)
        for k in range(trials):
            unit = f"optuna_{k}"
            if self.board.has(unit):
                continue
            if self.out_of_time() or not self.fits("recipe"):
                return
            trial = study.ask(dists)
            p = dict(trial.params)
            rec = self.recipe_run(unit, float(p["lr"]), int(p["rows_per_step"]), float(p["warmup_ratio"]), extra={"params": p},
                                  em=False)
            if rec.get("unseen_loss") is None:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, rec["unseen_loss"])
        done = [k for k in range(trials) if self.board.has(f"optuna_{k}")]
        if len(done) == trials:
            self.em_for_best("optuna", trials)
            self.board.put("optuna", {"trials": trials, "summary": True})


def optuna_study(units: dict[str, Any], trials: int) -> tuple[Any, dict[str, Any]]:
    """The TPE study over rate, rows a step and warmup, told the trials already run (so it proposes
    what it would have), and its distributions. The sampler is seeded by the number of trials
    told: a study resumed in a new process draws on from where it stopped instead of proposing its
    first random trial again."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    dists = {"lr": FloatDistribution(1e-5, 3e-3, log=True), "rows_per_step": CategoricalDistribution([4, 8, 16, 32]),
             "warmup_ratio": FloatDistribution(0.0, 0.1)}
    told = [u for k in range(trials) if (u := units.get(f"optuna_{k}")) and not u.get("failed")
            and u.get("unseen_loss") is not None]
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(
        seed=len(told), n_startup_trials=min(3, trials - 1)))
    for u in told:
        study.add_trial(optuna.trial.create_trial(params=u["params"], distributions=dists, value=u["unseen_loss"]))
    return study, dists


def drop_units(data: dict[str, Any], arms: str) -> frozenset[str]:
    """``--rerun``: the named arms run again. An arm of several units (the sweep's rates, Optuna's
    trials) has them moved under ``superseded`` now, so that its rows are never half old and half
    new; an arm of one unit keeps it until its new run is put (:meth:`Board.put` moves it then), so
    a call cut before the arm finishes leaves the board as it was. Returns those kept units."""
    kept: set[str] = set()
    for name in filter(None, arms.split(",")):
        family = [u for u in data["units"] if u.startswith(name + "_") and u[len(name) + 1:].isdigit()]
        if family:
            for unit in [*family, *([name] if name in data["units"] else [])]:
                data.setdefault("superseded", {})[unit] = data["units"].pop(unit)
        elif name in data["units"]:
            kept.add(name)
    return frozenset(kept)


def drop_stale(data: dict[str, Any], arms: str) -> frozenset[str]:
    """``--refresh``: the named arms' units that do not record ``train_rows`` (run before every
    comparison arm trained on every row given) run again, as :func:`drop_units` would, their seeded
    units (``<arm>_seed<k>``) too; a unit that records it stays, so the same command resumes. A
    search (the sweep, Optuna) with any such unit is set aside whole."""
    stale: set[str] = set()
    for name in filter(None, arms.split(",")):
        family = [u for u in data["units"] if u.startswith(name + "_") and u[len(name) + 1:].isdigit()]
        if family:
            if any("train_rows" not in data["units"][u] for u in family):
                stale |= drop_units(data, name)
            continue
        stale |= {u for u, rec in data["units"].items() if re.fullmatch(re.escape(name) + r"(_seed\d+)?", u)
                  and "train_rows" not in rec}
    return frozenset(stale)


def drop_earlier_defaults(data: dict[str, Any], arms: str, current: dict[str, Any] | None = None) -> frozenset[str]:
    """``--refresh-defaults``: the named ``leadline run`` arms' units (their seeds too) whose run did
    not record this version's rules (``run.json``'s ``rules``, :func:`leadline.run.result.rules`;
    rule D) run again; a unit that records them stays, so the same command resumes.

    Examples:
        >>> now = {"pass_rule": "half a pass"}
        >>> data = {"units": {"leadline": {"run": {"steps": 9}}, "leadline_seed1": {"run": {"rules": now}},
        ...                   "leadline_seed2": {"run": {"rules": {"pass_rule": "the check before"}}},
        ...                   "recipe": {"run": {}}}}
        >>> sorted(drop_earlier_defaults(data, "leadline", now))
        ['leadline', 'leadline_seed2']
    """
    if current is None:
        sys.path.insert(0, str(ROOT / "src"))
        from leadline.run.result import rules

        current = rules()
    return frozenset(u for name in filter(None, arms.split(",")) for u, rec in data["units"].items()
                     if re.fullmatch(re.escape(name) + r"(_seed\d+)?", u) and (rec.get("run") or {}).get("rules") != current)


def recipe_micro(rows_per_step: int, micro: int | None) -> int | None:
    """The rows a pass a recipe-shaped arm runs at: ``micro`` (the most rows up to it that divide
    the step), or None for the whole step at once."""
    if not micro:
        return None
    return max(d for d in range(1, min(rows_per_step, micro) + 1) if rows_per_step % d == 0)


def arm_seconds(arm: str, boards: Sequence[dict[str, Any]]) -> float | None:
    """The wall seconds ``arm`` took when it last ran — its processes and the judge's verdict —
    from the first board that recorded it (this task's first, then others'; a superseded run
    counts); None where no board has it. A sweep's or Optuna's one unit is a recipe run."""
    for data in boards:
        for units in (data.get("units") or {}, data.get("superseded") or {}):
            rec = units.get(arm)
            if isinstance(rec, dict) and not rec.get("failed") and (rec.get("train_seconds") or rec.get("decide_seconds")):
                return float(rec.get("decide_seconds") or 0) + float(rec.get("train_seconds") or 0) + float(
                    rec.get("judge_seconds") or 0)
    return None


def _rm(p: Path) -> None:
    import shutil

    if p.is_dir():
        shutil.rmtree(p)
    elif p.exists():
        p.unlink()


# ---- the sweep: schedule-free AdamW at five rates and three lengths ----------------------
def sweep_units(regime: str) -> list[tuple[str, float, int]]:
    """The sweep's runs as ``(unit, rate, passes)``: the five rates of :data:`SF_SWEEP_FACTORS` x ``c``
    at the regime's passes, then ``c`` at each other length of :data:`SF_SWEEP_PASSES` (seven runs).

    Examples:
        >>> [(u, f"{lr:.3g}", p) for u, lr, p in sweep_units("lora")]  # doctest: +NORMALIZE_WHITESPACE
        [('sf_sweep_lr0', '0.000625', 1), ('sf_sweep_lr1', '0.00125', 1), ('sf_sweep_lr2', '0.0025', 1),
         ('sf_sweep_lr3', '0.005', 1), ('sf_sweep_lr4', '0.01', 1), ('sf_sweep_ep3', '0.0025', 3),
         ('sf_sweep_ep5', '0.0025', 5)]
        >>> [(u, p) for u, _, p in sweep_units("long")][-2:], f"{sweep_units('full')[2][1]:.3g}"
        ([('sf_sweep_ep1', 1), ('sf_sweep_ep5', 5)], '0.00025')
    """
    c = SF_SWEEP_C["weights" if regime == "full" else "factors"]
    passes = REGIME_EPOCHS.get(regime, 1)
    units = [(f"sf_sweep_lr{i}", f * c, passes) for i, f in enumerate(SF_SWEEP_FACTORS)]
    return units + [(f"sf_sweep_ep{p}", c, p) for p in SF_SWEEP_PASSES if p != passes]


def pick_rows(n_test: int, share: float = PICK_SHARE, seed: int = 0) -> list[int]:
    """The test rows the sweep's pick reads: a seeded ``share`` of them, sorted; the rest judge every regret.

    Examples:
        >>> rows = pick_rows(100)
        >>> len(rows), rows == sorted(rows), rows == pick_rows(100), len(set(rows))
        (25, True, True, 25)
    """
    idx = list(range(n_test))
    random.Random(seed).shuffle(idx)
    return sorted(idx[:max(1, round(share * n_test))])


def pick_loss(verdict: dict[str, Any], rows: Sequence[int]) -> float | None:
    """A unit's loss on the pick's rows: the cross-entropy of the gold answer among the task's
    answers (``row_nll``, classification) or per completion token (``row_ce``, generation); None
    where the verdict lacks it."""
    per_row = verdict.get("row_nll") or verdict.get("row_ce")
    got = [per_row[i] for i in rows if per_row[i] is not None] if per_row else []
    return sum(got) / len(got) if got else None


def only_rows(unit: dict[str, Any], rows: Sequence[int]) -> dict[str, Any]:
    """A copy of ``unit`` whose verdict keeps only ``rows`` of the test rows (predictions, row CE and
    the metric recomputed from them), for comparisons on the rows the pick did not read."""
    v = dict(unit.get("verdict") or {})
    for key in ("predictions", "row_ce", "row_nll"):
        if key in v:
            v[key] = [v[key][i] for i in rows]
    if "row_ce" in v:
        v["test_ce"] = sum(v["row_ce"]) / len(v["row_ce"])
    v.pop("em_right", None)  # exact match was judged on the test's first rows, not these
    return {**unit, "verdict": v}


def sweep_result(data: dict[str, Any]) -> dict[str, Any] | None:
    """The sweep once all its runs are judged: the user's pick (the lowest loss on the pick's rows,
    :func:`pick_loss`), the ceiling (the best test metric on the other rows, reported, never a
    bar), every run's readings and the summed cost; None while a run is missing or failed."""
    units = data["units"]
    names = [u for u, _, _ in sweep_units(data.get("regime") or "lora")]
    if not all(n in units and not units[n].get("failed") and units[n].get("verdict") for n in names):
        return None
    picks = data.get("pick_rows") or pick_rows(int(data["test_rows"]))
    rest = [i for i in range(int(data["test_rows"])) if i not in set(picks)]
    read = {n: pick_loss(units[n]["verdict"], picks) for n in names}
    if any(v is None for v in read.values()):
        return None
    kind = data["kind"]
    metric = {n: (only_rows(units[n], rest)["verdict"]["test_ce"] if kind != "classify" else
                  sum(p == g for p, g in zip(only_rows(units[n], rest)["verdict"]["predictions"],
                                             [data["gold"][i] for i in rest])) / len(rest)) for n in names}
    pick = min(names, key=lambda n: read[n])
    ceiling = (max if kind == "classify" else min)(names, key=lambda n: metric[n])
    return {"pick": pick, "ceiling": ceiling, "pick_loss": read, "metric_on_rest": metric, "pick_rows": picks,
            "rest_rows": rest, "cost": sum(units[n].get("train_seconds", 0.0) + units[n].get("decide_seconds", 0.0)
                                           for n in names),
            "lr": {n: units[n].get("lr") for n in names}, "passes": {n: units[n].get("passes") for n in names}}


def regret(data: dict[str, Any], arm: str) -> dict[str, Any] | None:
    """``arm`` (its seeds) against the sweep's pick on the test rows the pick did not read, by rule P
    (each seed against the pick's one run); ``diff`` > 0 where the arm is better. None without both."""
    sw = sweep_result(data)
    mine = seed_units(data["units"], arm)
    if sw is None or not mine:
        return None
    rest = sw["rest_rows"]
    pick = only_rows(data["units"][sw["pick"]], rest)
    gold = [data["gold"][i] for i in rest] if data["kind"] == "classify" else []
    return compare_seeds(data["kind"], {k: only_rows(u, rest) for k, u in mine.items()}, {k: pick for k in mine}, gold)


# ---- the workers: arms that are not leadline's CLI ----------------------------------------
def trained_rows(given: int) -> int:
    """The rows ``leadline run`` trains on of ``given``: it holds out what its decisions read, 10%
    of the rows and at most 256 (:data:`leadline.run.task.MAX_HELD_OUT_ROWS`), and takes no test split
    unless asked (``--test-share``, ``--eval``). Every comparison arm trains on all ``given``."""
    return given - min(round(0.1 * given), 256)


SEARCH_VALIDATION = 0.1
"""The share of the rows a search (the sweep, Optuna) keeps to read each run's loss and pick by:
a user's sweep needs one. Its runs train on the rest; every other comparison arm trains on all."""


def validation_of(unit: str) -> float:
    """The validation share a recipe-shaped unit keeps: a search's (``sweep_K``, ``optuna_K``)
    :data:`SEARCH_VALIDATION`, any other none (it trains on every row).

    Examples:
        >>> validation_of("sweep_3"), validation_of("optuna_0"), validation_of("recipe"), validation_of("lr_find")
        (0.1, 0.1, 0.0, 0.0)
    """
    return SEARCH_VALIDATION if unit.split("_")[0] in ("sweep", "optuna") else 0.0


def _worker_task(model_path: str, train: str, seed: int = 0, regime: str = "lora",
                 validation: float = 0.0) -> tuple[Any, Any, Any, list[Any]]:
    """The model with the regime's adapter (or every weight trained), and the rows as leadline
    tokenizes and collates them: all of them trained on (no held-out rows, no test split), or with
    ``validation`` (a share) kept aside as the split's ``test`` rows for a search to pick by."""
    sys.path.insert(0, str(ROOT / "src"))
    import torch
    from peft import LoraConfig, get_peft_model

    from leadline.hf import load_model, load_tokenizer, prepare, trained_named_weights

    tok = load_tokenizer(model_path)
    model = load_model(model_path, device="cuda" if torch.cuda.is_available() else "cpu", dtype=getattr(torch, ARM_DTYPE))
    torch.manual_seed(seed)  # the adapter's init, as `leadline train --seed SEED` draws it
    if regime == "full":
        for p in model.parameters():
            p.requires_grad_(True)
    else:
        rank = REGIME_RANK.get(regime, 16)
        cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", lora_dropout=0.0,
                         task_type="CAUSAL_LM")
        model = get_peft_model(model, cfg)
    task, _ = prepare(model, tok, train, seed=seed, held_out=0, test=validation if validation > 0 else 0)
    return model, tok, task, [p for _, p in trained_named_weights(model)]


def _read_unseen(task: Any, model: Any) -> dict[str, float] | None:
    """The mean and standard error of the loss on the task's validation rows, or None where it keeps none."""
    from leadline.stats import mean_se

    if not task.split.test:
        return None
    m, se = mean_se(task.split.reader(model, task.rows, "test", device=task.device, pad_id=task.pad_id)())
    return {"mean": m, "se": se}


def worker_recipe(model_path: str, train: str, out: Path, lr: float, rows_per_step: int = 16, warmup: float = 0.03,
                  micro: int | None = None, max_steps: int | None = None, seed: int = 0, regime: str = "lora",
                  validation: float = 0.0) -> None:
    """The recipe as its users run it: AdamW at ``lr`` (no weight decay), ``rows_per_step`` rows a
    step (``micro`` rows a pass, the rest accumulated), warmup from 0 over ``warmup`` of the steps
    then linear decay to zero (:func:`leadline.train.linear_lr`, Hugging Face's ``linear``), the
    regime's passes over every row given (a search's run: all but its ``validation`` share, read
    after the run as ``validation_loss``), by leadline's own rows, collation and loss."""
    import torch

    from leadline.train import linear_lr

    model, _, task, params = _worker_task(model_path, train, seed, regime, validation)
    steps = min(max(1, REGIME_EPOCHS.get(regime, 1) * len(task.order) // rows_per_step), max_steps or 10**9)
    warm = max(1, math.ceil(warmup * steps)) if warmup > 0 else 0
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    micro = micro or rows_per_step
    step_of = task.train_step_of(micro, rows_per_step // micro)
    t0 = time.monotonic()
    model.train()
    curve = []
    for s in range(steps):
        for g in opt.param_groups:
            g["lr"] = linear_lr(s, lr, warm, steps)
        opt.zero_grad(set_to_none=True)
        loss = step_of(s)
        if not math.isfinite(loss):
            raise SystemExit(f"the training loss became {loss} at step {s}; the rate {lr:.3g} is too high for these rows")
        opt.step()
        curve.append(loss)
    model.eval()
    seconds = time.monotonic() - t0
    unseen = _read_unseen(task, model)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    (out / "run.json").write_text(json.dumps({
        "optimizer": "recipe", "lr": lr, "rows_per_step": rows_per_step, "warmup_ratio": warmup, "warmup_steps": warm,
        "micro_batch": micro, "regime": regime, "steps": steps, "seconds": seconds, "final_train_loss": curve[-1],
        "train_rows": len(task.order), "validation_rows": len(task.split.test), "seed": seed,
        "validation_loss": unseen}))


ARM_DTYPE = "float32"
"""The precision every arm trains and is judged in: ``leadline run``'s and ``leadline train``'s
default (``--dtype float32``), given to the workers and the judge too (the library's own default
on a GPU is bfloat16, which would train and judge them at another precision than the recipe's)."""


OPTIMIZERS = {
    "schedulefree": "schedulefree.AdamWScheduleFree at its package defaults (lr 0.0025, betas 0.9/0.999, no warmup, "
                    "no weight decay), evaluated at its averaged weights",
    "schedulefree_algoperf": "AdamWScheduleFree at the settings that won AlgoPerf's self-tuning track (lr 0.0025, "
                             "warmup 2% of the steps, weight decay 0.08, beta2 0.9955), at its averaged weights",
    "prodigy": "prodigyopt.Prodigy at lr 1 (its README's setting), no weight decay, cosine annealing to the "
               "run's length (torch's CosineAnnealingLR)",
    "schedulefree_again": "schedulefree's arm again in a process of its own, the same seed and settings: the board's "
                          "A/A control, what two runs of one method differ by on this GPU",
    "sf_sweep": "schedule-free AdamW at its defaults but the rate and the passes (a run of the sweep, "
                "sweep_units)",
}
"""The optimizers a user runs at their published settings, beside the recipe."""


def worker_optimizer(kind: str, model_path: str, train: str, out: Path, micro: int | None = None,
                     max_steps: int | None = None, seed: int = 0, regime: str = "lora", lr: float | None = None,
                     passes: int | None = None) -> None:
    """``kind`` (:data:`OPTIMIZERS`) at 16 rows a step (``micro`` rows a pass, accumulated), the
    regime's passes over every row given, by leadline's own rows, collation and loss; saved at the
    weights its users keep: a schedule-free optimizer's averaged weights (``optimizer.eval()``).
    ``sf_sweep``: schedule-free at its defaults but the rate ``lr``, over ``passes`` passes."""
    import torch

    model, _, task, params = _worker_task(model_path, train, seed, regime)
    passes = passes or REGIME_EPOCHS.get(regime, 1)
    steps = min(max(1, passes * len(task.order) // 16), max_steps or 10**9)
    sched = None
    if kind.startswith("schedulefree") or kind == "sf_sweep":
        import schedulefree

        opt = (schedulefree.AdamWScheduleFree(params) if kind in ("schedulefree", "schedulefree_again") else
               schedulefree.AdamWScheduleFree(params, lr=float(lr)) if kind == "sf_sweep" else
               schedulefree.AdamWScheduleFree(params, lr=0.0025, betas=(0.9, 0.9955), weight_decay=0.08,
                                              warmup_steps=max(1, round(0.02 * steps))))
    elif kind == "prodigy":
        from prodigyopt import Prodigy

        opt = Prodigy(params, lr=1.0)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    else:
        raise SystemExit(f"--worker {kind} is not an optimizer arm; pass one of {', '.join(OPTIMIZERS)}")
    micro = micro or 16
    step_of = task.train_step_of(micro, 16 // micro)
    averaged = hasattr(opt, "eval")
    t0 = time.monotonic()
    model.train()
    if averaged:
        opt.train()
    losses = []
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        losses.append(step_of(s))
        opt.step()
        if sched is not None:
            sched.step()
    if averaged:
        opt.eval()
    model.eval()
    seconds = time.monotonic() - t0
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    (out / "run.json").write_text(json.dumps({"optimizer": kind, "settings": OPTIMIZERS[kind], "regime": regime,
                                              "steps": steps, "passes": passes, "seconds": seconds,
                                              "lr": opt.param_groups[0]["lr"],
                                              "final_train_loss": losses[-1], "train_rows": len(task.order),
                                              "seed": seed}))


def worker_lr_find(model_path: str, train: str, out: Path, micro: int | None = None,
                   max_steps: int | None = None, seed: int = 0, regime: str = "lora") -> None:
    """Lightning's LR range test on every row given at the recipe's 16 rows a step (``micro`` rows
    a pass, the rest accumulated by Lightning)."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.tuner import Tuner

    model, _, task, params = _worker_task(model_path, train, seed, regime)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model
            self.lr = 2e-4

        def training_step(self, idx: list[int], _: int) -> Any:
            return self.net(**task.batch(idx).to(task.device).model_inputs()).loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(params, lr=self.lr, weight_decay=0.0)

    micro = micro or 16
    loader = torch.utils.data.DataLoader(task.order, batch_size=micro, shuffle=False, collate_fn=list)
    trainer = pl.Trainer(accelerator="auto", devices=1, max_epochs=1000, logger=False, enable_checkpointing=False,
                         accumulate_grad_batches=16 // micro,
                         enable_progress_bar=False, precision="32-true", default_root_dir=str(out.parent / "lightning"))
    t0 = time.monotonic()
    finder = Tuner(trainer).lr_find(Module(), train_dataloaders=loader, min_lr=1e-8, max_lr=1.0, num_training=max_steps or 100)
    sug = finder.suggestion() if finder is not None else None
    out.write_text(json.dumps({"suggestion": sug, "seconds": time.monotonic() - t0, "lr": finder.results["lr"] if finder else None,
                               "loss": finder.results["loss"] if finder else None}, default=float))


def log_suggestion(found: dict[str, Any], skip_begin: int = 10, skip_end: int = 1) -> float | None:
    """Lightning's ``LRFinder.suggestion()`` on a recorded range test (its smoothed losses, the
    same skips and finite filter), the gradient taken against log10(lr), the coordinate its
    exponential mode samples in, instead of lr. None with fewer than two finite points."""
    import torch

    loss = torch.tensor(found["loss"][skip_begin:-skip_end], dtype=torch.float64)
    lrs = torch.tensor(found["lr"][skip_begin:-skip_end], dtype=torch.float64)
    ok = torch.isfinite(loss) & (lrs > 0)
    loss, lrs = loss[ok], lrs[ok]
    if len(loss) < 2:
        return None
    return float(lrs[int(torch.gradient(loss, spacing=[torch.log10(lrs)])[0].argmin())])


# ---- the table ----------------------------------------------------------------------------
def arms_of(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each arm as the table reads it: the sweep's and optuna's units folded into their arms."""
    units = data["units"]
    arms: dict[str, dict[str, Any]] = {}
    for name in ("untrained", "recipe", "leadline", "schedulefree_algoperf", "prodigy", "leadline_full", "leadline_run",
                 "leadline_full_16rows",
                 "leadline_full_rows", *RETRAINED,
                 "schedulefree", "schedulefree_again", "lr_find", "lr_find_log", "pichak_quick", "pichak_full"):
        if name in units and not units[name].get("failed"):
            arms[name] = {**units[name], "cost": units[name].get("decide_seconds", 0) + units[name].get("train_seconds", 0)}
    for prefix, n in (("sweep", len(data.get("sweep_rates", SWEEP_RATES))), ("optuna", data.get("optuna_trials", OPTUNA_TRIALS))):
        done = [units[f"{prefix}_{k}"] for k in range(n) if f"{prefix}_{k}" in units]
        ok = [u for u in done if not u.get("failed") and u.get("unseen_loss") is not None]
        if len(done) == n and ok:
            best = min(ok, key=lambda u: u["unseen_loss"])
            arms[prefix] = {**best, "cost": sum(u.get("decide_seconds", 0) + u.get("train_seconds", 0) for u in done),
                            "picked": f"lr {best['lr']:.3g}, {best['rows_per_step']} rows a step, warmup {best['warmup_ratio']:.3g}"}
    return arms


def compare(task_kind: str, a: dict[str, Any], b: dict[str, Any], gold: list[str],
            metric: str = "") -> dict[str, Any] | None:
    """a against b on the same test rows: the difference in the metric (a's better is positive) and p."""
    sys.path.insert(0, str(ROOT / "src"))
    from leadline import stats

    va, vb = a.get("verdict") or {}, b.get("verdict") or {}
    if task_kind == "classify":
        if "predictions" not in va or "predictions" not in vb:
            return None
        ra = [x == g for x, g in zip(va["predictions"], gold)]
        rb = [x == g for x, g in zip(vb["predictions"], gold)]
        m = stats.mcnemar(ra, rb)
        return {"diff": m.accuracy_a - m.accuracy_b, "p": m.p_value}
    if metric == "exact_match":
        if "em_right" not in va or "em_right" not in vb:
            return None
        n = min(len(va["em_right"]), len(vb["em_right"]))  # both judged the test's first rows: the common ones
        m = stats.mcnemar(va["em_right"][:n], vb["em_right"][:n])
        return {"diff": m.accuracy_a - m.accuracy_b, "p": m.p_value}
    if "row_ce" not in va or "row_ce" not in vb:
        return None
    d = stats.paired_difference(vb["row_ce"], va["row_ce"])  # positive when a's CE is lower
    return {"diff": d.mean, "p": d.p_two_sided}


def decide_seeds(per_seed: Sequence[dict[str, float]], pooled: dict[str, float]) -> str:
    """Rule P: "win" when every seed's difference favours a (``diff`` > 0) and the pooled test
    does with p < 0.05; "loss" when every seed's and the pooled difference favour b with p < 0.05;
    else "tie". A seed whose difference is zero agrees with neither.

    Examples:
        >>> decide_seeds([{"diff": 0.01, "p": 0.2}] * 3, {"diff": 0.01, "p": 0.01})
        'win'
        >>> decide_seeds([{"diff": 0.01, "p": 0.2}, {"diff": -0.001, "p": 0.9}], {"diff": 0.01, "p": 0.01})
        'tie'
        >>> decide_seeds([{"diff": -0.02, "p": 0.01}] * 3, {"diff": -0.02, "p": 0.001})
        'loss'
        >>> decide_seeds([{"diff": 0.02, "p": 0.01}] * 3, {"diff": 0.02, "p": 0.06})
        'tie'
    """
    if not per_seed:
        return "tie"
    if all(c["diff"] > 0 for c in per_seed) and pooled["diff"] > 0 and pooled["p"] < 0.05:
        return "win"
    if all(c["diff"] < 0 for c in per_seed) and pooled["diff"] < 0 and pooled["p"] < 0.05:
        return "loss"
    return "tie"


def pooled_accuracy(per_seed: Sequence[tuple[Sequence[bool], Sequence[bool]]]) -> dict[str, Any]:
    """Rule P on accuracy: each seed's McNemar (a's right/wrong answers against b's of the same
    seed, on the same test rows), then McNemar on the discordant rows of every seed pooled; the
    decision by :func:`decide_seeds`. ``diff`` is a's accuracy minus b's (over the pooled rows).

    Examples:
        >>> one = ([True] * 30 + [False] * 10, [True] * 25 + [False] * 15)  # 5 discordant rows, all a's
        >>> r = pooled_accuracy([one] * 3)
        >>> [round(c["p"], 4) for c in r["seeds"]], r["b"], r["c"], round(r["p"], 4), r["word"]
        ([0.0625, 0.0625, 0.0625], 15, 0, 0.0001, 'win')
        >>> pooled_accuracy([one, (one[1], one[0])])["word"]  # the second seed goes the other way
        'tie'
    """
    sys.path.insert(0, str(ROOT / "src"))
    from leadline import stats

    seeds = []
    for a, b in per_seed:
        m = stats.mcnemar(list(a), list(b))
        seeds.append({"diff": m.accuracy_a - m.accuracy_b, "p": m.p_value})
    m = stats.mcnemar([x for a, _ in per_seed for x in a], [y for _, b in per_seed for y in b])
    pooled = {"diff": m.accuracy_a - m.accuracy_b, "p": m.p_value}
    return {"seeds": seeds, **pooled, "b": m.b, "c": m.c, "test": "McNemar on the seeds' pooled discordant rows",
            "word": decide_seeds(seeds, pooled)}


def pooled_ce(per_seed: Sequence[tuple[Sequence[float], Sequence[float]]]) -> dict[str, Any]:
    """Rule P on cross-entropy (lower is better): each seed's paired t over the test rows (a's
    row CE against b's), then a paired t over the seeds' mean differences (df = seeds - 1; one
    seed: its own paired t over rows); the decision by :func:`decide_seeds`. ``diff`` is b's mean
    CE minus a's: positive when a's is lower.

    Examples:
        >>> a, b = [1.0, 1.1, 0.9, 1.0], [1.2, 1.3, 1.1, 1.25]
        >>> r = pooled_ce([(a, b), ([x + 0.01 for x in a], b), ([x - 0.01 for x in a], b)])
        >>> round(r["diff"], 4), r["p"] < 0.05, r["word"]
        (0.2125, True, 'win')
        >>> pooled_ce([(a, b), (b, a)])["word"]
        'tie'
    """
    sys.path.insert(0, str(ROOT / "src"))
    from leadline import stats

    seeds = []
    for a, b in per_seed:
        d = stats.paired_difference(list(b), list(a))
        seeds.append({"diff": d.mean, "p": d.p_two_sided})
    if len(per_seed) >= 2:
        d = stats.paired_difference([sum(b) / len(b) for _, b in per_seed], [sum(a) / len(a) for a, _ in per_seed])
        pooled, test = {"diff": d.mean, "p": d.p_two_sided}, "paired t over the seeds' mean differences"
    else:
        pooled, test = dict(seeds[0]), "paired t over the test rows (one seed)"
    return {"seeds": seeds, **pooled, "test": test, "word": decide_seeds(seeds, pooled)}


def seed_units(units: dict[str, Any], arm: str) -> dict[int, dict[str, Any]]:
    """``arm``'s judged units by seed: the plain unit at 0, ``<arm>_seed<k>`` at k (failed ones left out).

    Examples:
        >>> v = {"verdict": {"metric": "accuracy"}}
        >>> sorted(seed_units({"leadline": v, "leadline_seed2": v, "leadline_seed1": {"failed": True},
        ...                    "leadline_full": v}, "leadline"))
        [0, 2]
    """
    out: dict[int, dict[str, Any]] = {}
    for name, rec in units.items():
        m = re.fullmatch(re.escape(arm) + r"(?:_seed(\d+))?", name)
        if m and isinstance(rec, dict) and not rec.get("failed") and rec.get("verdict"):
            out[int(m.group(1) or 0)] = rec
    if arm in ("leadline", "leadline_held_out") and out:  # one version's rules a cell: the newest that ran
        newest = max(rules_version(u) for u in out.values())
        out = {k: u for k, u in out.items() if rules_version(u) == newest}
    return dict(sorted(out.items()))


def rules_version(unit: dict[str, Any]) -> int:
    """Which rules a ``leadline run`` unit ran under, oldest first: 0 before the pass rule, 1 the pass
    rule's first form (its run records ``passes``, no ``rules``), 2 another version's ``rules``, 3
    this version's (:func:`leadline.run.result.rules`). A board's cell takes the newest it has.

    Examples:
        >>> rules_version({"run": {}}), rules_version({"run": {"passes": 1}}), rules_version({"run": {"rules": {}}})
        (0, 1, 2)
    """
    run = unit.get("run") or {}
    if "rules" in run:
        sys.path.insert(0, str(ROOT / "src"))
        from leadline.run.result import rules

        return 3 if run["rules"] == rules() else 2
    return 1 if "passes" in run else 0


def compare_seeds(kind: str, a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]],
                  gold: list[str]) -> dict[str, Any] | None:
    """a against b on the seeds both ran (seed k against seed k), by rule P; None where they share none."""
    common = [k for k in a if k in b]
    va = {k: a[k].get("verdict") or {} for k in common}
    vb = {k: b[k].get("verdict") or {} for k in common}
    if kind == "classify":
        common = [k for k in common if "predictions" in va[k] and "predictions" in vb[k]]
        if not common:
            return None
        r = pooled_accuracy([([x == g for x, g in zip(va[k]["predictions"], gold)],
                              [x == g for x, g in zip(vb[k]["predictions"], gold)]) for k in common])
    else:
        common = [k for k in common if "row_ce" in va[k] and "row_ce" in vb[k]]
        if not common:
            return None
        r = pooled_ce([(va[k]["row_ce"], vb[k]["row_ce"]) for k in common])
    return {**r, "seed_ids": common}


def seeds_cell(c: dict[str, Any] | None) -> str:
    """The table's cell for rule P's outcome: the word, the pooled p, the seeds and each seed's direction."""
    if c is None:
        return "–"
    p = "< 0.0001" if c["p"] < 1e-4 else format(c["p"], ".2g")
    n = len(c["seeds"])
    if n == 1:
        return f"{c['word']} (p {p}, 1 seed)"
    signs = "".join("+" if x["diff"] > 0 else "-" if x["diff"] < 0 else "0" for x in c["seeds"])
    return f"{c['word']} (pooled p {p}, {n} seeds {signs})"


def vs(kind: str, a: dict[str, Any], b: dict[str, Any] | None, gold: list[str]) -> str:
    """The table's cell for a against b: the metric's outcome, and exact match's where there is one."""
    if b is None:
        return ""
    cell = outcome(compare(kind, a, b, gold))
    if "em_right" in (a.get("verdict") or {}):
        cell += "; EM " + outcome(compare(kind, a, b, gold, "exact_match"))
    return cell


def outcome(c: dict[str, Any] | None) -> str:
    if c is None:
        return "–"
    word = "win" if c["diff"] > 0 and c["p"] < 0.05 else "loss" if c["diff"] < 0 and c["p"] < 0.05 else "tie"
    p = "p < 0.0001" if c["p"] < 1e-4 else f"p {c['p']:.2g}"
    return f"{c['diff']:+.4f} ({p}, {word})"


QUICK_BOARD = ["recipe", "schedulefree", "leadline"]
"""``--quick-board``: the default command against the two defaults a user would otherwise type."""

BOARD_ARMS = ["recipe", "schedulefree", "schedulefree_algoperf", "prodigy", "leadline_run", "leadline"]
"""The arms of the README's table, one column each; ``leadline_held_out`` joins the ``leadline`` cell where it ran."""
"""The columns of the boards table: the defaults a user would type, today's leadline run (the
full effort) where the board ran it, and the default command ``leadline``."""


def board_name(data: dict[str, Any]) -> str:
    """The board as the tables name it: its task, its regime, a held card, and "CPU" where its
    runs trained on the CPU (the same board on a GPU is another row).

    Examples:
        >>> board_name({"task": "man_sections", "regime": "small", "machine": {"device": "cpu"}})
        'man_sections · small · CPU'
        >>> board_name({"task": "debian_sections", "card_gb": 6, "machine": {"device": "NVIDIA H100 80GB HBM3"}})
        'debian_sections · lora, 6 GB card'
    """
    regime = data.get("regime") or "lora"
    card = f", {data['card_gb']:g} GB card" if data.get("card_gb") else ""
    cpu = " · CPU" if (data.get("machine") or {}).get("device") == "cpu" else ""
    return f"{data['task']} · {regime}{card}{cpu}"


def cost_ratio(lead: dict[str, Any] | None, recipe: dict[str, Any] | None) -> str:
    """leadline's cost over the recipe's where both were timed alike: each its own process alone on
    the GPU (``--alone``), its wall seconds from the process's start (imports and the model's load
    included); "–" where either shared the GPU with another process (its seconds measured the
    sharing, not the run). Where leadline trained passes past its first (rule L in
    ``leadline.run.length``) and the recipe trained one, the ratio of its process less those passes'
    steps (``run.json``'s ``more_passes_seconds``) follows: what its process cost at the recipe's
    length.

    Examples:
        >>> cost_ratio({"cost": 90.0, "timed_alone": True, "run": {"more_passes_seconds": 30.0, "passes": 2}},
        ...            {"cost": 75.0, "timed_alone": True})
        '1.20x (alone; 0.80x less its second pass)'
    """
    if not lead or not recipe or not recipe.get("cost"):
        return "–"
    if not (lead.get("timed_alone") and recipe.get("timed_alone")):
        return "–"
    ratio = f"{lead['cost'] / recipe['cost']:.2f}x"
    run = lead.get("run") if isinstance(lead.get("run"), dict) else {}
    more, passes = run.get("more_passes_seconds") or 0.0, int(run.get("passes") or 1)
    if more > 0 and passes > 1:
        which = "its second pass" if passes == 2 else f"its passes 2-{passes}"
        return f"{ratio} (alone; {(lead['cost'] - more) / recipe['cost']:.2f}x less {which})"
    return f"{ratio} (alone)"


def rows_trained(unit: dict[str, Any] | None) -> str:
    """The rows a unit trained on, as it recorded them; a unit from before the record trained on
    leadline's split (the rows ``leadline`` trained on, less its held-out and test rows)."""
    if not unit:
        return "–"
    n = unit.get("train_rows")
    return f"{n:,}" if isinstance(n, int) else "leadline's split"


def aa_cell(kind: str, again: dict[str, Any] | None, first: dict[str, Any] | None, gold: list[str]) -> str:
    """The A/A control's cell: whether schedule-free's second process gave the first's answers
    (identical predictions, or identical row CE), else the difference and its p; and how it ran
    (alone on the GPU, or beside other processes).

    Examples:
        >>> v = {"metric": "accuracy", "predictions": ["a", "b"]}
        >>> aa_cell("classify", {"verdict": v, "dtype": ARM_DTYPE, "parallel": 3}, {"verdict": v, "dtype": ARM_DTYPE}, ["a", "b"])
        'identical (beside other processes)'
    """
    if not again or not first or not same_precision(again, first) or again.get("train_rows") != first.get("train_rows"):
        return "–"  # two precisions, or two sets of rows: not one method run twice
    how = ("alone" if again.get("timed_alone") else "beside other processes" if int(again.get("parallel") or 1) > 1
           else "one process at a time")
    va, vb = again.get("verdict") or {}, first.get("verdict") or {}
    key = "predictions" if kind == "classify" else "row_ce"
    if key in va and va.get(key) == vb.get(key):
        return f"identical ({how})"
    c = compare(kind, again, first, gold)
    if c is None:
        return "–"
    return f"differs: {c['diff']:+.4f} (p {'< 0.0001' if c['p'] < 1e-4 else format(c['p'], '.2g')}; {how})"


def seeds_value(data: dict[str, Any], units: dict[int, dict[str, Any]]) -> str:
    """An arm's test metric over its seeds: the one value, or the mean ± sd and the seeds' count;
    a collapse (rule C) at any seed named, and a seed judged as the untrained model (``leadline
    run`` kept no adapter) named."""
    vals = {k: (u.get("verdict") or {}).get((u.get("verdict") or {}).get("metric", "")) for k, u in units.items()}
    got = [x for x in vals.values() if isinstance(x, (int, float))]
    if not got:
        return "–"
    if len(got) == 1:
        cell = f"{got[0]:.4f}"
    else:
        mean = sum(got) / len(got)
        sd = math.sqrt(sum((x - mean) ** 2 for x in got) / (len(got) - 1))
        cell = f"{mean:.4f} ± {sd:.4f} ({len(got)} seeds, {min(got):.4f}..{max(got):.4f})"
    fell = [k for k, u in units.items() if collapsed(data, u.get("verdict") or {})]
    if fell:
        cell += " (collapse" + ("" if len(units) == 1 else " at seed " + ", ".join(map(str, fell))) + ")"
    kept_none = [k for k, u in units.items() if u.get("judged_as") == "untrained"]
    if kept_none:
        cell += " (no adapter kept, judged untrained: seed " + ", ".join(map(str, kept_none)) + ")"
    return cell


def same_precision(*units: dict[str, Any]) -> bool:
    """Every unit trained and judged in :data:`ARM_DTYPE` (each records it; a unit without the
    record ran before every arm shared one precision): the A/A control compares only such pairs.

    Examples:
        >>> same_precision({"dtype": "float32"}, {"dtype": "float32"}), same_precision({"dtype": "float32"}, {})
        (True, False)
    """
    return all(u.get("dtype") == ARM_DTYPE for u in units)


def as_users_compare(data: dict[str, Any]) -> bool:
    """A board whose schedule-free arm, or the sweep's, trained on every row given (its unit records
    ``train_rows``): the comparison a user makes. Boards from before that record gave every arm
    leadline's split.

    Examples:
        >>> as_users_compare({"units": {"schedulefree": {"train_rows": 2000}}}), as_users_compare({"units": {}})
        (True, False)
        >>> as_users_compare({"units": {"sf_sweep_lr0": {"train_rows": 320}}})
        True
    """
    return any(isinstance(unit.get("train_rows"), int) for name, unit in data["units"].items()
               if name == "schedulefree" or name.startswith("sf_sweep_"))


def board_row(data: dict[str, Any], tally: Counter) -> str:
    """One board's row of :func:`boards_table`; its outcomes against the recipe and schedule-free
    counted into ``tally``."""
    arms = arms_of(data)
    kind, gold = data["kind"], data.get("gold", [])
    metric = "accuracy ↑" if kind == "classify" else "test CE ↓"
    cells = [seeds_value(data, seed_units(data["units"], name)) for name in BOARD_ARMS]
    ran = seed_units(data["units"], "leadline")
    if ran and rules_version(next(iter(ran.values()))) < 3:  # not this version's rules: the cell says so
        cells[-1] += " (an earlier version's rules)"
    held = seed_units(data["units"], "leadline_held_out")
    if held:  # rule HO's comparison, in leadline's cell
        c = compare_seeds(kind, held, seed_units(data["units"], "leadline"), gold)
        cells[-1] += f"; --train-held-out {seeds_value(data, held)}: {seeds_cell(c)}"
    words = []
    for other in ("recipe", "schedulefree"):
        c = compare_seeds(kind, seed_units(data["units"], "leadline"), seed_units(data["units"], other), gold)
        tally[(other, c["word"] if c else "–")] += 1
        words.append(seeds_cell(c))
    sweep_cell, regrets = sweep_cells(data, tally)
    trained = " / ".join(rows_trained(arms.get(n)) for n in ("recipe", "schedulefree", "leadline"))
    ratio = cost_ratio(arms.get("leadline"), arms.get("recipe"))
    control = aa_cell(kind, arms.get("schedulefree_again"), arms.get("schedulefree"), gold)
    regime = data.get("regime") or "lora"
    made = f"`--task {data['task']}" + (f" --regime {regime}" if regime != "lora" else "") + (
        f" --card-gb {data['card_gb']:g}" if data.get("card_gb") else "") + "`"
    return (f"| {board_name(data)} | {metric} | " + " | ".join(cells)
            + f" | {words[0]} | {words[1]} | {sweep_cell} | {regrets} | {trained} | {ratio} | {control} | {made} |")


def sweep_cells(data: dict[str, Any], tally: Counter) -> tuple[str, str]:
    """The sweep's cell (the user's pick: its rate and passes and its metric on the rows it did not
    read; the ceiling beside it) and the regrets' cell (leadline, schedule-free at its defaults and
    the recipe against the pick, rule P on those rows); leadline's outcome counted into ``tally``
    under ``("sweep", word)``."""
    sw = sweep_result(data)
    if sw is None:
        return "–", "–"
    def name(u: str) -> str:
        return f"{sw['lr'][u]:.3g} x{sw['passes'][u]}"
    fmt = ".3f" if data["kind"] == "classify" else ".4f"
    cell = (f"{format(sw['metric_on_rest'][sw['pick']], fmt)} ({name(sw['pick'])}; ceiling "
            f"{format(sw['metric_on_rest'][sw['ceiling']], fmt)} at {name(sw['ceiling'])})")
    words = []
    for arm in ("leadline", "schedulefree", "recipe"):
        c = regret(data, arm)
        if arm == "leadline":
            tally[("sweep", c["word"] if c else "–")] += 1
        words.append(f"{arm}: {seeds_cell(c)}" if c else f"{arm}: –")
    return cell, "; ".join(words)


def boards_table(paths: list[Path]) -> str:
    """One row a board (task x regime): each arm's test metric (over its seeds where it ran
    several), then the default arm ``leadline`` against the recipe and against schedule-free at its
    defaults decided on the seeds together (rule P; one seed: rules W and L) and C (a collapse at
    any seed), the rows each of the three trained on, leadline's cost as a ratio of the recipe's
    where both were timed alone, and the A/A control. The boards that compare as users do
    (:func:`as_users_compare`) come first with their own tally; the earlier boards follow."""
    head = ("| board | metric | " + " | ".join(BOARD_ARMS) + " | leadline vs recipe | leadline vs schedulefree "
            "| the sweep's pick (ceiling) | against the pick | rows trained: recipe / schedulefree / leadline "
            "| leadline's cost / recipe's | A/A: schedulefree twice | the board's command |")
    rule = "|" + "---|" * (len(BOARD_ARMS) + 10)
    groups: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    mixed: list[str] = []  # boards whose arms trained or were judged at another precision than float32
    for path in paths:
        data = json.loads(path.read_text())
        arms = arms_of(data)
        if "leadline" not in arms and not any(a in arms for a in BASELINES[1:]):
            continue  # a board of the earlier arms only (docs/results.md keeps it)
        if any(name in arms and not same_precision(arms[name]) for name in ("recipe", "schedulefree", "leadline")):
            mixed.append(board_name(data))
        groups[as_users_compare(data)].append(data)
    lines: list[str] = []
    for users, boards in ((True, groups[True]), (False, groups[False])):
        if not boards:
            continue
        if lines:
            lines.append("The earlier boards: every arm trained on leadline's split, at one seed.")
            lines.append("")
        tally: Counter = Counter()
        lines += [head, rule, *(board_row(d, tally) for d in boards), ""]
        lines.append(("On these boards, " if users else "On the earlier boards, ") + "leadline against the recipe: "
                     + ", ".join(f"{tally[('recipe', w)]} {w}" for w in ("win", "tie", "loss"))
                     + "; against schedule-free at its defaults: "
                     + ", ".join(f"{tally[('schedulefree', w)]} {w}" for w in ("win", "tie", "loss")) + ".")
        swept = sum(tally[("sweep", w)] for w in ("win", "tie", "loss"))
        if swept:
            lines.append("")
            lines.append(f"against the swept optimum: {tally[('sweep', 'win')]} win, {tally[('sweep', 'tie')]} tie, "
                         f"{tally[('sweep', 'loss')]} loss on {swept} board{'s' if swept != 1 else ''}")
        lines.append("")
    if mixed:
        lines.append(f"Measured at mixed precision ({', '.join(mixed)}): their units written before the scoreboard "
                     "gave every arm the command line's float32 trained the schedule-free, AlgoPerf and Prodigy arms "
                     "on a bfloat16 base (leadline and the recipe on float32) and judged every arm on a bfloat16 "
                     "base; their comparisons between those two groups carry that difference. Every other board "
                     "trained and judged every arm it compares in float32.")
        lines.append("")
    lines.append("A win or loss: " + RULES["P"] + ". Rows trained: " + RULES["T"] + ". The A/A control: "
                 + RULES["AA"] + ". The sweep: " + RULES["SW"] + ".")
    return "\n".join(lines)


def table(paths: list[Path]) -> str:
    """The README's results: one table a task, from the tasks' results files, and where a task ran
    at more than one seed, the arms seed by seed (:func:`seeds_table`)."""
    boards = [(json.loads(path.read_text()), path) for path in paths]
    return "\n".join([*sweep_runs_table([d for d, _ in boards]), *(table_of(data, path) for data, path in boards),
                      *seeds_table(boards), *speed_table(boards)])


def sweep_runs_table(boards: Sequence[dict[str, Any]]) -> list[str]:
    """Every board with a sweep run: each of the sweep's runs (rate x passes) with its test metric on
    every test row, or why it has none (not run, or failed and the first line of why), beside
    schedule-free at its defaults and ``leadline run`` over their seeds. The pick and the regrets
    need the whole sweep (:func:`sweep_result`); this table shows a sweep before it is whole."""
    rows = []
    for data in boards:
        regime = data.get("regime") or "lora"
        runs = sweep_units(regime)
        if not any(u in data["units"] for u, _, _ in runs):
            continue
        cells = []
        for u, _, _ in runs:
            rec = data["units"].get(u)
            v = (rec or {}).get("verdict") or {}
            if rec is None:
                cells.append("not run")
            elif rec.get("failed") or not v:
                tail = ((rec.get("train") or {}).get("output_tail") or "").strip().splitlines()
                oom = any("out of memory" in t or "ALLOC_FAILED" in t for t in tail)  # cuBLAS's own, too
                cells.append("failed" + (": out of memory" if oom else ""))
            else:
                cells.append(f"{v[v['metric']]:.4f}")
        head = [f"{lr:.3g} x{p}" for _, lr, p in runs]
        rows.append((board_name(data), "accuracy ↑" if data["kind"] == "classify" else "test CE ↓", head, cells,
                     seeds_value(data, seed_units(data["units"], "schedulefree")),
                     seeds_value(data, seed_units(data["units"], "leadline"))))
    if not rows:
        return []
    out = ["**The sweep's runs** (schedule-free on every row, seed 0; rate x passes; the test metric on every "
           "test row; rule SW):", ""]
    for name, metric, head, cells, sf, lead in rows:
        out += [f"*{name}* ({metric}):", "", "| " + " | ".join([*head, "schedule-free (c x the board's passes)",
                                                                 "leadline"]) + " |",
                "|" + "---|" * (len(head) + 2), "| " + " | ".join([*cells, sf, lead]) + " |", ""]
    return out


def seconds_a_step(unit: dict[str, Any] | None) -> float | None:
    """The training loop's seconds per optimizer step, loads and reads left out: for ``leadline``
    its plan's ``run`` phase (the steps after the race), for a recipe-shaped arm its run's loop."""
    if not unit or unit.get("failed"):
        return None
    run = next((p for p in ((unit.get("plan") or {}).get("phases") or []) if p.get("phase") == "run"), None)
    if run is not None:
        return run["seconds"] / run["steps"] if run.get("steps") else None
    r = unit.get("run") or {}
    return r["seconds"] / r["steps"] if r.get("seconds") and r.get("steps") else None


def speed_table(boards: list[tuple[dict[str, Any], Path]]) -> list[str]:
    """Where leadline and the recipe were timed alike (:func:`cost_ratio`): each one's seconds a
    step of 16 rows, so the ratio is the two runs' tokens per second, and where leadline's process
    spent the rest (the load, the race's steps, its held-out reads)."""
    lines = ["", "**The plan's steps against the recipe's** (both 16 rows a step; the recipe's over its "
             "seconds a step is the ratio of their tokens per second; boards where the two were timed alike)", "",
             "| board | leadline s/step | recipe s/step | leadline's steps' speed | leadline's process: load, race "
             "(steps, reads), run | the recipe's process |", "|---|---|---|---|---|---|"]
    rows = 0
    for data, _ in boards:
        arms = arms_of(data)
        lead, recipe = arms.get("leadline"), arms.get("recipe")
        a, b = seconds_a_step(lead), seconds_a_step(recipe)
        if a is None or b is None or cost_ratio(lead, recipe) == "–":
            continue
        phases = {p["phase"]: p for p in lead["plan"]["phases"]}
        race = phases.get("rate", {})
        lines.append(f"| {board_name(data)} | {a:.3f} | {b:.3f} | {b / a:.2f}x | "
                     f"{(lead.get('run') or {}).get('load_seconds', 0):.0f} s, {race.get('seconds', 0):.1f} s "
                     f"({race.get('steps', 0)}, {race.get('reads', 0)} reads {race.get('read_seconds', 0):.1f} s), "
                     f"{phases.get('run', {}).get('seconds', 0):.1f} s | {recipe['cost']:.0f} s |")
        rows += 1
    return lines if rows else []


BASE_OF = {"leadline_full_to_zero": "leadline_full", "leadline_full_16rows_to_zero": "leadline_full_16rows",
           "leadline_full_rows_to_zero": "leadline_full_rows", "leadline_full_half_ending": "leadline_full"}
"""The arm each retrained arm's rule compares it with (rules E, Z and H)."""


def seeds_table(boards: list[tuple[dict[str, Any], Path]]) -> list[str]:
    """Each task and card run at two seeds or more: every arm's metric seed by seed with their mean
    and spread, and each comparison the rules read (leadline_full against the recipe and the swept
    optimum, each retrained arm against its base) seed by seed. A McNemar or paired t within one
    seed compares two trained models; whether an outcome holds for the procedure shows across seeds."""
    groups: dict[tuple[str, Any], dict[int, dict[str, Any]]] = {}
    for data, _ in boards:
        groups.setdefault((data["task"], data.get("card_gb")), {})[int(data.get("seed", 0))] = data
    lines: list[str] = []
    for (task, card), by_seed in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        if len(by_seed) < 2:
            continue
        seeds = sorted(by_seed)
        arms = {k: arms_of(d) for k, d in by_seed.items()}
        kind = next(iter(by_seed.values()))["kind"]
        metric = lambda a: (a.get("verdict") or {}).get((a.get("verdict") or {}).get("metric", ""))  # noqa: E731
        on = f", the card held to {card:g} GB" if card else ""
        lines += ["", f"**{task}**{on}, seed by seed ({'accuracy' if kind == 'classify' else 'test CE/token'})", "",
                  "| arm | " + " | ".join(f"seed {k}" for k in seeds) + " | mean ± sd |", "|---|" + "---|" * (len(seeds) + 1)]
        names = [n for n in ("recipe", "sweep", "schedulefree", "lr_find", "lr_find_log", "optuna", "pichak_quick",
                             "pichak_full",
                             "leadline_full", "leadline_run", "leadline_full_16rows",
                             "leadline_full_rows", *RETRAINED)
                 if sum(isinstance(metric(arms[k].get(n) or {}), (int, float)) for k in seeds) >= 2]
        for n in names:
            xs = {k: metric(arms[k].get(n) or {}) for k in seeds}
            got = [x for x in xs.values() if isinstance(x, (int, float))]
            mean = sum(got) / len(got)
            sd = math.sqrt(sum((x - mean) ** 2 for x in got) / (len(got) - 1))
            lines.append(f"| {n} | " + " | ".join(f"{x:.4f}" if isinstance(x, (int, float)) else "–" for x in xs.values())
                         + f" | {mean:.4f} ± {sd:.4f} |")
        pairs = [("leadline_full", "recipe"), ("leadline_full", "sweep"), *((r, b) for r, b in BASE_OF.items())]
        for a, b in pairs:
            words = []
            for k in seeds:
                c = compare(kind, arms[k][a], arms[k][b], by_seed[k].get("gold", [])) if a in arms[k] and b in arms[k] else None
                if c is not None:
                    words.append((k, outcome(c).rsplit(", ", 1)[-1].rstrip(")")))
            if len(words) >= 2:
                same = len({w for _, w in words}) == 1
                lines.append(f"- {a} against {b}: " + ", ".join(f"{w} at seed {k}" for k, w in words)
                             + (" (the same at every seed)" if same else " (the outcome moves with the seed)") + ".")
    return lines


def table_of(data: dict[str, Any], path: Path) -> str:
    lines: list[str] = []
    arms = arms_of(data)
    kind = data["kind"]
    metric = "accuracy" if kind == "classify" else "test CE/token"
    gold = data.get("gold", [])
    on = f", the card held to {data['card_gb']:g} GB" if data.get("card_gb") else ""
    on += f", seed {data['seed']}" if data.get("seed") else ""
    lines += [f"**{data['task']}**{on} ({data['train_rows']:,} rows given to every arm, each trains on what its unit "
              "records; "
              f"{data['test_rows']:,} test rows; {metric}"
              f"{', higher is better' if kind == 'classify' else ', lower is better'}; `{_shown(path)}`)", "",
              "| arm | " + metric + " | against the recipe | against the swept optimum | leadline_full against it "
              "| top answer | GPU s deciding + training |",
              "|---|---|---|---|---|---|---|"]
    order = ["untrained", "recipe", "sweep", "lr_find", "lr_find_log", "optuna", "schedulefree", "pichak_quick",
             "pichak_full",
             "leadline_full", "leadline_run", "leadline_full_16rows", "leadline_full_rows", *RETRAINED]
    full = arms.get("leadline_full")
    for name in order:
        if name not in arms:
            lines.append(f"| {name} | {_missing(data, name)} | | | | | |")
            continue
        a = arms[name]
        v = a.get("verdict") or {}
        val = v.get(v.get("metric", ""), float("nan"))
        extra = f" (EM {v['exact_match']:.3f})" if "exact_match" in v else ""
        vs_r = vs(kind, a, arms.get("recipe"), gold) if name not in ("recipe", "untrained") else ""
        vs_s = vs(kind, a, arms.get("sweep"), gold) if name not in ("sweep", "untrained") else ""
        vs_f = vs(kind, full, a, gold) if full is not None and name != "leadline_full" else ""
        top = f"{v['top_answer_share']:.0%}" if "top_answer_share" in v else ""
        if name != "untrained" and collapsed(data, v):
            top += " (collapse)"
        cost = "" if name == "untrained" else f"{a.get('decide_seconds', 0):.0f} + {a.get('train_seconds', 0):.0f}"
        if name in ("sweep", "optuna"):
            cost = f"{a['cost']:.0f} in all ({a['picked']})"
        lines.append(f"| {name} | {val:.4f}{extra} | {vs_r} | {vs_s} | {vs_f} | {top} | {cost} |")
    invocations = data.get("invocations") or [data]
    model = str(_arg(invocations[0]["command"], "--model") or "")
    lines.append(f"- Made by `{invocations[0]['command']}` on {data['machine'].get('device', 'an unknown machine')}, "
                 f"leadline at {str(data['commit'])[:7]}"
                 + (f", resumed in {len(invocations) - 1} more calls" if len(invocations) > 1 else "")
                 + "; the same command again resumes where it stopped.")
    if model.endswith(".gguf"):
        load = load_seconds(data)
        lines.append("- Every arm's processes load the model from its GGUF file"
                     + (f" ({load:.0f} s in leadline derive's own note)" if load is not None else "")
                     + ", counted in every arm's seconds: leadline's two processes pay it twice.")
    lines += [f"- {line}" for line in bar_of(data, arms)]
    lines += [f"- {line}" for line in cost_of(arms)]
    lines += [f"- {line}" for line in paired_rules(data, arms)]
    lines.append("")
    return "\n".join(lines)


PHASE_NAMES = {"noise": "the noise", "memory": "the memory ramp", "step": "the step's timings",
               "first_step": "the first step", "past_format": "the burn-in", "rate": "the look-ahead"}


def cost_of(arms: dict[str, dict[str, Any]]) -> list[str]:
    """Where leadline_full's seconds went, beside the recipe's: derive's process and its phases
    (the optimizer steps each ran), the training process and its steps, and whether the run
    continued from the look-ahead's steps or started over (and why)."""
    full = arms.get("leadline_full")
    plan = (full or {}).get("plan")
    if not isinstance(plan, dict) or not full.get("run"):
        return []
    phases = phase_seconds(plan)
    run = full["run"]
    line = (f"Where leadline_full's {full['cost']:.0f} s went: derive's process {full.get('decide_seconds', 0):.0f} s "
            f"(derive {plan.get('derive_seconds', 0):.0f} s: " + ", ".join(phases) + "; the rest its start and the "
            f"model's load), the training process {full.get('train_seconds', 0):.0f} s ({run['steps']} steps in "
            f"{run.get('seconds', 0):.0f} s)")
    recipe = arms.get("recipe")
    if recipe and recipe.get("run"):
        line += (f"; the recipe's one process {recipe['cost']:.0f} s ({recipe['run']['steps']} steps in "
                 f"{recipe['run'].get('seconds', 0):.0f} s)")
    kept = ((plan.get("values") or {}).get("lookahead_state_steps") or {})
    cont = run.get("continued") or {}
    if cont.get("from_step"):
        line += f". The run continued from the look-ahead's first {cont['from_step']} steps."
    elif kept.get("evidence", {}).get("why") or cont.get("why"):
        why = cont.get("why") or kept["evidence"]["why"]
        line += f". The run started over: {why}."
    else:
        line += "."
    return [line]


def phase_seconds(plan: dict[str, Any]) -> list[str]:
    """derive's phases of half a second or more, each with its seconds and optimizer steps."""
    out = []
    for ph in plan.get("phases") or []:
        if ph.get("phase") in PHASE_NAMES and ph.get("seconds", 0) >= 0.5:
            n = ph.get("steps") or 0
            steps = f" over {n} optimizer step{'s' if n != 1 else ''}" if n else ""
            out.append(f"{PHASE_NAMES[ph['phase']]} {ph['seconds']:.1f} s{steps}")
    return out


def paired_rules(data: dict[str, Any], arms: dict[str, dict[str, Any]]) -> list[str]:
    """Rules S, R, E and Z on this task: each pair's paired test, where both of its arms ran."""
    kind, gold = data["kind"], data.get("gold", [])
    pairs = [("S", "leadline_full_16rows", "leadline_full", "the recipe's 16 rows a step against the measured step"),
             ("R", "leadline_full_rows", "leadline_full", "the step for the rows against the least-time step"),
             ("E", "leadline_full_to_zero", "leadline_full", "the ending to zero against the raced ending"),
             ("E", "leadline_full_16rows_to_zero", "leadline_full_16rows",
              "the ending to zero against the raced ending, at 16 rows a step"),
             ("Z", "leadline_full_rows_to_zero", "leadline_full_rows",
              "the ending to zero against the raced ending, at the step for the rows"),
             ("H", "leadline_full_half_ending", "leadline_full",
              "the raced ending over the last half against the raced ending over two check intervals")]
    out = []
    for _rule, a, b, what in pairs:
        if a in arms and b in arms:
            c = compare(kind, arms[a], arms[b], gold)
            out.append(f"{what[0].upper()}{what[1:]} ({a} against {b}): {outcome(c) if c else '–'}.")
    picked = ending_pick(arms)
    if picked is not None:
        name, other, mine, theirs = picked
        c = compare(kind, arms[name], arms["leadline_full"], gold) if name != "leadline_full" else None
        out.append(f"Both endings raced on the held-out rows (the default ending, read on the "
                   f"runs of the last-half ending): the held-out rows pick {name}'s ending ({mine:.4f} against {theirs:.4f} for {other}'s)"
                   + (f"; on the test rows against leadline_full: {outcome(c)}." if c else ", leadline_full's own."))
    return out


def ending_pick(arms: dict[str, dict[str, Any]]) -> tuple[str, str, float, float] | None:
    """Rule L on recorded runs: of leadline_full (the ending raced over the last 2h) and
    leadline_full_half_ending (over the last half), the one whose kept ending read lower on the
    held-out rows — the ending racing both lengths keeps. Returns (picked, other, its loss, the
    other's), or None where either did not run or raced no ending."""
    def kept_loss(name: str) -> float | None:
        ending = ((arms.get(name) or {}).get("run") or {}).get("ending") or {}
        kept = ending.get(ending.get("kept", ""))
        return kept.get("loss") if isinstance(kept, dict) else None

    a, b = kept_loss("leadline_full"), kept_loss("leadline_full_half_ending")
    if a is None or b is None:
        return None
    if b < a:
        return "leadline_full_half_ending", "leadline_full", b, a
    return "leadline_full", "leadline_full_half_ending", a, b


def load_seconds(data: dict[str, Any]) -> float | None:
    """The model's load as leadline derive printed it ("loading the model and tokenizer before it
    N s"), from the first leadline arm that recorded its output."""
    for name in ("leadline_full",):
        tail = ((data["units"].get(name) or {}).get("derive") or {}).get("output_tail", "")
        m = re.search(r"loading the model and tokenizer before it ([\d.]+) s", tail)
        if m:
            return float(m.group(1))
    return None


def _arg(command: str, flag: str) -> str | None:
    parts = command.split()
    return parts[parts.index(flag) + 1] if flag in parts and parts.index(flag) + 1 < len(parts) else None


def failure(unit: dict[str, Any]) -> str:
    """Why a failed unit has no result, in one line: the error's first sentence (the run's own record
    before its output's last line), and the micro-batch it ran at when it got that far."""
    run = unit.get("run") or {}
    process = unit.get("train") or unit.get("derive") or unit.get("range_test") or {}
    why = str(run.get("error") or "")
    if not why:
        tail = str(process.get("output_tail", "")).strip().splitlines()
        why = tail[-1] if tail else "no output"
    why = re.split(r"(?<=[a-z0-9)])\. |: pass ", why, maxsplit=1)[0]
    why = why if len(why) < 120 else why[:117] + "..."
    if str(process.get("rc", "")).startswith("timeout"):  # the harness's limit, not the arm's own error
        limit = re.sub(r"^timeout( after)? ", "", str(process["rc"]))
        why = f"cut by the harness's limit of {limit} (its last line: {why})"
    if run.get("micro_batch"):
        why += f" (its micro-batch {run['micro_batch']} rows, {run.get('rows_per_step', run['micro_batch'])} a step)"
    return why


def _missing(data: dict[str, Any], name: str) -> str:
    """The cell of an arm that has no result: how far it got, or why it failed."""
    units = data["units"]
    if name in units and units[name].get("failed"):
        return "failed: " + failure(units[name])
    ran = sum(1 for k in units if k.startswith(name + "_") and k[len(name) + 1:].isdigit())
    n = len(data.get("sweep_rates", SWEEP_RATES)) if name == "sweep" else data.get("optuna_trials", OPTUNA_TRIALS)
    return f"{ran} of {n} runs so far" if ran else "not run"


def collapsed(data: dict[str, Any], verdict: dict[str, Any]) -> bool:
    """Rule C: one answer takes over 60% of the test rows on a task whose majority class is below 40%."""
    share = verdict.get("top_answer_share")
    if share is None:
        return False
    gold = data.get("gold") or []
    majority = Counter(gold).most_common(1)[0][1] / len(gold) if gold else 0.0
    return share > 0.6 and majority < 0.4


def bar_of(data: dict[str, Any], arms: dict[str, dict[str, Any]]) -> list[str]:
    """The bar leadline_full is judged by on this task, each part with its outcome (or what is missing)."""
    full = arms.get("leadline_full")
    if full is None:
        return []
    kind, gold = data["kind"], data.get("gold", [])

    def word(other: str) -> str:
        if other not in arms:
            return "not run yet"
        c = compare(kind, full, arms[other], gold)
        return outcome(c).rsplit(", ", 1)[-1].rstrip(")") if c else "–"

    failed_pichak = [n for n in ("pichak_quick", "pichak_full") if (data["units"].get(n) or {}).get("failed")]
    pichak = [n for n in ("pichak_quick", "pichak_full") if n in arms]
    best_pichak = None
    if pichak:
        sign = 1 if kind == "classify" else -1
        best_pichak = max(pichak, key=lambda n: sign * (arms[n].get("verdict") or {}).get(
            (arms[n].get("verdict") or {}).get("metric", ""), float("nan")))
    parts = [f"against the swept optimum: {word('sweep')} (the bar: no loss)",
             f"against the recipe: {word('recipe')} (the bar: a win on half the tasks, a loss on none)",
             "collapse: " + ("yes" if collapsed(data, full.get("verdict") or {}) else "none") + " (the bar: none)",
             "against pichak's best arm: " + (word(best_pichak) if best_pichak else
                                              "both of pichak's arms failed, no model to compare" if len(failed_pichak) == 2
                                              else "not run yet") + " (the bar: a win)"]
    if "recipe" in arms and arms["recipe"].get("cost"):
        parts.append(f"deciding + training {full['cost'] / arms['recipe']['cost']:.2f}x the recipe's one run "
                     "(the bar: at most 1.5x)")
        if "leadline_run" in arms:
            parts.append(f"in one process (`leadline run`) {arms['leadline_run']['cost'] / arms['recipe']['cost']:.2f}x")
    if "sweep" in arms:
        parts.append(f"{full['cost'] / arms['sweep']['cost']:.2f}x the sweep's {arms['sweep']['cost']:.0f} s")
    return ["leadline_full against the bar: " + "; ".join(parts) + "."]


def summary(paths: list[Path]) -> str:
    """One row a task and card: each arm's test metric, and leadline_full's outcome against the
    recipe and the swept optimum with its cost; the full tables are ``table``'s."""
    names = ["recipe", "sweep", "schedulefree", "lr_find", "optuna", "pichak_full", "leadline_full"]
    lines = ["| task (metric) | " + " | ".join(names) + " | leadline_full against the recipe / the sweep "
             "| leadline_full's cost (x the recipe) | file |", "|" + "---|" * (len(names) + 4)]
    for path in paths:
        data = json.loads(path.read_text())
        arms = arms_of(data)
        kind, gold = data["kind"], data.get("gold", [])
        cells = []
        for n in names:
            v = (arms.get(n) or {}).get("verdict") or {}
            failed = (data["units"].get(n) or {}).get("failed")
            cells.append(f"{v[v['metric']]:.3f}" if v.get("metric") in v else "failed" if failed else "–")
        full = arms.get("leadline_full")
        against = " / ".join(
            outcome(compare(kind, full, arms[o], gold)).rsplit(", ", 1)[-1].rstrip(")") if full and o in arms else "–"
            for o in ("recipe", "sweep"))
        cost = f"{full['cost'] / arms['recipe']['cost']:.1f}x" if full and "recipe" in arms else "–"
        task = data["task"] + (f" at {data['card_gb']:g} GB" if data.get("card_gb") else "") + (
            f", seed {data['seed']}" if data.get("seed") else "")
        metric = "accuracy" if kind == "classify" else "CE, lower better"
        lines.append(f"| {task} ({metric}) | " + " | ".join(cells) + f" | {against} | {cost} | `{path.name}` |")
    lines += ["", "Each row: `python3 benchmarks/scoreboard.py --task TASK [--card-gb 6] --model MODEL --data-dir DATA` "
              "(the exact command of each is in its file under `benchmarks/results/`); a dash has not run yet, "
              "\"failed\" ran and trained no model (why: `docs/results.md`). "
              "Every arm's p-values, costs and the bar: `docs/results.md`."]
    return "\n".join(lines)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def write_readme(readme: Path, text: str) -> None:
    s = readme.read_text()
    a, b = "<!-- scoreboard:start -->", "<!-- scoreboard:end -->"
    if a not in s or b not in s:
        raise SystemExit(f"{readme} has no {a} ... {b} markers; add them where the table goes")
    head, rest = s.split(a, 1)
    _, tail = rest.split(b, 1)
    readme.write_text(head + a + "\n" + text + "\n" + b + tail)


# ---- main ---------------------------------------------------------------------------------
SEEDED_ARMS = ("leadline", "schedulefree", "recipe", "leadline_held_out")
"""The arms ``--seeds K`` runs at K seeds: the default command, schedule-free at its defaults, and
the recipe, so that each seed's comparison pairs two runs of that seed (rule P)."""


def with_seeds(names: list[str], seeds: int) -> list[str]:
    """The arms to run with each seeded arm's units at seeds 1..K-1 after it (seed 0 is the plain unit).

    Examples:
        >>> with_seeds(["recipe", "prodigy", "leadline"], 3)
        ['recipe', 'recipe_seed1', 'recipe_seed2', 'prodigy', 'leadline', 'leadline_seed1', 'leadline_seed2']
        >>> with_seeds(["leadline"], 1)
        ['leadline']
    """
    out: list[str] = []
    for name in names:
        out.append(name)
        if name in SEEDED_ARMS:
            out += [f"{name}_seed{k}" for k in range(1, seeds)]
    return out


def with_sweep(names: list[str], regime: str) -> list[str]:
    """``sf_sweep`` expanded into its runs (:func:`sweep_units`), the longest first, so that side by
    side the last to start is a short one.

    Examples:
        >>> with_sweep(["recipe", "sf_sweep"], "lora")  # doctest: +NORMALIZE_WHITESPACE
        ['recipe', 'sf_sweep_ep5', 'sf_sweep_ep3', 'sf_sweep_lr0', 'sf_sweep_lr1', 'sf_sweep_lr2', 'sf_sweep_lr3',
         'sf_sweep_lr4']
    """
    out: list[str] = []
    for name in names:
        if name == "sf_sweep":
            out += [u for u, _, _ in sorted(sweep_units(regime), key=lambda x: -x[2])]
        else:
            out.append(name)
    return out


def run_arms(arms: Arms, board: Board, names: list[str], parallel: int = 1) -> None:
    """Each named arm in turn, or ``parallel`` of them side by side (threads that each wait on the
    arm's own processes; the judge and the board's file take one arm at a time). The sweep and
    Optuna run after the others, one unit at a time: each unit is a whole run."""
    table = {"recipe": arms.recipe, "sweep": arms.sweep, "lr_find": arms.lr_find, "lr_find_log": arms.lr_find_log,
             "optuna": arms.optuna, "leadline": arms.leadline_default,
             "leadline_held_out": lambda: arms.leadline_default("leadline_held_out"),
             "schedulefree": arms.schedulefree,
             "schedulefree_algoperf": lambda: arms.optimizer_arm("schedulefree_algoperf"),
             "prodigy": lambda: arms.optimizer_arm("prodigy"),
             "schedulefree_again": lambda: arms.optimizer_arm("schedulefree_again"),
             "leadline_full": lambda: arms.leadline_arm("full"), "leadline_run": arms.leadline_run,
             "leadline_full_16rows": lambda: arms.leadline_arm("full", 16), "pichak_quick": lambda: arms.pichak("quick"),
             "leadline_full_rows": lambda: arms.leadline_arm("full", step_for="rows"),
             "leadline_full_to_zero": lambda: arms.to_zero("leadline_full"),
             "leadline_full_16rows_to_zero": lambda: arms.to_zero("leadline_full_16rows"),
             "leadline_full_rows_to_zero": lambda: arms.to_zero("leadline_full_rows"),
             "leadline_full_half_ending": lambda: arms.ending_variant("leadline_full", "leadline_full_half_ending",
                                                                      ["--ending-share", "0.5"]),
             "pichak_full": lambda: arms.pichak("full")}
    for unit, _, _ in sweep_units(arms.regime):
        table[unit] = lambda u=unit: arms.sf_sweep_run(u)
    for name in names:  # <arm>_seed<k>: the seeded arm's unit at seed k
        base = re.sub(r"_seed\d+$", "", name)
        if base != name and base in SEEDED_ARMS:
            table[name] = {"leadline": lambda u=name: arms.leadline_default(u), "recipe": lambda u=name: arms.recipe(u),
                           "leadline_held_out": lambda u=name: arms.leadline_default(u),
                           "schedulefree": lambda u=name: arms.optimizer_arm(u)}[base]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"--arms {','.join(unknown)}: not an arm; pass some of {', '.join(table)}")

    def one(name: str) -> None:
        if arms.out_of_time():
            log(f"{name} not started: --stop-after reached; rerun the same command to go on")
            return
        if name not in ("sweep", "optuna") and not arms.fits(re.sub(r"_seed\d+$", "", name)):  # those two check each run
            return  # a shorter arm after it may still fit
        log("arm", name)
        try:
            table[name]()
        except Exception:  # recorded with the arm; the other arms still run
            with arms.lock:
                board.data.setdefault("failures", []).append({"arm": name, "traceback": traceback.format_exc()})
                board.save()
            log(name, "raised; recorded in failures")

    searches = [n for n in names if n in ("sweep", "optuna")]
    side_by_side = [n for n in names if n not in searches]
    if parallel > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=parallel) as pool:
            list(pool.map(one, side_by_side))
    else:
        for name in side_by_side:
            one(name)
    for name in searches:
        one(name)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="debian_sections")
    ap.add_argument("--model", default="/root/assets/smol.gguf")
    ap.add_argument("--data-dir", default="/root/assets/data")
    ap.add_argument("--out", help="the task's results JSON (default benchmarks/results/scoreboard_<task>.json)")
    ap.add_argument("--work", default="/tmp/scoreboard")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--quick-board", action="store_true",
                    help=f"the arms a board needs to say where leadline stands: {','.join(QUICK_BOARD)} (for --arms)")
    ap.add_argument("--regime", choices=tuple(REGIMES), default="lora",
                    help="; ".join(f"{k}: {v}" for k, v in REGIMES.items()))
    ap.add_argument("--parallel", type=int, default=1, metavar="N",
                    help="arms run as N processes side by side on the one GPU (the sweep and optuna stay one at a time)")
    ap.add_argument("--alone", action="store_true",
                    help="the caller runs nothing else on the GPU: the arms run one at a time (--parallel 1) and "
                    "each unit's seconds are recorded as timed alone, the cost ratio the README quotes")
    ap.add_argument("--train-rows", type=int, default=None,
                    help="training rows every arm gets (a seeded sample; default: the regime's, 2000 or 1000)")
    ap.add_argument("--seed", type=int, default=0,
                    help="every arm's seed: the split of the training rows into trained and held out, their order "
                    "and the adapter's init (the rows given and the test rows stay the same); a seed other than 0 "
                    "writes scoreboard_<task>[_6gb]_seed<N>.json by default")
    ap.add_argument("--test-rows", type=int, default=0, help="test rows (0: all)")
    ap.add_argument("--em-rows", type=int, default=200, help="gsm_symbolic: test rows judged by greedy exact match")
    ap.add_argument("--timeout", type=float, default=400)
    ap.add_argument("--card-gb", type=float, default=0.0,
                    help="a second process holds all but this many GB of the card while the arms run (a smaller card)")
    ap.add_argument("--recipe-micro-batch", type=int, default=None,
                    help="rows a forward pass for the recipe-shaped arms, the rest accumulated (default: 4 with "
                    "--card-gb, else the whole step at once)")
    ap.add_argument("--rerun", default="", help="arms whose recorded units are dropped and run again (after a "
                    "change to leadline, say), comma-separated; sweep and optuna drop all their units")
    ap.add_argument("--refresh", default="", help="arms whose units recorded no train_rows (trained on leadline's "
                    "split, before every comparison arm trained on every row) run again, comma-separated; units "
                    "that record it stay, so the same command resumes")
    ap.add_argument("--judge-tokens", type=int, default=None, metavar="N",
                    help="the most tokens one of the judge's scoring passes holds logits for (default: 4096 with "
                    "--card-gb, else 64 rows a pass); boards side by side on one card each hold a judge, and its "
                    "float32 logits over the vocabulary are most of its memory")
    ap.add_argument("--refresh-defaults", default="", help="leadline run arms whose units ran under other rules "
                    "than this version's (their run.json's rules) run again, comma-separated; the same command resumes")
    ap.add_argument("--smoke", action="store_true",
                    help="the harness's own check: every arm two steps, the sweep two rates, optuna two trials")
    ap.add_argument("--stop-after", type=float, default=1e9, help="start no new unit after this many seconds")
    ap.add_argument("--deadline", type=float, default=None,
                    help="the seconds this call may run: an arm whose recorded run (on this task's board, "
                    "else another's) would end past it is not started, and the arms after it are tried")
    ap.add_argument("--table", action="store_true", help="print the results table from benchmarks/results/scoreboard_*.json")
    ap.add_argument("--readme", help="with --table: write the one-row-a-task summary into this file between the "
                    "scoreboard markers")
    ap.add_argument("--results", help="with --table: write the full tables into this file between the markers")
    ap.add_argument("--seeds", type=int, default=1, metavar="K",
                    help=f"the seeded arms ({', '.join(SEEDED_ARMS)}) run at seeds 0..K-1: seed 0 is the plain unit, "
                    "seed k the unit <arm>_seed<k> beside it; the table decides their comparisons on the seeds "
                    "together (rule P)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--lr", type=float, default=2e-4, help=argparse.SUPPRESS)
    ap.add_argument("--rows-per-step", type=int, default=16, help=argparse.SUPPRESS)
    ap.add_argument("--warmup-ratio", type=float, default=0.03, help=argparse.SUPPRESS)
    ap.add_argument("--validation", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--passes", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--train", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick_board:
        args.arms = ",".join(QUICK_BOARD)
    if args.alone and args.parallel != 1:
        ap.error("--alone times each arm by itself; leave --parallel out or pass --parallel 1")
    if args.seeds > 1 and args.seed != 0:
        ap.error("--seeds K runs the seeded arms at seeds 0..K-1 in one board; leave --seed out")
    if args.recipe_micro_batch is None and args.card_gb > 0:
        args.recipe_micro_batch = 4
    if args.worker:
        # --smoke: the fewest steps each worker can answer from (Lightning's suggestion skips the
        # range test's first 10 points and needs two after them)
        if args.worker == "lr_find":
            worker_lr_find(args.model, args.train, Path(args.worker_out), args.recipe_micro_batch,
                           16 if args.smoke else None, args.seed, args.regime)
        elif args.worker == "recipe":
            worker_recipe(args.model, args.train, Path(args.worker_out), args.lr, args.rows_per_step, args.warmup_ratio,
                          args.recipe_micro_batch, 2 if args.smoke else None, args.seed, args.regime, args.validation)
        else:
            worker_optimizer(args.worker, args.model, args.train, Path(args.worker_out), args.recipe_micro_batch,
                             2 if args.smoke else None, args.seed, args.regime, args.lr, args.passes)
        return 0
    if args.table:
        paths = sorted(RESULTS.glob("scoreboard_*.json"))
        text = table(paths)
        if args.readme:
            write_readme(Path(args.readme), boards_table(paths))
        if args.results:
            write_readme(Path(args.results), text)
        print(text)
        return 0
    sys.path.insert(0, str(ROOT / "src"))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    if args.train_rows is None:
        args.train_rows = REGIME_ROWS[args.regime]
    task = load_task(args.task, Path(args.data_dir), args.train_rows, args.test_rows)
    card = f"_{args.card_gb:g}gb" if args.card_gb > 0 else ""
    seeded = f"_seed{args.seed}" if args.seed else ""
    regime = f"_{args.regime}" if args.regime != "lora" else ""
    out = Path(args.out or RESULTS / f"scoreboard_{args.task}{regime}{card}{seeded}.json")
    board = Board(out, task, argv)
    if out.exists() and int(board.data.get("seed", 0)) != args.seed:  # a file from before --seed holds seed 0
        print(f"{out} holds seed {board.data.get('seed', 0)}'s arms, not --seed {args.seed}: pass --out with a new file "
              "for this seed", file=sys.stderr)
        return 2
    board.data["seed"] = args.seed
    board.data["card_gb"] = args.card_gb or None
    board.data["dtype"] = ARM_DTYPE  # every arm trained and judged in it
    board.data["regime"] = args.regime
    board.data["regime_is"] = REGIMES[args.regime]
    if args.regime == "full":  # a full fine-tune's rates sit 10x below LoRA's: the sweep's grid moves with them
        board.data.setdefault("sweep_rates", [r / 10 for r in (SWEEP_RATES[::7] if args.smoke else SWEEP_RATES)])
    board.data.setdefault("sweep_rates", SWEEP_RATES[::7] if args.smoke else SWEEP_RATES)
    board.data.setdefault("optuna_trials", 2 if args.smoke else OPTUNA_TRIALS)
    if task["kind"] == "classify":
        board.data["gold"] = [r["label"] for r in task["test"]]
    board.data.setdefault("pick_rows", pick_rows(len(task["test"])))  # the sweep's pick reads these test rows
    board.rerun = (drop_units(board.data, args.rerun) | drop_stale(board.data, args.refresh)
                   | drop_earlier_defaults(board.data, args.refresh_defaults))
    board.save()
    judge = Judge(args.model, task, args.em_rows,
                  token_budget=args.judge_tokens or (4096 if args.card_gb > 0 else None))
    arms = Arms(args, task, board, judge)
    arms.untrained()
    holder = hold_card(args.card_gb) if args.card_gb > 0 else None  # after the judge's model: the arms see the small card
    run_arms(arms, board, with_sweep(with_seeds(args.arms.split(","), args.seeds), args.regime), args.parallel)
    if holder is not None:
        holder.stdin.close()
        holder.wait(timeout=30)
    log("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
