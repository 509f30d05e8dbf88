"""The pichak arm of the scoreboard: pichak 0.4.1 run as its README prescribes, on the rows,
model and adapter every other arm uses (benchmarks/scoreboard.py).

Two efforts:
  quick  ``derive(effort="quick", ...)`` then ``race(...)`` over ``plan.values["race_grid"]``
         for the whole run, with ``alpha1=plan.values["first_step"]`` (the call the quick
         plan's own note spells out).
  full   the full ``derive(...)`` (its default effort) then ``race(...)`` over
         ``race_rates(lookahead_from(plan), steps)`` - the README's core snippet and its own
         "pichak full" arm; ``--full-train schedule`` trains with ``LookaheadSchedule`` instead
         (what the full plan's note says: "TRAIN WITH LookaheadSchedule(...)").

The pieces are pichak's own, as in the README's core:

    forbid_spill("cuda:0")
    plan = derive(rows=train, step_fn=TrainingStep(lambda b, length: ..., opt),
                  grad_fn=ModelGradFn(model, lambda i: batch(probe[i:i + 1]), params=params),
                  named_weights=trained_weights, trained_as="factors", tokenizer=tok)
    res = race(params, opt, train_step, held_out, race_rates(lookahead, steps), total_steps=steps)

wired to leadline's task (``leadline.hf.prepare(model, tok, train, seed=SEED)``, ``--seed``, 0 by default): ``rows`` are the
training rows (``task.order``, seeded order) as ``{"input_ids", "labels"}``; ``TrainingStep``'s
loss is the longest training row repeated ``b`` times at ``length`` tokens; ``ModelGradFn`` serves
one training row a micro-batch in ``task.order``; ``train_step`` is ``task.train_step_of(
micro_batch, grad_accum)`` at the plan's micro-batch and accumulation; ``held_out`` is leadline's
held-out split read row by row (``task.split.reader(..., "held_out")``), rows no arm trains on.
The run is one pass over the training rows at the plan's rows a step (at least the two steps
``race`` needs). The verdict is the mean loss on ``task.split.test``.

Off CUDA pichak's ramp has no edge to find ("off the card nothing refuses a batch ...: pass
limit="), and ``derive`` passes none: there (the CPU test only) the ramp is given
``limit=--cpu-ramp-limit``. ``--max-seconds`` is derive's own ``max_seconds`` bound.

    PYTHONPATH=src python3 benchmarks/pichak_arm.py --effort quick|full --model PATH \\
        --train TRAIN.jsonl --out DIR [--max-seconds S]

Writes ``DIR`` (the adapter, ``model.save_pretrained``), ``DIR/run.json`` and ``DIR/plan.json``
(the plan with every value's source and the notes). A pichak exception propagates after
``run.json`` records it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def log(*a: Any) -> None:
    print("[pichak_arm]", *a, file=sys.stderr, flush=True)


def jsonable(x: Any) -> Any:
    """A plan value as JSON: tuples as lists, non-finite floats as strings, anything else str."""
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    try:
        return jsonable(float(x))
    except (TypeError, ValueError):
        return str(x)


def cap_cpu_ramp(limit: int) -> None:
    """Off the card pichak's ramp refuses to run without ``limit=`` and derive() passes none:
    give it one (the names derive and ramp_to_fit call through)."""
    import pichak.tune as pt
    import pichak.tune.memory as pm

    orig = pm.ramp_micro_batch

    def capped(step_fn: Any, **kw: Any) -> Any:
        if kw.get("limit") is None:
            kw["limit"] = limit
        return orig(step_fn, **kw)

    pm.ramp_micro_batch = capped
    pt.ramp_micro_batch = capped


def build(model_path: str, train: str, seed: int = 0) -> tuple[Any, Any, Any]:
    """The model, tokenizer and leadline task every arm builds (scoreboard._worker_task)."""
    sys.path.insert(0, str(ROOT / "src"))
    import torch
    from peft import LoraConfig, get_peft_model

    from leadline.hf import load_model, load_tokenizer, prepare

    tok = load_tokenizer(model_path)
    model = load_model(model_path, device="cuda" if torch.cuda.is_available() else "cpu",
                       dtype=torch.float32)  # the precision the scoreboard's every arm trains in
    torch.manual_seed(seed)  # the adapter's init, as every arm draws it
    cfg = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM")
    model = get_peft_model(model, cfg)
    task, _ = prepare(model, tok, train, seed=seed)
    return model, tok, task


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rec: dict[str, Any] = {"effort": args.effort, "trainer": "race" if args.effort == "quick" else args.full_train,
                           "derive_seconds": None, "train_seconds": None, "steps": None, "rows_per_step": None,
                           "lr": None, "plan": None, "test_loss_after": None}

    def save() -> None:
        (out / "run.json").write_text(json.dumps(jsonable(rec), indent=1))

    plan = None
    try:
        import pichak
        import pichak.tune as pt
        import torch

        from leadline.corpus import collate
        from leadline.hf import trained_named_weights
        from leadline.stats import mean_se

        rec["pichak"] = pichak.__version__
        model, tok, task = build(args.model, args.train, args.seed)
        dev = task.device
        cuda = dev.type == "cuda"
        device = f"cuda:{dev.index or 0}" if cuda else "cpu"
        named = trained_named_weights(model)
        params = [p for _, p in named]
        order = list(task.order)
        rows = task.rows
        rec.update(train_rows=len(order), held_out_rows=len(task.split.held_out), test_rows=len(task.split.test),
                   seq_len=task.seq_len, device=device)
        held_out = task.split.reader(model, rows, "held_out", device=dev, pad_id=task.pad_id)
        test = task.split.reader(model, rows, "test", device=dev, pad_id=task.pad_id)

        # derive()'s arguments, as the README's core builds them
        train_rows = [{"input_ids": list(rows[i].input_ids), "labels": list(rows[i].labels)} for i in order]
        longest = max(order, key=lambda i: len(rows[i].input_ids))

        def loss_of(b: int, length: int) -> Any:
            """b rows of the longest training row at ``length`` tokens (cut to it when shorter)."""
            mb = collate([rows[longest].truncated(length)] * b, task.pad_id, pad_to=length).to(dev)
            return model(**mb.model_inputs()).loss

        def probe(i: int) -> dict[str, Any]:
            """grad_fn's micro-batch i: one training row, in the seeded order."""
            if i < 0 or i >= len(order):
                raise IndexError(f"{i} is past the {len(order)} training rows")
            return task.batch([order[i]]).to(dev).model_inputs()

        opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
        if cuda:
            cap, why = pt.forbid_spill(device)
            rec["forbid_spill_cap_bytes"] = cap
            rec["forbid_spill"] = why
            log("forbid_spill:", why)
        else:
            cap_cpu_ramp(args.cpu_ramp_limit)
            rec["cpu_ramp_limit"] = args.cpu_ramp_limit
        model.train()
        before = [p.detach().clone() for p in params]
        t0 = time.monotonic()
        kw: dict[str, Any] = {"effort": "quick"} if args.effort == "quick" else {}
        if args.max_seconds:
            kw["max_seconds"] = float(args.max_seconds)
        plan = pt.derive(rows=train_rows, step_fn=pt.TrainingStep(loss_of, opt),
                      grad_fn=pt.ModelGradFn(model, probe, params=params),
                      named_weights=named, trained_as="factors", tokenizer=tok,
                      device=device, model=str(args.model), on_progress=log, **kw)
        rec["derive_seconds"] = time.monotonic() - t0
        rec["plan"] = {k: v.value for k, v in plan.values.items()}
        rec["plan_constants"] = plan.constants()
        (out / "plan.json").write_text(plan.to_json())
        (out / "plan.txt").write_text(plan.report())
        log(plan.report())
        moved = max(float((p.detach() - b).abs().max()) for p, b in zip(params, before))
        rec["weights_moved_by_derive"] = moved
        if moved > 0:  # derive() should hand the adapter back as it found it; the run starts from the init
            with torch.no_grad():
                for p, b in zip(params, before):
                    p.copy_(b)
        del before
        save()

        v = plan.values
        missing = [k for k in ("micro_batch", "grad_accum") if k not in v]
        if missing:
            raise RuntimeError(f"pichak's plan has no {', '.join(missing)}: {' | '.join(plan.notes)}")
        micro, accum = int(v["micro_batch"].value), int(v["grad_accum"].value)
        per_step = micro * accum
        steps = max(2, len(order) // per_step)  # one pass; race() needs two steps at the least
        rec.update(micro_batch=micro, grad_accum=accum, rows_per_step=per_step, steps=steps)
        train_step = task.train_step_of(micro, accum)
        if any(bool(s) for s in opt.state.values()):  # race() and the schedule want a fresh optimizer
            opt.state.clear()
            rec["optimizer_state_cleared"] = True
        if "betas" in v and v["betas"].measured:  # the plan's betas where it measured them
            for g in opt.param_groups:
                g["betas"] = tuple(float(b) for b in v["betas"].value)
        if "weight_decay" in v:
            for g in opt.param_groups:
                g["weight_decay"] = float(v["weight_decay"].value)
        rec["optimizer"] = {"name": "AdamW", "betas": list(opt.param_groups[0]["betas"]),
                            "weight_decay": opt.param_groups[0]["weight_decay"]}

        model.train()
        t0 = time.monotonic()
        if args.effort == "quick":
            if "race_grid" not in v:
                raise RuntimeError(f"pichak's quick plan has no race_grid: {' | '.join(plan.notes)}")
            rates = [float(r) for r in v["race_grid"].value]
            alpha1 = float(v["first_step"].value) if "first_step" in v else None
            res = pt.race(params, opt, train_step, held_out, rates, total_steps=steps, alpha1=alpha1)
            rec.update(lr=res.lr, ending=res.ending, rates=rates, race={"steps_run": res.steps_run, "runs": res.runs,
                                                                          "rounds": res.rounds, "source": res.source})
        elif args.full_train == "race":
            la = pt.lookahead_from(plan)
            rates = pt.race_rates(la, steps)
            res = pt.race(params, opt, train_step, held_out, rates, total_steps=steps)
            rec.update(lr=res.lr, lookahead_lr=la.lr, ending=res.ending, rates=rates,
                       race={"steps_run": res.steps_run, "runs": res.runs, "rounds": res.rounds, "source": res.source})
        else:
            la = pt.lookahead_from(plan)
            sched = pt.LookaheadSchedule(params, opt, train_step, held_out, la, total_steps=steps)
            for s in range(steps):
                sched.before(s)
                opt.zero_grad(set_to_none=True)
                train_step(s)
                opt.step()
            kept = sched.finish()
            rec.update(lr=la.lr, lr_at_end=sched.lr, ending=kept,
                       schedule={"rollbacks": sched.rollbacks, "checks": sched.checks, "history": sched.history,
                                 "branch_steps": sched.branch_steps, "check_seconds": sched.check_seconds})
        opt.zero_grad(set_to_none=True)
        rec["train_seconds"] = time.monotonic() - t0
        save()

        model.eval()
        t0 = time.monotonic()
        m, se = mean_se(test())
        rec["test_seconds"] = time.monotonic() - t0
        rec["test_loss_after"] = {"mean": m, "se": se}
        model.save_pretrained(out)
        log(f"done: lr {rec['lr']:.4g}, {steps} steps of {per_step} rows, test loss {m:.4f} +- {se:.4f}")
    except BaseException as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
        rec["traceback"] = traceback.format_exc()
        if plan is not None and rec.get("plan") is None:
            rec["plan"] = {k: v.value for k, v in plan.values.items()}
        raise
    finally:
        save()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--effort", choices=["quick", "full"], required=True)
    ap.add_argument("--model", required=True, help="a Hugging Face folder or a .gguf (leadline.hf.load_model)")
    ap.add_argument("--train", required=True, help="the training jsonl (prompt/completion rows)")
    ap.add_argument("--out", required=True, help="the run's folder: the adapter, run.json, plan.json")
    ap.add_argument("--full-train", choices=["race", "schedule"], default="race",
                    help="--effort full: race() over race_rates(lookahead_from(plan)) (the README's core, default) "
                         "or LookaheadSchedule (the plan's note)")
    ap.add_argument("--max-seconds", type=float, default=None, help="derive(max_seconds=...): pichak's own bound")
    ap.add_argument("--seed", type=int, default=0, help="the adapter's init and leadline's split of the rows")
    ap.add_argument("--cpu-ramp-limit", type=int, default=8, help="off CUDA only: the ramp's limit= (rows)")
    run(ap.parse_args(argv))


if __name__ == "__main__":
    main()
