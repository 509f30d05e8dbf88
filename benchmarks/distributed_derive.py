"""Several GPUs: derive on 2 GPUs against 1, a run with each plan, and scale_out()'s
predicted steps against measured ones. SmolLM2-135M-Instruct, LoRA r16 (alpha 32, every linear
layer, dropout 0, the adapter seeded with --seed on every rank), debian_sections as
prompt = description[:600] + "\\nSection:", completion = " " + label (benchmarks/e2e_debian.py's rows).

Subcommands (each writes one JSON; run them in this order):

  derive    leadline.hf.derive_for(..., epochs=1, effort=E) — alone, or under torchrun, where
            every rank derives and rank 0 writes; the wall time of derive_for itself (model
            loading excluded), the plan, and its scale_out() table.
  train     a run with a plan, alone or under DDP: AdamW at the plan's rate, betas and decay,
            the plan's warmup from alpha1, then constant (the plan's ``constant_with_warmup``),
            the plan's micro-batch x grad_accum x world rows a step (derive's own step
            functions: leadline.hf.Task / leadline.lookahead.distributed.WorldTask), total_steps of the
            plan; then rank 0 scores the 842 debian_sections_test rows (each label by the
            log-likelihood of " label" + EOS, as e2e_debian.py does) and the held-out loss.
  scaleout  one GPU, two global batches (accumulation standing in for GPUs): the plan's own
            step B_a (micro x accum) and B_b = --factor x B_a (accum x factor), the rate at B_b
            by Adam's square-root rule lr x sqrt(factor) (Malladi et al. 2022); run A for
            --steps steps; the target is A's held-out loss at its last step; run B until it
            reaches the target; steps counted at the first held-out read at or below it.
            Predicted (McCandlish et al. 2018, what scale_out() computes):
            S_b / S_a = (1 + B_noise/B_b) / (1 + B_noise/B_a), with the B_noise the plan's step
            was taken from (read past the format when the plan has it; the step-0 reading's
            prediction is recorded beside it).
  compare   the rules below, from the JSONs the others wrote.

Decision rules, written before the run:
  R1  the 2-GPU plan's rows_fit equals the 1-GPU plan's (two identical cards; the least of
      two ramps is the one ramp), and its per-GPU micro-batch x grad_accum x 2 is within a
      factor 2 of the 1-GPU plan's rows a step (B* grows with sqrt(W)).
  R2  B_noise on 2 GPUs within 10% of B_noise on 1 GPU.
  R3  the rate within one grid step: |log2(lr_2 / lr_1)| <= 1 (the look-ahead's grid is alpha1 x 2^j).
  R4  derive on 2 GPUs takes at most 1.1 x its time on 1 GPU (reported as the ratio).
  R5  the 2-GPU plan's run on 2 GPUs is not less accurate than the 1-GPU plan's run on 1 GPU
      by McNemar p < 0.05 on the 842 test rows.
  R6  scale-out: the predicted S_b / S_a is nearer the measured ratio (in log) than both the
      perfect-scaling ratio 1/factor and no gain (1), and within 30% of it.
  R7  (written before any run) the plan derived on 2 GPUs with the model sharded by
      fully_shard (``derive --shard fsdp2`` under torchrun -> derive_2_fsdp.json) against the
      DDP one (derive_2.json): B_noise within 10%, the rate within one grid step
      (|log2(lr_fsdp / lr_ddp)| <= 1), and its rows a step (micro x accum x 2) within a factor 2.

Run (cwd = repo root, on the GPU machine; R1-R5 need the 2-GPU kind, R6 one GPU; NVLink
multicast stays off, as the machine's environment already says):
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  W=$OUT/dist; mkdir -p $W
  PYTHONPATH=src python3 benchmarks/distributed_derive.py derive --out $W/derive_1.json
  PYTHONPATH=src python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/distributed_derive.py derive --out $W/derive_2.json
  PYTHONPATH=src python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/distributed_derive.py derive --shard fsdp2 --out $W/derive_2_fsdp.json
  PYTHONPATH=src python3 benchmarks/distributed_derive.py train --plan $W/derive_1.json --out $W/train_1.json
  PYTHONPATH=src python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/distributed_derive.py train --plan $W/derive_2.json --out $W/train_2.json
  PYTHONPATH=src python3 benchmarks/distributed_derive.py scaleout --plan $W/derive_1.json --out $W/scaleout.json
  PYTHONPATH=src python3 benchmarks/distributed_derive.py compare --dir $W --out $W/compare.json
Both derives run without a time bound; if one passes the 10-minute limit, rerun both with the
same --max-seconds. A CPU smoke run: --model <hf folder> --data-dir <folder with
debian_sections_{train,test}.jsonl> --device cpu, torchrun's --nproc-per-node 2 on gloo.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

T0 = time.perf_counter()


def log(*a: Any) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"[{time.perf_counter() - T0:7.1f}s]", *a, flush=True)


def machine() -> dict[str, Any]:
    import torch

    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "gpus": torch.cuda.device_count(), "world_size": int(os.environ.get("WORLD_SIZE", "1"))}


def write_rows(data_dir: Path, work: Path, max_chars: int) -> tuple[Path, list[dict[str, Any]]]:
    """The training rows as prompt/completion (every rank writes the same bytes, atomically)."""
    from leadline._io import write_atomic

    rows = [json.loads(line) for line in (data_dir / "debian_sections_train.jsonl").read_text().splitlines() if line.strip()]
    text = "".join(json.dumps({"prompt": r["text"][:max_chars] + "\nSection:", "completion": " " + r["label"]}) + "\n" for r in rows)
    work.mkdir(parents=True, exist_ok=True)
    path = work / "train.jsonl"
    write_atomic(path, text)
    test = [json.loads(line) for line in (data_dir / "debian_sections_test.jsonl").read_text().splitlines() if line.strip()]
    return path, test


def load(args: argparse.Namespace, device: str) -> tuple[Any, Any]:
    import torch
    from peft import LoraConfig, get_peft_model

    from leadline.hf.loading import load_model, load_tokenizer

    tok = load_tokenizer(args.model)
    model = load_model(args.model, device=device)
    torch.manual_seed(args.seed)  # the same adapter on every rank and in every arm
    cfg = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM")
    return get_peft_model(model, cfg), tok


def shard(model: Any, world: Any) -> None:
    """``fully_shard`` each decoder layer, then the model, over the job's ranks (FSDP2)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cuda" if world.device.startswith("cuda") else "cpu", (world.world_size,))
    for layer in model.base_model.model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def device_of(world: Any, args: argparse.Namespace) -> str:
    import torch

    if world is not None:
        return world.device if world.device.startswith("cuda") else "cpu"
    return args.device or ("cuda" if torch.cuda.is_available() else "cpu")


