"""``leadline train``: the reference run with a plan and the look-ahead schedule."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, Literal

from leadline.cli._common import Spelled, add_model_arguments, add_old_spelling

if TYPE_CHECKING:
    import os

    from leadline.cli._common import DataRows
    from leadline.plan import Plan


RECIPE = {"lr": 2e-4, "rows_per_step": 16, "warmup_ratio": 0.03}
"""The default recipe ``--recipe`` trains (its flags' defaults)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--plan", required=True, metavar="PLAN",
                   help="the plan `leadline derive --out DIR` wrote for this model and data: DIR, or DIR/plan.json")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="a new or empty folder for the adapter (or weights) and run.json")
    p.add_argument("--steps", type=int, metavar="N", help="optimizer steps (default: the plan's total_steps)")
    p.add_argument("--state", metavar="DIR",
                   help="the look-ahead's branch `leadline derive` kept beside the plan, to continue from "
                   "(default: the plan's name with .state, when it exists)")
    p.add_argument("--fresh", action="store_true",
                   help="start from the model's weights even where derive kept the look-ahead's branch")
    p.add_argument("--no-schedule", action="store_true",
                   help="train at the plan's rate without the LookaheadSchedule (not advised)")
    add_ending_argument(p)
    p.add_argument("--recipe", action="store_true",
                   help="ignore --plan's numbers and train the default recipe by the same path: "
                   "AdamW at --lr, --rows-per-step rows a step, --warmup-ratio warmup, linear decay to zero (for "
                   "comparisons)")
    p.add_argument("--lr", type=float, help=f"with --recipe: the rate (default {RECIPE['lr']:g})")
    p.add_argument("--rows-per-step", type=int, metavar="N", action=Spelled,
                   help=f"with --recipe: rows an optimizer step (default {RECIPE['rows_per_step']})")
    add_old_spelling(p, "--batch", "rows_per_step")
    p.add_argument("--warmup-ratio", type=float,
                   help=f"with --recipe: the warmup's share of the steps (default {RECIPE['warmup_ratio']:g})")
    p.add_argument("--micro-batch", type=int, metavar="M",
                   help="with --recipe: rows a forward pass, dividing --rows-per-step (the rest accumulated; default: "
                   "the most rows, dividing --rows-per-step, that the plan's ramp measured the card holds, else "
                   "--rows-per-step)")


def add_ending_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ending", choices=("raced", "to-zero"), default="raced",
                   help="raced (default): the schedule reruns its last steps with the rate decaying and keeps the "
                   "better ending by a test on the held-out rows; to-zero: the rate falls linearly to zero over the "
                   "run, under the same checks, nothing raced (docs/rate.md)")
    p.add_argument("--ending-share", type=float, metavar="S",
                   help="the share of the run the raced ending reruns with the rate decaying (e.g. 0.5: the last "
                   "half; default: the last half and the last two check intervals, both raced)")


def ending_flag(args: argparse.Namespace) -> str | None:
    """The ending flag the user set (to name it in a refusal), or None for the default ending."""
    if args.ending != "raced":
        return f"--ending {args.ending}"
    return None if args.ending_share is None else f"--ending-share {args.ending_share:g}"


def check_ending_share(args: argparse.Namespace) -> None:
    from leadline.errors import InputError

    if args.ending_share is None:
        return
    if not 0 < args.ending_share < 1:
        raise InputError(f"--ending-share {args.ending_share:g} must be a share of the run between 0 and 1; pass e.g. "
                         "--ending-share 0.5 for the last half")
    if args.ending != "raced":
        raise InputError(f"--ending-share sets the raced ending's length, and --ending {args.ending} races none; drop "
                         "one of them")


def ending_of(args: argparse.Namespace) -> Literal["raced", "to_zero"]:
    """--ending as the schedule names it (``raced`` or ``to_zero``)."""
    return "to_zero" if args.ending == "to-zero" else "raced"


