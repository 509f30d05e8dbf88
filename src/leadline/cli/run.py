"""``leadline run``: one load, the rate raced on the run's opening steps, the run under the guard.

The default (``--effort race``) is :func:`leadline.run.run_in_one`: schedule-free AdamW, its rate
raced on the run's opening steps (or given with ``--lr``), the winner's steps kept, the run read on
held-out rows at checks spread over it and rolled back where it worsens, the kept model read
against the start. It exits 0 when the kept model improved on the start, 3 when it did not or its
answers collapsed (the sentence says which and what to try), 2 on bad input. ``--effort full``
derives a plan and trains it in the same process, as ``leadline derive`` then ``leadline train``
would.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leadline.cli._common import add_model_arguments
from leadline.cli.derive import add_html_argument, add_plan_arguments
from leadline.cli.train import add_ending_argument, check_ending_share, ending_flag

if TYPE_CHECKING:
    from leadline.run import RunOptions

PLAN = "plan.json"
REPORT = "report.html"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from leadline.rate.opening import DECIDE_SHARE

    add_model_arguments(p, bundled=True)
    lookahead = add_plan_arguments(p, effort="race", efforts=("race", "full"),
                                   effort_help="race: schedule-free AdamW, its rate raced on the run's opening steps "
                                   "and the winner's steps kept, in at most --decide-share of the run; full: the "
                                   "look-ahead measures the rate and the run continues from its steps")
    p.add_argument("--decide-share", type=float, default=DECIDE_SHARE, metavar="S",
                   help="the share of the run's steps the opening race may spend on steps it does not keep (default "
                   "%(default)s; 0: no race)")
    p.add_argument("--lr", type=float, default=None, metavar="X",
                   help="train at this rate (no race), under the same guard (default: none, the race decides; "
                   "--effort full refuses it)")
    p.add_argument("--test-share", type=float, default=0.0, metavar="S",
                   help="keep this share of the rows out of training and deciding, and read the model on them before "
                   "and after (default: none; every row not held out for the decisions trains; --effort full "
                   "refuses it)")
    p.add_argument("--eval", default=None, metavar="FILE",
                   help="your own rows (the training data's format) to read the model on before and after the run "
                   "(default: none; --effort full refuses it)")
    p.add_argument("--train-held-out", action=argparse.BooleanOptionalAction, default=None,
                   help="after the opening race, the held-out rows the guard's checks do not read train too, late in "
                   "the first pass; the checks and the verdict read the rest (default: on; --no-train-held-out keeps "
                   "every held-out row out of training; --effort full refuses either)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help=f"a new or empty folder for the plan ({PLAN}), the adapter (or weights) and run.json")
    add_html_argument(p)
    add_ending_argument(lookahead)
    # what `leadline derive` has and `leadline run` does not: a run derives afresh, at the model's own rank
    p.set_defaults(resume=None, prior=None, fit_rank=False)


def run(args: argparse.Namespace) -> int:
    from leadline.cli._common import check_device, check_out_file, check_out_folder, resolve_html
    from leadline.cli.derive import check_effort, check_plan_inputs
    from leadline.errors import InputError
    from leadline.rate.opening import DECIDE_SHARE
    from leadline.torchrun import launched_by_torchrun

    check_effort(args)
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
    if args.effort != "race":
        for flag, given in (("--lr", args.lr is not None), ("--test-share", args.test_share),
                            ("--eval", args.eval is not None),
                            ("--train-held-out", args.train_held_out is not None)):
            if given:
                raise InputError(f"{flag} belongs to --effort race (the default); --effort {args.effort} derives and "
                                 f"trains a plan: leave {flag} out or drop --effort")
    if args.effort == "race":
        if asked:
            raise InputError(f"{asked} sets the LookaheadSchedule's ending, and --effort race trains schedule-free "
                             f"AdamW, whose averaged weights need no ending; pass --effort full or leave "
                             f"{asked.split()[0]} out")
        if args.lr is not None and not (args.lr > 0 and args.lr < float("inf")):
            raise InputError(f"--lr {args.lr:g} must be a positive rate; pass e.g. --lr 0.001")
        if not 0 <= args.test_share < 0.5:
            raise InputError(f"--test-share {args.test_share:g} must be a share in [0, 0.5); pass e.g. 0.1")
        if args.eval is not None and args.test_share:
            raise InputError("--eval gives the rows to read the model on, and --test-share asks for a share of the "
                             "training rows for the same: pass one of them")
        if args.eval is not None and not Path(args.eval).is_file():
            raise InputError(f"--eval {args.eval}: no such file; pass a JSONL file of rows in the training data's "
                             "format")
        if not 0 <= args.decide_share < 1:
            raise InputError(f"--decide-share {args.decide_share:g} must be a share in [0, 1); pass {DECIDE_SHARE:g} "
                             "(the default) or 0 for no race")
        if args.max_seconds is not None or args.quantile is not None or args.step_for is not None:
            raise InputError("--max-seconds, --quantile and --step-for shape the full effort's derive; --effort race "
                             "(the default) has no derive apart from the run: leave them out or pass --effort full")
    check_device(args.device)
    made = not out.exists()
    try:
        return _run_race(args, out) if args.effort == "race" else _run(args, out)
    except BaseException:
        if made and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # the folder this command made, before anything whole was written in it
        raise


def _run(args: argparse.Namespace, out: Path) -> int:
    """``--effort full``: one load, derive_for's plan written, then train_with_plan continuing from
    the look-ahead's kept branch."""
    import time

    from leadline.cli._common import load_for_training, lora_values_of, ram_bound
    from leadline.cli.derive import derive_plan, keep_state, note_plan, phase_bar, state_path, write_plan
    from leadline.cli.train import ending_of, print_run, show_step
    from leadline.train import train_with_plan

    plan_path = out / PLAN
    keep = keep_state(state_path(plan_path))
    t_load = time.perf_counter()
    with ram_bound(args.device), keep as kept:  # on the CPU: an allocation past the RAM is a sentence
        model, tok = load_for_training(args)
        t_derive = time.perf_counter()
        plan = derive_plan(args, model, tok, phase_bar())
        plan.values.update(lora_values_of(args, model))
        seconds = {"load_seconds": t_derive - t_load, "derive_seconds": time.perf_counter() - t_derive}
        note_plan(args, plan, seconds["derive_seconds"], seconds["load_seconds"], command="run")
        out.mkdir(exist_ok=True)
        state = write_plan(plan, plan_path, kept, html=out / REPORT if args.html else None,
                           continued_by="the run below continues from them")
        print()
        t_train = time.perf_counter()
        # the model derive measured, as derive_for left it: the weights a fresh load gives
        res = train_with_plan(model, tok, args.data, plan, out_dir=out, on_step=show_step, state=state,
                              ending=ending_of(args), ending_share=args.ending_share, record=seconds)
        seconds["train_seconds"] = time.perf_counter() - t_train
    print_run(res, out)
    print(f"derive {seconds['derive_seconds']:.1f} s + train {seconds['train_seconds']:.1f} s "
          f"(+ load {seconds['load_seconds']:.1f} s, once)")
    return 0