# ---- derive -------------------------------------------------------------------------------
def cmd_derive(args: argparse.Namespace) -> dict[str, Any]:
    from leadline.hf import DeriveOptions, derive_for
    from leadline.lookahead.distributed import job_from_env, scale_out

    with job_from_env(args.device) as world:
        dev = device_of(world, args)
        train, _ = write_rows(Path(args.data_dir), Path(args.work), args.max_chars)
        t = time.perf_counter()
        model, tok = load(args, dev)
        if args.shard == "fsdp2":
            if world is None:
                raise SystemExit("derive --shard fsdp2 runs under torchrun (a sharded model needs a job of 2 or more ranks)")
            shard(model, world)
        load_s = time.perf_counter() - t
        if world is not None:
            world.barrier()
        t = time.perf_counter()
        plan = derive_for(model, tok, str(train), epochs=1.0, effort=args.effort, seed=args.seed,
                          options=DeriveOptions(max_seconds=args.max_seconds))
        seconds = time.perf_counter() - t
        so = scale_out(plan)
        log(plan.report())
        log(so.table())
        return {"world_size": 1 if world is None else world.world_size, "derive_seconds": seconds, "load_seconds": load_s,
                "plan": plan.to_dict(), "scale_out": so.as_dict(), "scale_out_table": so.table(),
                "main": world is None or world.is_main}