def run(args: argparse.Namespace) -> int:
    from leadline.cli._common import check_data_rows, check_device, fields_of
    from leadline.cli.derive import continued_state

    plan = _checked_plan(args)
    fields = fields_of(args) or plan.data.get("fields") or {}
    data = check_data_rows("--data", args.data, fields, "pass the jsonl the plan was derived on")
    _check_length(args, plan, data)
    check_device(args.device)
    state = continued_state(args)
    _check_plan_data(args, plan)
    if args.recipe:
        plan = _recipe_from(args, plan)
    if fields:
        plan.data["fields"] = fields  # the rows read by the fields the plan was derived with, or --field's
    res = _load_and_train(args, plan, state)
    print_data_notes("train", res.get("data_notes") or [])
    print_run(res, args.out)
    return _exit_code(res)


def _checked_plan(args: argparse.Namespace) -> Plan:
    """The plan ``--plan`` names, read, with the flags checked against it before the data is read."""
    from leadline.cli._common import check_out_folder, plan_file, read_plan
    from leadline.errors import InputError
    from leadline.plan import refuse_quick_plan

    check_out_folder("--out", args.out)
    args.plan = str(plan_file("--plan", args.plan))  # the folder derive wrote, or its plan.json
    plan = read_plan("--plan", args.plan)
    if not args.recipe:  # the recipe reads only the plan's length, seed and rows that fit
        refuse_quick_plan(plan, f"the plan {args.plan}")
    if args.steps is not None and args.steps < 1:
        raise InputError(f"--steps {args.steps} must be >= 1")
    check_ending_share(args)
    check_flags_have_effect(args, plan)
    missing = [n for n in ("micro_batch", "lr") if plan.get(n) is None]
    if missing and not args.recipe:  # what train_with_plan would refuse after the load
        cut = [s for s in plan.skipped if s.out_of_time]
        why = (f"its derive ran out of time ({cut[0].sentence()}); derive it again with `leadline derive "
               "--max-seconds S` and a larger S") if cut else "derive it again with `leadline derive` on this --data"
        raise InputError(f"the plan {args.plan} has no {' or '.join(missing)}, so it cannot train; {why}")
    check_schedule_flags(args)
    if args.recipe:
        _check_recipe_flags(args)
    return plan


def _check_recipe_flags(args: argparse.Namespace) -> None:
    from leadline.cli._common import check_positive, flag_of
    from leadline.errors import InputError

    rows_flag = flag_of(args, "rows_per_step", "--rows-per-step")
    if args.rows_per_step < 1:
        raise InputError(f"{rows_flag} {args.rows_per_step} must be a whole number of rows a step >= 1; pass e.g. "
                         f"{rows_flag} 16")
    if args.micro_batch is not None and (args.micro_batch < 1 or args.rows_per_step % args.micro_batch):
        raise InputError(f"--micro-batch {args.micro_batch} must divide {rows_flag} {args.rows_per_step}; pass "
                         "e.g. --micro-batch "
                         f"{recipe_micro_batch(args.rows_per_step, max(1, args.rows_per_step // 4))}")
    check_positive("--lr", args.lr, example="2e-4")
    if not 0.0 <= args.warmup_ratio < 1.0:
        raise InputError(f"--warmup-ratio {args.warmup_ratio:g} must be a share of the steps from 0 up to (not "
                         "including) 1; pass e.g. --warmup-ratio 0.03")


def _check_length(args: argparse.Namespace, plan: Plan, data: DataRows) -> None:
    from leadline.cli._common import check_run_length, flag_of

    if args.recipe:
        check_run_length(data, steps=args.steps, rows_per_step=args.rows_per_step,
                         rows_flag=flag_of(args, "rows_per_step", "--rows-per-step"))
    else:  # the plan's step was derived on these rows: only the length is the user's
        per_step = _plan_rows_per_step(plan)
        check_run_length(data, steps=args.steps, rows_per_step=None if per_step is None else min(
            per_step, data.training_rows))


def _check_plan_data(args: argparse.Namespace, plan: Plan) -> None:
    """A derived plan trains only on the data it was derived on (its content hash)."""
    if not args.recipe and plan.data.get("sha256"):
        from leadline.errors import InputError
        from leadline.provenance import content_hash

        if content_hash(args.data) != plan.data["sha256"]:
            raise InputError(f"the plan {args.plan} was derived on other data than --data {args.data} (the content "
                             "hash differs); pass the data it was derived on or derive again")


