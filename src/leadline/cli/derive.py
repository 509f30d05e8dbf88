"""``leadline derive``: the plan for a model and a data set, each number with its evidence.

``--effort full`` (here and in ``leadline run``) derives with the look-ahead annex
(:mod:`leadline.lookahead`): this module is the command line's door onto it, for the torchrun job,
the look-ahead's branch kept beside the plan (:func:`keep_state`, :func:`continued_state`) and the
scale-out table.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from leadline.cli._common import MAX_EPOCHS, PLAN_NAME, Spelled, add_model_arguments, data_notes_of, model_record
from leadline.plan import Plan

if TYPE_CHECKING:
    from leadline.lookahead.derive.state import StateKeeper
    from leadline.lookahead.progress import PhaseBar


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    lookahead = add_plan_arguments(p, effort="race", efforts=("race", "full"),
                                   effort_help="race: schedule-free AdamW, its rate raced on the run's opening steps "
                                   "(the plan alone: `leadline run` keeps the race's steps); full: the look-ahead")
    p.add_argument("--out", required=True, metavar="DIR",
                   help=f"a folder for the plan: DIR/{PLAN_NAME} (written atomically) and, with --effort full, the "
                   "look-ahead's branch in DIR/plan.state; created where it does not exist (a path ending in .json "
                   "is still taken as the plan's file, a spelling to be removed)")
    add_html_argument(p)
    lookahead.add_argument("--resume", metavar="FILE",
                           help="continue a cut-off derive from this file (written after each phase; default: none, "
                           "start afresh)")
    lookahead.add_argument("--prior", metavar="PLAN",
                           help="check an earlier plan (its folder or its plan.json) with short measurements instead "
                           "of starting over (default: none)")
    lookahead.add_argument("--no-state", action="store_true",
                           help="do not keep the look-ahead's winning branch beside the plan (`leadline train --plan "
                           "DIR` continues from it instead of starting over)")
    lookahead.add_argument("--scale-out", action="store_true",
                           help="print the data-parallel scale-out table (it reads the noise scale the look-ahead "
                           "measures)")
    lookahead.add_argument("--fit-rank", action="store_true",
                           help="also measure the largest LoRA rank whose real step fits at the plan's micro-batch "
                           "and length")


def add_html_argument(p: argparse.ArgumentParser) -> None:
    """``--html [PATH]`` of the commands with an output folder: a path, or bare the folder's report.html."""
    p.add_argument("--html", nargs="?", const=True, default=None, metavar="PATH",
                   help="also write the plan's HTML report to PATH (given bare: DIR/report.html; default: none)")


LOOKAHEAD_FLAGS = "only with --effort full (the look-ahead effort)"
"""The title in ``--help`` of the flags only the look-ahead effort takes."""


def add_plan_arguments(p: argparse.ArgumentParser, *, effort: str, effort_help: str,
                       efforts: tuple[str, ...] = ("race", "full")) -> argparse._ArgumentGroup:
    """The options that shape the plan (``leadline derive`` and ``leadline run``): the effort,
    the run's length, the training length and the rows a step; returns the ``--help`` group of
    the flags only ``--effort full`` takes (the bound on the derive, the length by a quantile, the
    measured step), for the command to add its own. ``--effort`` is checked by
    :func:`check_effort` (a removed effort is named in one sentence, not argparse's list)."""
    from leadline.run.length import MAX_PASSES
    from leadline.run.options import ROWS_PER_STEP

    p.add_argument("--effort", default=effort, metavar="{" + ",".join(efforts) + "}",
                   help=f"{effort_help} (default %(default)s)")
    p.set_defaults(efforts=efforts)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--steps", type=int, metavar="N",
                   help="the run's length in optimizer steps (default: the passes --epochs describes)")
    g.add_argument("--epochs", type=float, metavar="E",
                   help=f"the run's length in passes over the training rows, at most {MAX_EPOCHS} (default: one pass, "
                   "then `leadline run` adds passes while a pass's end reads significantly below its check half a "
                   f"pass before or its held-out answers are one answer, at most {MAX_PASSES} passes in all; "
                   "--effort full: one pass)")
    p.add_argument("--seq-len", type=int, metavar="N",
                   help="the length to train at (default: the longest row, cut to the model's positions)")
    p.add_argument("--rows-per-step", type=int, metavar="N", action=Spelled,
                   help="the rows an optimizer step takes; the micro-batch and accumulation are fitted to the card "
                   f"and the rate is decided at this step (default: {ROWS_PER_STEP}, a constant; --effort full "
                   "measures the step)")
    lookahead = p.add_argument_group(LOOKAHEAD_FLAGS, "The default effort (race) refuses each of these in one "
                                     "sentence.")
    lookahead.add_argument("--quantile", type=float, metavar="Q",
                           help="instead of --seq-len, the length that keeps this share of rows whole (default: "
                           "none, every row whole)")
    lookahead.add_argument("--max-seconds", type=float, metavar="S",
                           help="a bound on the whole derive in seconds; what it does not reach is listed (default: "
                           "no bound)")
    lookahead.add_argument("--step-for", choices=("rows", "time"), default=None,
                           help="how the measured step is sized: rows (default: the fewest rows a step whose time a "
                           "row is within what the least-time step pays a row to reach the same loss) or time (the "
                           "least time to a loss); docs/noise.md")
    return lookahead