# ---- train --------------------------------------------------------------------------------
def train_loop(model: Any, tok: Any, train: Path, plan: Any, world: Any, *, micro: int, accum: int, lr: float, steps: int,
               eval_every: int = 0, stop_below: float | None = None) -> dict[str, Any]:
    """AdamW at ``lr`` with the plan's warmup, ``micro`` x ``accum`` x world rows a step; the
    held-out loss every ``eval_every`` steps (0: only at the end); stops at the first read at or
    below ``stop_below``."""
    import torch

    from leadline.hf import prepare, trained_named_weights
    from leadline.lookahead.rate.warmup import warmup_lr

    task, _ = prepare(model, tok, str(train), seq_len=plan.get("seq_len"), seed=int(plan.held_out.get("seed", 0) or 0))
    params = [p for _, p in trained_named_weights(model)]
    job = None
    if world is not None:
        from leadline.lookahead.distributed import WorldTask

        job = WorldTask(task, params, world)
        step_of, held = job.train_step_of, job.held_out_losses()
    else:
        step_of, held = task.train_step_of, task.held_out_losses()
    betas = tuple(plan.get("betas") or (0.9, 0.999))
    opt = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=float(plan.get("weight_decay", 0.0)))
    step = step_of(micro, accum)
    alpha1, warm = plan.get("alpha1"), int(plan.get("warmup_steps", 0) or 0)
    curve: list[dict[str, Any]] = []

    def read() -> float:
        xs = held()
        return math.fsum(xs) / len(xs)

    base = read()
    curve.append({"step": 0, "held_out": base})
    reached = None
    t = time.perf_counter()
    for s in range(steps):
        for g in opt.param_groups:
            g["lr"] = warmup_lr(s, lr, alpha1 * lr / float(plan.get("lr")) if alpha1 else None, warm)
        opt.zero_grad(set_to_none=True)
        loss = step(s)
        opt.step()
        rec: dict[str, Any] = {"step": s + 1, "loss": loss}
        if (eval_every and (s + 1) % eval_every == 0) or s + 1 == steps:
            rec["held_out"] = read()
            if stop_below is not None and rec["held_out"] <= stop_below and reached is None:
                reached = s + 1
        curve.append(rec)
        if (s + 1) % 10 == 0:
            log(f"step {s + 1}/{steps} loss {loss:.4f}" + (f" held-out {rec['held_out']:.4f}" if "held_out" in rec else ""))
        if reached is not None:
            break
    seconds = time.perf_counter() - t
    if job is not None:
        job.close()
    return {"curve": curve, "seconds": seconds, "held_out_before": base, "held_out_after": curve[-1].get("held_out"),
            "reached_step": reached, "steps_run": len(curve) - 1, "micro": micro, "accum": accum, "lr": lr,
            "rows_per_step": micro * accum * (1 if world is None else world.world_size)}


def cmd_train(args: argparse.Namespace) -> dict[str, Any]:
    from e2e_debian import judge, predictions
    from leadline.lookahead.distributed import job_from_env
    from leadline.plan import Plan

    plan = Plan.from_dict(json.loads(Path(args.plan).read_text())["plan"])
    with job_from_env(args.device) as world:
        dev = device_of(world, args)
        train, test = write_rows(Path(args.data_dir), Path(args.work), args.max_chars)
        model, tok = load(args, dev)
        res = train_loop(model, tok, train, plan, world, micro=int(plan.micro_batch), accum=int(plan.grad_accum),
                         lr=float(plan.lr), steps=int(args.steps or plan.total_steps))
        res["world_size"] = 1 if world is None else world.world_size
        res["main"] = world is None or world.is_main
        if res["main"]:
            preds = predictions(model, tok, test, args.max_chars)
            res["verdict"] = judge(preds, [r["label"] for r in test])
            res["correct"] = [p == r["label"] for p, r in zip(preds, test)]
            log("accuracy", res["verdict"]["accuracy"])
        if world is not None:
            world.barrier()
        return res