def _recipe_from(args: argparse.Namespace, derived: Plan) -> Plan:
    """The recipe's plan (``--recipe``): the flags' rate, rows a step and warmup, the derived plan's
    length, seed and the rows that fit."""
    from leadline.train import recipe_plan

    return recipe_plan(lr=args.lr, rows_per_step=args.rows_per_step, warmup_ratio=args.warmup_ratio,
                       micro_batch=args.micro_batch or recipe_micro_batch(
                           args.rows_per_step, derived.get("rows_fit", derived.get("micro_batch"))),
                       seq_len=derived.get("seq_len"), seed=int(derived.held_out.get("seed", 0)))


def _load_and_train(args: argparse.Namespace, plan: Plan, state: str | None) -> dict[str, Any]:
    """The model loaded once and trained with ``plan`` (a derived plan's model must train as many
    parameters as it was derived for)."""
    from leadline.cli._common import load_for_training, ram_bound
    from leadline.errors import InputError
    from leadline.train import train_with_plan

    with ram_bound(args.device):  # on the CPU: an allocation past the RAM is a sentence, not the OOM killer
        model, tok = load_for_training(args)
        want = plan.model.get("trained_parameters")
        have = sum(p.numel() for p in model.parameters() if p.requires_grad)
        if not args.recipe and isinstance(want, int) and want != have:
            raise InputError(f"the plan {args.plan} was derived for a model with {want:,} trained parameters, "
                             f"this one trains {have:,}; pass the same --model and --lora-rank/--full")
        return train_with_plan(model, tok, args.data, plan, out_dir=args.out, total_steps=args.steps,
                               schedule=not args.no_schedule, on_step=show_step,
                               state=None if args.recipe else state, ending=ending_of(args),
                               ending_share=args.ending_share)


def _exit_code(res: dict[str, Any]) -> int:
    """0, or :data:`~leadline.run.result.EXIT_NOT_IMPROVED` with the outcome's sentence where a race
    plan's guarded run did not improve."""
    if res.get("outcome", "improved") == "improved":
        return 0
    import textwrap

    from leadline.rate.guard import outcome_sentence
    from leadline.run.result import EXIT_NOT_IMPROVED

    b, a = res.get("held_out_before") or {}, res.get("held_out_after") or {}
    print(textwrap.fill(outcome_sentence(res["outcome"], b.get("mean", 0.0), a.get("mean", 0.0)), width=99))
    return EXIT_NOT_IMPROVED


def check_flags_have_effect(args: argparse.Namespace, plan: Plan) -> None:
    """A flag that would change nothing with this plan and these flags is refused, naming it and
    the fix; with ``--recipe`` the recipe's flags left out take the recipe's defaults."""
    from leadline.cli._common import flag_of
    from leadline.errors import InputError

    recipe_flags = [(flag_of(args, d, "--" + d.replace("_", "-")), d) for d in
                    ("lr", "rows_per_step", "warmup_ratio", "micro_batch") if getattr(args, d, None) is not None]
    if recipe_flags and not args.recipe:
        flag = recipe_flags[0][0]
        raise InputError(f"{flag} sets the default recipe's run, and without --recipe the plan's own numbers train; "
                         f"add --recipe, or leave {flag} out")
    if args.recipe:
        for dest, value in RECIPE.items():
            if getattr(args, dest, None) is None:
                setattr(args, dest, value)
    state_flag = "--fresh" if args.fresh else f"--state {args.state}" if args.state is not None else None
    race_plan = plan.get("optimizer") == "schedule_free_adamw"
    if state_flag and (args.recipe or "lookahead_horizon_steps" not in plan):
        why = ("--recipe trains the default recipe from the model's weights" if args.recipe else
               f"the plan {args.plan} is of the race effort, which keeps no look-ahead branch")
        raise InputError(f"{state_flag} chooses whether the run continues from derive's look-ahead branch, and "
                         f"{why}; leave {state_flag.split()[0]} out")
    if args.no_schedule and (args.recipe or race_plan):
        why = ("--recipe trains without the LookaheadSchedule already" if args.recipe else
               f"the plan {args.plan} trains schedule-free AdamW (the race effort), which has no schedule")
        raise InputError(f"--no-schedule trains without the LookaheadSchedule, and {why}; leave --no-schedule out")
    ending = ending_flag(args)
    if ending and race_plan and not args.recipe:
        raise InputError(f"{ending} sets the run's ending, and the plan {args.plan} trains schedule-free AdamW (the "
                         "race effort), whose averaged weights are the model at every step: it has no ending to set; "
                         f"leave {ending.split()[0]} out, or derive the plan with --effort full")