def out_paths(flag: str, given: str | Path) -> tuple[Path, Path]:
    """``--out``: (the folder, the plan's path in it). A folder: ``DIR/plan.json``; a path ending
    in ``.json`` (the old spelling): that file, in its folder. Checked before any work: an
    existing file that is not a plan's, a parent that does not exist or cannot be written."""
    from leadline.cli._common import check_out_file, check_plan_is_leadlines, check_writable
    from leadline.errors import InputError

    out = Path(given)
    if out.suffix.lower() == ".json" and not out.is_dir():
        check_out_file(flag, out)
        check_plan_is_leadlines(flag, out, out)
        return out.parent if str(out.parent) else Path("."), out
    if out.exists() and not out.is_dir():
        raise InputError(f"{flag} {out} is a file, not a folder; pass a folder for the plan (it is written to "
                         f"DIR/{PLAN_NAME})")
    parent = out.parent if str(out.parent) else Path(".")
    if not out.exists() and not parent.is_dir():
        raise InputError(f"{flag} {out}: the folder {parent} does not exist; create it or choose another path")
    check_writable(flag, out, out if out.is_dir() else parent, new_folder=not out.is_dir())
    if out.is_dir():
        check_out_file(flag, out / PLAN_NAME)
        check_plan_is_leadlines(flag, out, out / PLAN_NAME)
    return out, out / PLAN_NAME


def run(args: argparse.Namespace) -> int:
    from leadline.cli._common import check_device, check_out_file, read_plan, resolve_html
    from leadline.errors import InputError

    check_effort(args)
    folder, out = out_paths("--out", args.out)  # every output is checked before the derive: a refusal costs nothing
    args.html = resolve_html(args.html, folder)
    if args.html is not None and (args.html.parent != folder or folder.is_dir()):
        check_out_file("--html", args.html)  # in a new --out folder: that folder is checked
    check_out_file("--resume", args.resume)
    state = state_path(out)
    if not args.no_state and args.effort == "full" and (state.exists() or state.is_symlink()) and not (
            state.is_dir() and not state.is_symlink() and (state / "state.json").exists()):
        raise InputError(f"--out {args.out}: the folder for its state, {state}, exists and is not one leadline derive "
                         "wrote; move it or pass --no-state")
    if args.no_state and args.effort != "full":
        raise InputError(f"--no-state keeps no look-ahead branch beside the plan, and --effort {args.effort} keeps "
                         "none anyway (only --effort full runs the look-ahead); leave --no-state out")
    check_plan_inputs(args)
    if args.prior is not None:
        read_plan("--prior", args.prior)
    if args.fit_rank and args.full:
        raise InputError("--fit-rank measures a LoRA rank, and --full trains every weight; drop one of them")
    if args.effort == "race" and (args.max_seconds is not None or args.quantile is not None
                                  or args.step_for is not None or args.resume or args.prior or args.fit_rank):
        raise InputError("--max-seconds, --quantile, --step-for, --resume, --prior and --fit-rank shape the full "
                         "effort's derive; the race (the default) takes none of them: leave them out or pass "
                         "--effort full")
    if args.effort == "race" and args.scale_out:
        raise InputError("--scale-out reads the plan's noise scale, and the race (the default effort) measures none; "
                         "pass --effort full with it")
    check_device(args.device)
    from leadline.torchrun import launched_by_torchrun

    if args.effort == "race" and launched_by_torchrun():
        raise InputError("the race (the default effort) runs in one process, and this is one of several under "
                         "torchrun; pass --effort full for a plan derived across the job")

    made = not folder.exists()
    try:
        if not launched_by_torchrun():
            return _derive(args, out, main=True, state=None if args.no_state or args.effort != "full" else state)
        # under torchrun: every rank derives in step with the others; rank 0 writes and prints
        from leadline.lookahead.distributed.world import job_from_env

        with job_from_env(args.device) as world:
            if world is not None and args.device in (None, "cuda") and world.device.startswith("cuda"):
                args.device = world.device
            return _derive(args, out, main=world is None or world.is_main)
    except BaseException:
        if made and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()  # the folder this command made, before anything was written in it
        raise