def _run_race(args: argparse.Namespace, out: Path) -> int:
    """The default: one load, the opening race (or the given rate), the guarded run
    (:func:`leadline.run.run_in_one`); ``run.json`` written once, with the load's seconds in it."""
    import time

    from leadline.cli._common import load_for_training, lora_values_of, model_record, process_seconds, ram_bound
    from leadline.progress import StepBar
    from leadline.run import run_in_one
    from leadline.run.card import write_card
    from leadline.run.result import EXIT_NOT_IMPROVED

    options = run_options(args)
    before_load = process_seconds()  # the interpreter, the imports and the checks before the model's load
    t_load = time.perf_counter()
    with ram_bound(args.device):
        model, tok = load_for_training(args)
        load = time.perf_counter() - t_load
        out.mkdir(exist_ok=True)
        bar = StepBar()  # a tqdm bar on a terminal, a line every 10 steps elsewhere
        try:
            plan, res = run_in_one(model, tok, args.data, options, out_dir=out, on_step=bar, load_seconds=load)
        finally:
            bar.close()
        plan.model.update(model_record(args))
        plan.values.update(lora_values_of(args, model))  # the adapter's rank and alpha, given or leadline's default
        plan.to_json(out / PLAN)
        if res.outcome != "no_better_than_start":  # the model was written (run_in_one): its card, with these kinds
            write_card(out, plan, res.as_dict(), model)
        if args.html is not None:
            from leadline.report.html import write_html

            write_html(plan, args.html, run=res.as_dict())
        _name_every_second(out, res, before_load, time.perf_counter() - t_load - load - res.seconds["run_seconds"])
    print(plan.report(long=False, path=str(out / PLAN)))
    for note in res.data_notes:  # what leadline changed in the rows, on stderr as every command says it
        print(f"leadline run: note: {note}", file=sys.stderr)
    print("\n".join(res.lines(plan)))
    print(f"load {load:.1f} s + run {time.perf_counter() - t_load - load:.1f} s; wrote {out}")
    return 0 if res.improved else EXIT_NOT_IMPROVED


def _name_every_second(out: Path, res: Any, before_load: float | None, after_run: float) -> None:
    """``run.json`` written again with the process's every second named: before the load (the
    interpreter, the imports, the checks), the load, the run's own (``run_seconds``, its parts beside
    it), the writing after it (the plan, the adapter's card, the report), and the whole process."""
    import json

    from leadline._io import write_atomic
    from leadline.cli._common import process_seconds

    record = res.as_dict()
    record.update({k: round(v, 3) for k, v in (("before_load_seconds", before_load), ("after_run_seconds", after_run),
                                               ("process_seconds", process_seconds())) if v is not None})
    write_atomic(out / "run.json", json.dumps(record, indent=1, default=str))


def run_options(args: argparse.Namespace) -> RunOptions:
    """The default run's :class:`~leadline.run.RunOptions` from its flags: a flag left out is
    None, and RunOptions falls back on the recipe's constant (the rows a step, the decide share);
    ``--train-held-out`` is on unless ``--no-train-held-out``; ``--lr`` is a given rate, no race."""
    from leadline.cli._common import fields_of
    from leadline.plan import Value
    from leadline.run import RunOptions

    rate = (Value(args.lr, "given", "the caller's rate (--lr): no race; the guard checks the run all the same",
                  unit="per step") if args.lr is not None else None)
    return RunOptions(total_steps=args.steps, epochs=args.epochs, rows_per_step=args.rows_per_step,
                      decide_share=args.decide_share, seed=args.seed, seq_len=args.seq_len,
                      fields=fields_of(args) or None, test_share=args.test_share, eval_data=args.eval,
                      train_held_out=args.train_held_out is not False, rate=rate)