# ---- scale-out ----------------------------------------------------------------------------
def cmd_scaleout(args: argparse.Namespace) -> dict[str, Any]:
    from leadline.lookahead.noise import steps_and_tokens
    from leadline.plan import Plan

    plan = Plan.from_dict(json.loads(Path(args.plan).read_text())["plan"])
    train, _ = write_rows(Path(args.data_dir), Path(args.work), args.max_chars)
    dev = device_of(None, args)
    micro, accum = int(plan.micro_batch), int(plan.grad_accum)
    per_row = float(plan.scored_tokens_per_row)
    past = plan.get("noise_scale_past_format_tokens")
    b_noise_step0 = float(plan.noise_scale_tokens)
    b_noise = float(past) if isinstance(past, (int, float)) and past > 0 else b_noise_step0  # the reading the step came from
    b_a, b_b = micro * accum * per_row, micro * accum * args.factor * per_row
    steps = int(args.steps or plan.total_steps)
    lr_a = float(plan.lr)
    lr_b = float(args.lr_b) if args.lr_b else lr_a * math.sqrt(args.factor)
    model, tok = load(args, dev)
    a = train_loop(model, tok, train, plan, None, micro=micro, accum=accum, lr=lr_a, steps=steps, eval_every=args.eval_every)
    target = a["held_out_after"]
    model, tok = load(args, dev)
    b = train_loop(model, tok, train, plan, None, micro=micro, accum=accum * args.factor, lr=lr_b, steps=steps,
                   eval_every=1, stop_below=target)
    s_a, _ = steps_and_tokens(b_a, b_noise)
    s_b, _ = steps_and_tokens(b_b, b_noise)
    predicted = s_b / s_a
    s0_a, _ = steps_and_tokens(b_a, b_noise_step0)
    s0_b, _ = steps_and_tokens(b_b, b_noise_step0)
    measured = (b["reached_step"] / steps) if b["reached_step"] else None
    return {"b_noise_tokens": b_noise, "b_noise_step0_tokens": b_noise_step0, "predicted_ratio_step0_noise": s0_b / s0_a, "batch_a_tokens": b_a, "batch_b_tokens": b_b, "factor": args.factor, "lr_a": lr_a, "lr_b": lr_b,
            "steps_a": steps, "target_held_out": target, "steps_b": b["reached_step"], "predicted_ratio": predicted,
            "predicted_steps_b": predicted * steps, "measured_ratio": measured, "perfect_ratio": 1 / args.factor,
            "run_a": a, "run_b": b}