def check_effort(args: argparse.Namespace) -> None:
    """``--effort`` one of the command's efforts; the removed ``quick`` refused in one sentence
    naming what to use instead."""
    from leadline.errors import InputError

    efforts = getattr(args, "efforts", ("race", "full"))
    if args.effort == "quick":
        raise InputError("--effort quick was removed: use race (the default) or full")
    if args.effort not in efforts:
        raise InputError(f"--effort {args.effort} is not one of {', '.join(efforts)}; pass one of them or leave "
                         "--effort out")


def check_plan_inputs(args: argparse.Namespace) -> None:
    """The options of :func:`add_plan_arguments` and ``--data`` (its rows read, ``--field`` too),
    checked before the model loads; the rows read are kept on ``args.data_rows``."""
    from leadline.cli._common import check_data_rows, check_positive, check_run_length, fields_of
    from leadline.errors import InputError

    if args.steps is not None and args.steps < 1:
        raise InputError(f"--steps {args.steps} must be a whole number of optimizer steps >= 1")
    check_positive("--epochs", args.epochs, example="1")
    check_positive("--max-seconds", args.max_seconds, example="600")
    if args.seq_len is not None and args.seq_len < 2:
        raise InputError(f"--seq-len {args.seq_len} must be at least 2 tokens (one token leaves nothing to score after "
                         "the shift)")
    check_positive("--quantile", args.quantile, upper=1.0, example="0.99")
    if args.rows_per_step is not None and args.rows_per_step < 1:
        raise InputError(f"--rows-per-step {args.rows_per_step} must be a whole number of rows >= 1; pass e.g. "
                         "--rows-per-step 16, or leave it out for the measured step")
    if args.rows_per_step is not None and args.step_for is not None:
        raise InputError(f"--rows-per-step fixes the step and --step-for {args.step_for} measures it; pass one of "
                         "the two")
    fields = fields_of(args)
    args.data_rows = check_data_rows("--data", args.data, fields)
    check_run_length(args.data_rows, steps=args.steps, epochs=args.epochs, rows_per_step=args.rows_per_step)


def state_path(plan_path: str | Path) -> Path:
    """Where the look-ahead's branch is kept beside a plan: the plan's name with ``.state``."""
    return Path(plan_path).with_suffix(".state")


def keep_state(state: Path | None) -> contextlib.AbstractContextManager[StateKeeper | None]:
    """The block in which the full effort's derive keeps the look-ahead's winning branch for the
    folder ``state`` (:func:`leadline.lookahead.derive.state.keep_run_state`): nothing reaches it
    before the keeper commits, and what was not committed is removed on exit. None: nothing kept."""
    if state is None:
        return contextlib.nullcontext()
    from leadline.lookahead.derive.state import keep_run_state

    return keep_run_state(state)


def continued_state(args: argparse.Namespace) -> str | None:
    """``leadline train``'s state to continue from: --state, else the one beside --plan where it
    exists; None with --fresh."""
    from leadline.errors import InputError
    from leadline.lookahead.derive.state import load_run_state

    if args.fresh:
        if args.state is not None:
            raise InputError(f"--fresh starts over and --state {args.state} continues; drop one of them")
        return None
    if args.state is not None:
        load_run_state(args.state)  # not a state: one sentence now, before the model loads
        return str(args.state)
    beside = state_path(args.plan)
    return str(beside) if (Path(beside) / "state.json").exists() else None


