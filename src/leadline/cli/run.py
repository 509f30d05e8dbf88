"""``leadline run``: derive the plan, then train with it, in one process on one load of the model.

The same as ``leadline derive --out DIR/plan.json`` followed by ``leadline train --plan
DIR/plan.json --out DIR``, without loading the model and tokenizer a second time. The loaded model
can be trained after derive because derive_for leaves it as it found it: derive() puts the
trained tensors, the optimizers and the RNG states back on every exit path
(:func:`leadline.derive.no_trace.leave_no_trace`), derive_for puts the train/eval mode back and
clears the grads, and nothing in derive steps the frozen weights. The run starts from the weights
a fresh load gives and continues from the look-ahead's branch derive kept in ``DIR/plan.state``;
``tests/test_cli_run.py`` checks that the plan and the trained adapter equal the two commands'.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from leadline.cli._common import add_model_arguments
from leadline.cli.derive import add_html_argument, add_plan_arguments
from leadline.cli.train import add_ending_argument, check_ending_share, ending_flag

PLAN = "plan.json"
REPORT = "report.html"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_plan_arguments(p, effort="race", efforts=("race", "quick", "full"),
                       effort_help="race: schedule-free AdamW, its rate raced on the run's opening steps and the "
                       "winner's steps kept, in at most --decide-share of the run; quick: alpha1 and an AdamW rate "
                       "grid raced inside the run; full: the look-ahead measures the rate and the run continues from "
                       "its steps")
    p.add_argument("--decide-share", type=float, default=0.2, metavar="S",
                   help="with --effort race: the share of the run's steps the decision may spend on steps it does not "
                   "keep (default %(default)s)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help=f"a new or empty folder for the plan ({PLAN}), the adapter (or weights) and run.json")
    add_html_argument(p)
    add_ending_argument(p)
    # what `leadline derive` has and `leadline run` does not: a run derives afresh, at the model's own rank
    p.set_defaults(resume=None, prior=None, fit_rank=False)


def run(args: argparse.Namespace) -> int:
    from leadline.cli._common import check_device, check_out_file, check_out_folder, resolve_html
    from leadline.cli.derive import check_plan_inputs
    from leadline.distributed.world import launched_by_torchrun
    from leadline.errors import InputError

    out = Path(args.out)
    check_out_folder("--out", out)  # first: a refusal costs nothing and leaves nothing behind
    args.html = resolve_html(args.html, out)
    if args.html is not None and args.html.parent != out:
        check_out_file("--html", args.html)
    if launched_by_torchrun():
        raise InputError("leadline run trains in one process, and this is one of several under torchrun; run it "
                         "without torchrun, or derive the plan with `torchrun ... -m leadline derive` and train it "
                         "with Trainer (docs/distributed.md)")
    check_plan_inputs(args)
    check_ending_share(args)
    asked = ending_flag(args)
    if asked and args.effort == "quick":
        raise InputError(f"{asked} sets the LookaheadSchedule's ending, and --effort quick races its rates inside the "
                         f"run instead; pass --effort full or leave {asked.split()[0]} out")
    if args.average_ending and args.effort != "quick":
        raise InputError("--average-ending races the averaged weights inside the quick effort's race, and --effort "
                         f"{args.effort} runs the LookaheadSchedule; pass --effort quick or leave --average-ending out")
    if args.effort == "race":
        if not 0 <= args.decide_share < 1:
            raise InputError(f"--decide-share {args.decide_share:g} must be a share in [0, 1); pass 0.2 (the default) "
                             "or 0 for no race")
        if args.max_seconds is not None or args.quantile is not None or args.step_for is not None:
            raise InputError("--max-seconds, --quantile and --step-for shape the quick and full efforts' derive; "
                             "--effort race (the default) has no derive apart from the run: leave them out")
    check_device(args.device)
    made = not out.exists()
    try:
        return _run_race(args, out) if args.effort == "race" else _run(args, out)
    except BaseException:
        if made and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # the folder this command made, before anything whole was written in it
        raise


def _run(args: argparse.Namespace, out: Path) -> int:
    import contextlib
    import time

    from leadline.cli._common import Progress, load_for_training, ram_bound
    from leadline.cli.derive import derive_plan, note_plan, state_path, write_plan
    from leadline.cli.train import ending_of, print_run, show_step
    from leadline.derive.state import keep_run_state
    from leadline.train import train_with_plan

    plan_path = out / PLAN
    keep = keep_run_state(state_path(plan_path)) if args.effort == "full" else contextlib.nullcontext()
    t_load = time.perf_counter()
    with ram_bound(args.device), keep as kept:  # on the CPU: an allocation past the RAM is a sentence
        model, tok = load_for_training(args)
        t_derive = time.perf_counter()
        plan = derive_plan(args, model, tok, Progress())
        seconds = {"load_seconds": t_derive - t_load, "derive_seconds": time.perf_counter() - t_derive}
        note_plan(args, plan, seconds["derive_seconds"], seconds["load_seconds"], command="run")
        out.mkdir(exist_ok=True)
        state = write_plan(plan, plan_path, kept, html=out / REPORT if args.html else None,
                           continued_by="the run below continues from them")
        print()
        t_train = time.perf_counter()
        # the model derive measured, as derive_for left it: the weights a fresh load gives
        res = train_with_plan(model, tok, args.data, plan, out_dir=out, on_step=show_step, state=state,
                              ending=ending_of(args), ending_share=args.ending_share,
                              average_ending=args.average_ending)
        seconds["train_seconds"] = time.perf_counter() - t_train
    _add_seconds(out / "run.json", seconds)
    print_run(res, out)
    print(f"derive {seconds['derive_seconds']:.1f} s + train {seconds['train_seconds']:.1f} s "
          f"(+ load {seconds['load_seconds']:.1f} s, once)")
    return 0


def _run_race(args: argparse.Namespace, out: Path) -> int:
    """The default: one load, the opening race, the run (:func:`leadline.run.one.run_in_one`)."""
    import time

    from leadline.cli._common import fields_of, load_for_training, ram_bound
    from leadline.run.one import run_in_one
    from leadline.progress import StepBar

    t_load = time.perf_counter()
    with ram_bound(args.device):
        model, tok = load_for_training(args)
        load = time.perf_counter() - t_load
        out.mkdir(exist_ok=True)
        bar = StepBar()  # a tqdm bar on a terminal, a line every 10 steps elsewhere
        try:
            plan, res = run_in_one(model, tok, args.data, total_steps=args.steps, epochs=args.epochs,
                                   rows_per_step=args.rows_per_step, decide_share=args.decide_share,
                                   seed=args.seed, seq_len=args.seq_len, out_dir=out, on_step=bar,
                                   fields=fields_of(args) or None)
        finally:
            bar.close()
        if args.html is not None:
            from leadline.report.html import write_html

            write_html(plan, args.html)
    total = time.perf_counter() - t_load
    _add_seconds(out / "run.json", {"load_seconds": load, "derive_seconds": plan.derive_seconds or 0.0,
                                    "train_seconds": total - load - (plan.derive_seconds or 0.0)})
    print(plan.report(long=False, path=str(out / PLAN)))
    cost = res["cost"]
    rows = res["micro_batch"] * res["grad_accum"]
    import textwrap

    print(textwrap.fill(f"the rate: {plan['lr'].source}", width=99, subsequent_indent="  "))
    ran = res["steps"] - cost.get("steps_not_run", 0)
    print(f"lr {res['lr']:.3g}, schedule-free AdamW, {res['steps']} steps of {rows} rows"
          + (f" planned, {ran} run (the pass rule stopped it)" if ran < res["steps"] else ""))
    print(f"the decision's overhead: {cost['overhead_steps']} steps not kept ({cost['overhead_share']:.0%} of the "
          f"run), {cost['held_out_reads']} held-out reads")
    if "kept_step" in plan.values:  # a run of several passes: which pass is the model, and why
        print(textwrap.fill(f"the pass: {plan['kept_step'].source}", width=99,
                            subsequent_indent="  "))
    if "test_loss_after" in res:
        t = res["test_loss_after"]
        print(f"test loss after the run {t['mean']:.4f} ± {t['se']:.4f} on {res['test_rows']} rows no decision read")
    print(f"load {load:.1f} s + run {total - load:.1f} s; wrote {out}")
    return 0


def _add_seconds(run_json: Path, seconds: dict[str, Any]) -> None:
    """``run.json`` with the one load's, the derive's and the training call's wall seconds
    (the training call: the test reads before and after, the steps, the save), so the whole
    cost is read from one file."""
    import json

    from leadline._io import write_atomic

    record = json.loads(run_json.read_text(encoding="utf-8"))
    record.update({k: round(v, 3) for k, v in seconds.items()})
    write_atomic(run_json, json.dumps(record, indent=1, default=str))