# ---- compare ------------------------------------------------------------------------------
def cmd_compare(args: argparse.Namespace) -> dict[str, Any]:
    from leadline import stats

    d = Path(args.dir)

    def get(name: str) -> dict[str, Any] | None:
        p = d / name
        return json.loads(p.read_text()) if p.exists() else None

    one, two = get("derive_1.json"), get("derive_2.json")
    t1, t2, so = get("train_1.json"), get("train_2.json"), get("scaleout.json")
    out: dict[str, Any] = {}

    def v(res: dict[str, Any], name: str) -> Any:
        return res["plan"]["values"].get(name, {}).get("value")

    if one and two:
        rows1 = v(one, "micro_batch") * v(one, "grad_accum")
        rows2 = v(two, "micro_batch") * v(two, "grad_accum") * 2
        out["R1"] = {"rows_fit": [v(one, "rows_fit"), v(two, "rows_fit")], "rows_a_step": [rows1, rows2],
                     "pass": v(one, "rows_fit") == v(two, "rows_fit") and 0.5 <= rows2 / rows1 <= 2.0}
        b1, b2 = v(one, "noise_scale_tokens"), v(two, "noise_scale_tokens")
        out["R2"] = {"b_noise": [b1, b2], "relative": abs(b2 - b1) / b1, "pass": abs(b2 - b1) / b1 <= 0.10}
        l1, l2 = v(one, "lr"), v(two, "lr")
        out["R3"] = {"lr": [l1, l2], "log2_ratio": math.log2(l2 / l1), "pass": abs(math.log2(l2 / l1)) <= 1.0}
        out["R4"] = {"derive_seconds": [one["derive_seconds"], two["derive_seconds"]],
                     "ratio": two["derive_seconds"] / one["derive_seconds"], "pass": two["derive_seconds"] <= 1.1 * one["derive_seconds"]}
    fsdp = get("derive_2_fsdp.json")
    if two and fsdp:
        b1, b2 = v(two, "noise_scale_tokens"), v(fsdp, "noise_scale_tokens")
        l1, l2 = v(two, "lr"), v(fsdp, "lr")
        r1, r2 = v(two, "micro_batch") * v(two, "grad_accum") * 2, v(fsdp, "micro_batch") * v(fsdp, "grad_accum") * 2
        out["R7"] = {"b_noise": [b1, b2], "lr": [l1, l2], "rows_a_step": [r1, r2],
                     "derive_seconds": [two["derive_seconds"], fsdp["derive_seconds"]],
                     "pass": abs(b2 - b1) / b1 <= 0.10 and abs(math.log2(l2 / l1)) <= 1.0 and 0.5 <= r2 / r1 <= 2.0}
    if t1 and t2:
        m = stats.mcnemar(t2["correct"], t1["correct"]).as_dict()
        a1, a2 = t1["verdict"]["accuracy"], t2["verdict"]["accuracy"]
        out["R5"] = {"accuracy": [a1, a2], "mcnemar": m, "train_seconds": [t1["seconds"], t2["seconds"]],
                     "pass": not (a2 < a1 and m["p_value"] < 0.05)}
    if so and so.get("measured_ratio"):
        meas, pred = so["measured_ratio"], so["predicted_ratio"]
        err = abs(math.log(meas / pred))
        out["R6"] = {"predicted": pred, "measured": meas, "perfect": so["perfect_ratio"],
                     "pass": err < abs(math.log(meas / so["perfect_ratio"])) and err < abs(math.log(meas)) and abs(meas / pred - 1) <= 0.30}
    elif so:
        out["R6"] = {"pass": False, "why": "run B never reached run A's held-out loss within the steps allowed"}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("derive", "train", "scaleout", "compare"))
    ap.add_argument("--model", default="/root/assets/smol.gguf")
    ap.add_argument("--data-dir", default="/root/assets/data")
    ap.add_argument("--work", default="/tmp/distributed_derive")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default=None)
    ap.add_argument("--max-chars", type=int, default=600)
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--effort", default="full", choices=("full",))
    ap.add_argument("--shard", default="none", choices=("none", "fsdp2"), help="derive: the model sharded by fully_shard (under torchrun)")
    ap.add_argument("--max-seconds", type=float, default=None)
    ap.add_argument("--plan", help="a derive JSON this script wrote (train, scaleout)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the plan's total_steps)")
    ap.add_argument("--factor", type=int, default=4, help="scaleout: B_b = factor x B_a")
    ap.add_argument("--lr-b", type=float, default=None, help="scaleout: the rate at B_b (default lr x sqrt(factor))")
    ap.add_argument("--eval-every", type=int, default=5, help="scaleout: run A's held-out read every this many steps")
    ap.add_argument("--dir", help="compare: the folder of the JSONs")
    args = ap.parse_args(argv)
    fn = {"derive": cmd_derive, "train": cmd_train, "scaleout": cmd_scaleout, "compare": cmd_compare}[args.command]
    result: dict[str, Any] = {"benchmark": f"distributed_derive {args.command}", "command": " ".join(sys.argv), "failures": []}
    try:
        result["machine"] = machine()
        result.update(fn(args))
    except Exception:  # recorded, never hidden
        result["failures"].append(traceback.format_exc())
        print(result["failures"][-1], file=sys.stderr, flush=True)
    if result.get("main", True) and int(os.environ.get("RANK", "0")) == 0:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
        log("wrote", args.out)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