def phase_bar() -> PhaseBar:
    """The bar over derive()'s phases on stderr (``--effort full``): :class:`leadline.lookahead.progress.PhaseBar`."""
    from leadline.lookahead.progress import PhaseBar

    return PhaseBar()


def _derive(args: argparse.Namespace, out: Path, main: bool, state: Path | None = None) -> int:
    import time

    from leadline.cli._common import load_for_training, lora_values_of, ram_bound

    t_load = time.perf_counter()
    with ram_bound(args.device), keep_state(state) as kept:
        model, tok = load_for_training(args)
        t0 = time.perf_counter()
        if args.effort == "race":  # the race alone; the weights put back as they were
            from leadline.cli._common import fields_of
            from leadline.run import RunOptions, race_only

            plan = race_only(model, tok, args.data, RunOptions(
                total_steps=args.steps, epochs=args.epochs, rows_per_step=args.rows_per_step, seed=args.seed,
                seq_len=args.seq_len, fields=fields_of(args) or None))
        else:
            plan = derive_plan(args, model, tok, phase_bar() if main else None)
        plan.values.update(lora_values_of(args, model))  # the adapter's rank and alpha, given or leadline's default
        took = time.perf_counter() - t0
        notes = data_notes_of(args, model, tok) if main else []
        return _write(args, out, main, plan, took, t0 - t_load, kept, notes)


def _write(args: argparse.Namespace, out: Path, main: bool, plan: Plan, took: float, loading: float,
           kept: StateKeeper | None, data_notes: list[str] | None = None) -> int:
    note_plan(args, plan, took, loading, show=main, data_notes=data_notes)
    if not main:
        return 0  # every rank holds the plan; rank 0 writes and prints it
    out.parent.mkdir(exist_ok=True)
    write_plan(plan, out, kept, html=args.html, scale_out=args.scale_out)
    if Path(args.out) == out:  # the plan's file given, not its folder
        import sys

        print(f"leadline derive: note: --out {args.out} names the plan's file, a spelling to be removed; pass its "
              f"folder, --out {out.parent}, and the plan is written to {out.parent / PLAN_NAME}", file=sys.stderr)
    return 0


def note_plan(args: argparse.Namespace, plan: Plan, took: float, loading: float, *, show: bool = True,
              command: str = "derive", data_notes: list[str] | None = None) -> None:
    """The plan's notes from the command: derive's seconds and the load's, the model's name, and
    what the user should know (said on stderr as ``leadline COMMAND: note: ...`` where ``show``):
    ``data_notes``, what training changes in the rows (:func:`leadline.corpus.data_notes`; None:
    only the rows' mixed formats, read from the plan), and the plan's own warnings."""
    import sys

    bound = f" (max_seconds {args.max_seconds:g})" if args.max_seconds else ""
    plan.notes.append(f"derive took {took:.1f} s{bound}; loading the model and tokenizer before it {loading:.1f} s")
    plan.model.update(model_record(args))
    for note in [*(data_notes or []), *_warnings(args, plan, rows_noted=data_notes is not None)]:
        plan.notes.append(note)
        if show and note not in getattr(args, "notes_said", ()):
            print(f"leadline {command}: note: {note}", file=sys.stderr)


def write_plan(plan: Plan, out: Path, kept: StateKeeper | None, *, html: str | Path | None = None,
               scale_out: bool = False,
               continued_by: str = "`leadline train --plan` continues from them") -> Path | None:
    """Write the plan to ``out`` (atomically), print it (the table of the numbers to train with,
    then the constants, notes and seconds; ``leadline report --why`` gives a value's sentence),
    move the look-ahead's kept branch to ``out``'s state folder (removing an older derive's there
    where none was kept), and write the HTML report where ``html`` is given. Returns the state
    folder, or None when none was kept."""
    import shlex

    plan.to_json(out)
    print(plan.report(long=False, path=shlex.quote(str(out))))
    saved = kept.commit() if kept is not None else None
    if saved is None and state_path(out).is_dir() and (state_path(out) / "state.json").exists():
        import shutil

        shutil.rmtree(state_path(out))  # an older derive's state: not this plan's
    if saved is not None:
        print(f"\nkept the look-ahead's first {plan.get('lookahead_state_steps')} steps in {saved}: {continued_by}")
    if scale_out:
        print()
        print(plan_scale_out_table(plan))
    print(f"\nwrote {out}")
    if html:
        from leadline.report.html import write_html

        print(f"wrote {write_html(plan, html)}")
    return saved