def check_schedule_flags(args: argparse.Namespace) -> None:
    """The ending flags against --recipe and --no-schedule."""
    from leadline.errors import InputError

    asked = ending_flag(args)
    if asked and (args.recipe or args.no_schedule):
        flag = "--recipe" if args.recipe else "--no-schedule"
        raise InputError(f"{asked} sets the LookaheadSchedule's ending, and {flag} trains without it; "
                         f"drop one of the two")


def _plan_rows_per_step(plan: Plan) -> int | None:
    """The rows an optimizer step of the plan takes (micro-batch x accumulation), where it says."""
    mb, accum = plan.get("micro_batch"), plan.get("grad_accum") or 1
    return int(mb) * int(accum) if isinstance(mb, int) and isinstance(accum, int) else None


def print_run(res: dict[str, Any], out: str | os.PathLike[str]) -> None:
    """What a run says when it ends: where it started (derive's look-ahead or the model's weights),
    its steps and rollbacks, the test loss before and after, where it was saved."""
    cont = res.get("continued")
    if cont and cont.get("from_step"):
        print(f"continued at step {cont['from_step']} from derive's look-ahead ({cont['steps']} steps at "
              f"{cont['lr']:.3g}, {cont['state']})")
    elif cont:
        print(f"started from the model's weights, not derive's look-ahead ({cont['state']}): {cont['why']}")
    rollbacks = sum(1 for c in (res.get("schedule") or {}).get("checks", []) if c.get("action") == "rollback")
    print(f"trained {res['steps']} steps in {res['seconds']:.1f} s; schedule rollbacks: {rollbacks}")
    ending = res.get("ending") or {}
    if ending.get("kept") == "to_zero":
        print(f"ending: the rate fell linearly to zero from step {ending['from_step']} to {ending['to_step']}")
    elif "constant_versus_decay" in ending:
        from leadline.report.ending import ending_lines

        print("\n".join(ending_lines(ending)))  # the losses read, and why the kept one was kept
    elif ending.get("why"):
        print(f"ending: {ending['kept']} ({ending['why']})")
    print_test_loss(res)
    print(f"saved to {out}")


def print_test_loss(res: dict[str, Any]) -> None:
    """The test rows' loss before and after the run (after alone where no read before was kept)."""
    a, b = res.get("test_loss_after"), res.get("test_loss_before")
    if a is None and res.get("held_out_after"):  # no test rows: the guard's verdict on the rows it read
        a, b = res["held_out_after"], res.get("held_out_before")
        print(f"held-out loss on {a.get('rows', '?')} rows the decisions read: "
              + (f"{b['mean']:.4f} ± {b['se']:.4f} before, " if b else "") + f"{a['mean']:.4f} ± {a['se']:.4f} after")
        return
    if a is None:
        return
    after = f"{a['mean']:.4f} ± {a['se']:.4f} after"
    before = f"{b['mean']:.4f} ± {b['se']:.4f} before, " if b is not None else ""
    print(f"test loss on {res['test_rows']} rows no decision used: {before}{after}")


def print_data_notes(command: str, notes: list[str]) -> None:
    """What leadline changed in the user's rows, one ``leadline COMMAND: note: ...`` line each on stderr."""
    import sys

    for note in notes:
        print(f"leadline {command}: note: {note}", file=sys.stderr)


def show_step(rec: dict) -> None:
    """Every tenth step's loss, rate and seconds on stderr."""
    import sys

    if rec["step"] % 10 == 0:
        print(f"step {rec['step']:5d}  loss {rec['loss']:.4f}  lr {rec['lr']:.3g}  {rec['seconds']:.1f}s",
              file=sys.stderr)


def recipe_micro_batch(rows_per_step: int, rows_fit: int | None) -> int:
    """The recipe's micro-batch: the most rows, dividing its step, that the plan measured the card
    fits (its ``rows_fit``; the plan's own micro-batch is cut to the plan's step, which can be
    far below what the card holds)."""
    if not isinstance(rows_fit, int) or rows_fit < 1:
        return rows_per_step
    return max(d for d in range(1, min(rows_per_step, rows_fit) + 1) if rows_per_step % d == 0)

