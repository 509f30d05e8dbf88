"""The run's plan: what it trains (the data, the model, the precision), its values (each with its
kind and source), and its phase table (where the seconds, steps and reads went)."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import TYPE_CHECKING

from leadline.corpus import data_notes
from leadline.plan import PhaseTime, Plan, Value
from leadline.provenance import describe_data
from leadline.rate.guard import READ_SHARE
from leadline.rate.opening import opening_rates
from leadline.run.job import Job
from leadline.run.length import stop_sentence
from leadline.run.lora import Lora
from leadline.run.opening import Opened
from leadline.run.options import WARMUP_SHARE
from leadline.run.precision import precision_of
from leadline.run.result import RunResult

if TYPE_CHECKING:
    import torch

    from leadline.corpus.rows import RowSource


def plan_of(model: torch.nn.Module, data: RowSource, fields: dict[str, str] | None, job: Job) -> Plan:
    """The plan's data, held-out split, model and precision, and the notes on what leadline changed in the rows."""
    plan = Plan(data={**describe_data(data), **({"fields": fields} if fields else {})},
                held_out=job.task.split.as_dict())
    plan.model = {"trained_as": job.trained_as, "trained_parameters": int(sum(p.numel() for p in job.params))}
    plan.set("precision", precision_of(model).as_value())  # the dtype, quantization and checkpointing it trains in
    lora = Lora.of(model)  # the adapter it trains through: rank, alpha, targets, dropout
    for name, value in (lora.as_values() if lora is not None else {}).items():
        plan.set(name, value)
    plan.notes.extend(data_notes(job.profile))  # what leadline changed in the rows: cut, dropped, mixed formats
    return plan


def set_values(plan: Plan, job: Job, opened: Opened, rows_given: bool) -> None:
    """The training numbers: the micro-batch (and where it halved), accumulation, the step's rows, the
    rate, the optimizer and its constants, the run's length, the race's steps and the rows' length."""
    mb, tried, rows_per_step = job.micro_batch, job.tried, job.rows_per_step
    said = (f"the most of the step's {rows_per_step} rows whose forward and backward at the longest rows ran"
            if tried else "the whole step: off a CUDA card nothing refuses a batch")
    if job.halved:  # the card ran short mid-run: the micro-batch the run ended at, and when it fell
        fell = ", ".join(f"{h['from']} to {h['to']} at step {h['step']}" for h in job.halved)
        said += f"; halved during the run, where the card ran out of memory ({fell})"
        plan.notes.append(f"the card ran out of memory during the run (memory taken after the fit): the micro-batch "
                          f"fell {fell}, the same rows a step accumulated; nothing was lost")
    plan.set("micro_batch", Value(mb, "measured" if tried or job.halved else "derived", said,
                                  evidence={"fit": tried, "halved": job.halved} if job.halved else (tried or None),
                                  seconds=job.fit_seconds, unit="rows"))
    plan.set("grad_accum", Value(rows_per_step // mb, "derived", "the step's rows over the micro-batch"))
    plan.set("rows_per_step", Value(rows_per_step, "given", "the caller's rows a step", unit="rows") if rows_given
             else Value(rows_per_step, "constant", "the default recipe's 16 rows a step: a run this long cannot pay "
                        "for the noise probe that would measure it", unit="rows"))
    plan.set("lr", opened.value)
    plan.set("optimizer", Value("schedule_free_adamw", "constant", "schedule-free AdamW: its averaged weights are "
                                "the model at every step, so the run needs no ending and no rerun"))
    plan.set("warmup_steps", Value(job.warmup, "constant", f"{WARMUP_SHARE:.0%} of the run (schedule-free's warmup "
                                   "at the settings that won AlgoPerf's self-tuning track)", unit="steps"))
    plan.set("weight_decay", Value(0.0, "constant", "0: a fine-tune starts from weights worth keeping"))
    said = (f"the run's length: {stop_sentence(job.steps // job.pass_steps, job.passes_why)}, at {rows_per_step} "
            "rows a step" if job.passes_why != "given" and job.pass_steps else
            f"the run's length: its passes over the training rows at {rows_per_step} rows a step")
    plan.set("total_steps", Value(job.steps, "derived", said, unit="steps"))
    plan.set("opening_steps", Value(opened.horizon, "derived", "each candidate's steps in the opening race: the "
                                    "loser's steps, where the lower rate runs, fit the decision's share of the run",
                                    unit="steps"))
    corpus = job.profile.as_values()  # as derive's corpus profile states them: what the loss scores, and the length
    plan.set("seq_len", replace(corpus["seq_len"], unit="tokens"))
    plan.set("scored_tokens", corpus["scored_tokens"])


def opening_phases(job: Job, opened: Opened) -> list[PhaseTime]:
    """The fit's and the rate's rows of the phase table (the rate: the start's read and the race)."""
    rates = opening_rates(job.trained_as)
    return [PhaseTime("memory", job.fit_seconds, 0, ("micro_batch",)),
            PhaseTime("rate", opened.seconds, opened.kept_steps + opened.overhead_steps,
                      ("lr",) if opened.lr != rates[0] else (), step_seconds=opened.step_seconds,
                      reads=opened.reads, read_seconds=opened.read_seconds)]


def set_run_phases(plan: Plan, job: Job, opened: Opened, result: RunResult) -> None:
    """The run's and the guard's rows of the phase table after the opening's, the guard's value,
    and the decision's overhead as a note."""
    s = result.seconds
    a = result.answers  # a classifier's answers, read before and after: part of the verdict
    a_reads, a_seconds = (a.reads, a.seconds) if a is not None else (0, 0.0)
    guard_seconds = s["check_seconds"] + s["verdict_seconds"] + a_seconds
    plan.phases = [*opening_phases(job, opened),
                   PhaseTime("run", s["steps_seconds"] - s["more_passes_seconds"],
                             result.steps_run - opened.kept_steps - result.extra_pass_steps,
                             step_seconds=s["steps_seconds"] - s["more_passes_seconds"]),
                   *([PhaseTime("passes", s["more_passes_seconds"], result.extra_pass_steps, ("total_steps",),
                                step_seconds=s["more_passes_seconds"])] if result.extra_pass_steps else []),
                   PhaseTime("guard", guard_seconds, 0, ("guard",), reads=result.cost.check_reads + a_reads,
                             read_seconds=guard_seconds)]
    share = s["check_seconds"] / s["steps_seconds"] if s["steps_seconds"] > 0 else 0.0
    plan.set("guard", Value(result.rollbacks, "measured", _guard_sentence(result, share, READ_SHARE),
                            evidence={"plot": "checks", "checks": result.checks, "kept_step": result.kept_step,
                                      "held_out_before": asdict(result.held_out_before),
                                      "held_out_after": asdict(result.held_out_after), "outcome": result.outcome,
                                      "rows": result.cost.check_rows, "check_share_of_steps": share},
                            seconds=guard_seconds, unit="rollbacks"))
    plan.notes.append(f"the decision's overhead: {opened.overhead_steps} optimizer steps not kept "
                      f"({result.cost.overhead_share:.0%} of the run's {job.steps}) and {opened.reads} held-out reads")


def _guard_sentence(result: RunResult, share: float, budget: float) -> str:
    checks = sum(1 for c in result.checks if c["action"] not in ("start",))
    rb = result.rollbacks
    return (f"{checks} checks on {result.cost.check_rows} held-out rows ({share:.1%} of the steps' time, the budget "
            f"{budget:.0%}); {rb} rollback{'s' if rb != 1 else ''}; the model kept is step {result.kept_step}'s")