def derive_plan(args: argparse.Namespace, model: object, tok: object, bar: PhaseBar | None) -> Plan:
    """derive_for on the loaded model with the command's options; the progress bar closed after."""
    from leadline.cli._common import check_length, fields_of, plan_file
    from leadline.hf import DeriveOptions, derive_for

    fields = fields_of(args)
    try:
        check_length(args, model, tok, getattr(args, "data_rows", None),
                     command=getattr(args, "command", None) or "derive")
        prior = None if args.prior is None else str(plan_file("--prior", args.prior))
        options = DeriveOptions(quantile=args.quantile, max_seconds=args.max_seconds, on_progress=bar,
                                resume=args.resume, prior=prior, fit_rank=args.fit_rank, step_for=args.step_for)
        plan = derive_for(model, tok, args.data, total_steps=args.steps, epochs=args.epochs, effort=args.effort,
                          seq_len=args.seq_len, seed=args.seed, rows_per_step=args.rows_per_step,
                          fields=fields or None, options=options)
    finally:
        if bar is not None:
            bar.close()
    check_trainable_plan(args, plan)
    if fields:
        plan.data["fields"] = fields  # `leadline train --plan` reads the rows by the same fields
    return plan


def check_trainable_plan(args: argparse.Namespace, plan: Plan) -> None:
    """A plan ``leadline train`` would refuse after another load is not written: a derive that
    ``--max-seconds`` ended before the micro-batch or the rate is one sentence saying what to raise."""
    from leadline.errors import InputError

    cut = [s for s in plan.skipped if s.out_of_time]
    why = f" ({cut[0].sentence()})" if cut else ""
    more = (f"raise --max-seconds (it was {args.max_seconds:g}; try {max(60, 4 * args.max_seconds):g} or more)"
            if args.max_seconds else "derive again")
    if args.resume:
        more += f", continuing from --resume {args.resume}"
    missing = [n for n in ("micro_batch", "lr") if plan.get(n) is None]
    if missing:
        ended = "--max-seconds ended the derive" if cut else "the derive ended"
        raise InputError(f"{ended} before it measured {' and '.join(missing)}{why}, and a plan without "
                         f"{'them' if len(missing) > 1 else 'it'} cannot train, so none was written; {more}")


def _warnings(args: argparse.Namespace, plan: Plan, rows_noted: bool = False) -> list[str]:
    """What the derive accepted but the user should know: rows in mixed formats and their cut to
    the model's positions (where the data's notes did not say it: ``rows_noted``), a prior
    derived on other data."""
    notes = []
    formats = plan["rows"].evidence.get("formats", {}) if "rows" in plan and not rows_noted else {}
    if isinstance(formats, dict) and len(formats) > 1:
        shown = ", ".join(f"{k} {n}" for k, n in formats.items())
        notes.append(f"the rows of --data {args.data} mix formats ({shown}): each row is scored by its own format's "
                     "policy; put one format in a file if that is not what you meant")
    if "seq_len" in plan and (plan["seq_len"].evidence or {}).get("rule") == "positions" and not getattr(
            args, "length_said", False) and not rows_noted:  # said once: before the derive where check_length said it
        notes.append(f"seq_len: {plan['seq_len'].source}")
    if args.prior is not None:
        prior = Plan.from_json(args.prior)
        theirs, ours = prior.data.get("sha256"), plan.data.get("sha256")
        if theirs and ours and theirs != ours:
            notes.append(f"the prior plan {args.prior} was derived on other data (its content hash differs from "
                         f"--data {args.data}); what this plan kept of it holds only as far as the two train alike: "
                     "derive without --prior to measure this data afresh")
    return notes


def plan_scale_out_table(plan: Plan) -> str:
    from leadline.lookahead.distributed.scale_out import scale_out

    return scale_out(plan).table()
