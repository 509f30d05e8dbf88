"""derive() in a 2-process job (gloo, CPU): identical plans, the noise from DDP's all-reduce
against the single-process probe on the same rows, the probe on a model sharded by FSDP against
the same, derive_for on a model sharded by FSDP (both kinds), and failures (an injected OOM, an
error) agreed on by both ranks instead of a hang.

One spawned job runs every scenario (starting two Python processes with torch costs more than
the scenarios do); each rank writes what it saw to a JSON file the tests read. Each scenario has a
deadline, and every collective a 30 s timeout, so a hang fails the tests instead of blocking
CI.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

from helpers import DATA, free_port
from leadline.lookahead.pieces import Pieces

WORLD = 2
DEADLINE_S = 180.0




def _lora_model(tok: Any, adapter_seed: int = 0) -> Any:
    import torch
    from peft import LoraConfig, get_peft_model

    from helpers import make_model

    base = make_model(vocab_size=len(tok))  # seeded: the same base on every rank
    torch.manual_seed(adapter_seed)
    return get_peft_model(base,
                          LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM"))


def _derive(model: Any, tok: Any, **kw: Any) -> Any:
    from leadline.hf import derive_for

    return derive_for(model, tok, str(DATA / "text.jsonl"), total_steps=12, effort="full", **kw)


def _scenario_plan(rank: int, tok: Any) -> dict[str, Any]:
    """A: derive_for on the tiny LoRA Llama; then the single-process probe on the same rows."""
    import torch

    from leadline.hf import prepare, trained_named_weights
    from leadline.lookahead.digest import tensors_digest
    from leadline.lookahead.distributed import plan_digest
    from leadline.lookahead.noise import ModelGradFn, measure_noise_scale

    model = _lora_model(tok, adapter_seed=rank)  # different adapters: derive must use rank 0's
    before = tensors_digest(list(model.parameters()))
    t0 = time.perf_counter()
    plan = _derive(model, tok)
    seconds = time.perf_counter() - t0
    after = tensors_digest(list(model.parameters()))
    import gc

    from torch.nn.parallel import DistributedDataParallel

    gc.collect()
    ddp_left = sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())
    # the probe, alone on this process, on the micro-batches derive drew, in the same order,
    # at the weights derive used (rank 0's)
    import torch.distributed as dist

    named = trained_named_weights(model)
    with torch.no_grad():
        for _, p in named:
            dist.broadcast(p.data, src=0)
    task, _ = prepare(model, tok, str(DATA / "text.jsonl"))
    ev = plan["noise_scale_tokens"].evidence
    probe = measure_noise_scale(ModelGradFn(model, task.micro_batch_of, params=[p for _, p in named]), k=len(ev["micro_tokens"]))
    return {"plan": plan.to_json(), "digest": plan_digest(plan), "seconds": seconds, "weights_kept": before == after,
            "grads_none": all(p.grad is None for p in model.parameters()), "ddp_left": ddp_left,
            "probe": {"b": probe.b_noise_tokens, "se": probe.se_tokens, "micro_tokens": probe.micro_tokens}}


def _scenario_ramp_oom(rank: int, tok: Any) -> dict[str, Any]:
    """B: rank 1's card refuses 2 rows in the ramp (an injected OOM): a measurement on both."""
    import torch

    import leadline.run.task as task_module

    real = task_module.Task.loss_of

    def loss_of(self: Any, b: int, length: int) -> Any:
        if rank == 1 and b >= 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected on rank 1)")
        return real(self, b, length)

    task_module.Task.loss_of = loss_of  # type: ignore[method-assign]
    try:
        plan = _derive(_lora_model(tok), tok)
    finally:
        task_module.Task.loss_of = real  # type: ignore[method-assign]
    return {"plan": plan.to_json(), "rows_fit": plan.rows_fit, "ranks": plan["rows_fit"].evidence["ranks"]}


def _failure(rank: int, tok: Any, inject: Any) -> dict[str, Any]:

    from leadline.lookahead.digest import tensors_digest

    model = _lora_model(tok)
    before = tensors_digest(list(model.parameters()))
    remove = inject(model)
    t0 = time.perf_counter()
    try:
        _derive(model, tok)
        out: dict[str, Any] = {"raised": None}
    except Exception as e:
        out = {"raised": type(e).__name__, "sentence": str(e), "oom": getattr(e, "out_of_memory", None)}
    finally:
        remove()
    out["seconds"] = time.perf_counter() - t0
    out["weights_kept"] = tensors_digest(list(model.parameters())) == before
    return out


def _scenario_forward_oom(rank: int, tok: Any) -> dict[str, Any]:
    """C: rank 1 runs out of memory in the noise phase's second forward."""
    import torch

    def inject(model: Any) -> Any:
        calls = {"n": 0}

        def pre(module: Any, args: Any, kwargs: Any) -> None:
            calls["n"] += 1
            if rank == 1 and calls["n"] == 2:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB (injected on rank 1)")

        h = model.get_base_model().register_forward_pre_hook(pre, with_kwargs=True)
        return h.remove

    return _failure(rank, tok, inject)


def _scenario_held_out_error(rank: int, tok: Any) -> dict[str, Any]:
    """D: rank 0 raises an ordinary error while reading the held-out rows."""
    import leadline.corpus.losses as losses

    real = losses.row_losses

    def inject(model: Any) -> Any:
        def broken(*a: Any, **k: Any) -> Any:
            if rank == 0:
                raise ValueError("a held-out row is broken (injected on rank 0)")
            return real(*a, **k)

        losses.row_losses = broken

        def remove() -> None:
            losses.row_losses = real

        return remove

    return _failure(rank, tok, inject)


def _scenario_budget(rank: int, tok: Any) -> dict[str, Any]:
    """E: a tight max_seconds, and rank 1's derive clock starting 2 s after rank 0's: by its own
    clock rank 0 would skip phases rank 1 runs, and the job would hang. The budget left is the
    least on any rank, so both skip the same phases."""
    import leadline.lookahead.derive.recipe as d
    from leadline.hf import DeriveOptions, derive_for

    real = d.describe_data

    def late(*a: Any, **k: Any) -> Any:  # runs after the last collective, before the runner starts
        if rank == 1:
            time.sleep(2.0)
        return real(*a, **k)

    d.describe_data = late
    try:
        plan = derive_for(_lora_model(tok), tok, str(DATA / "text.jsonl"), total_steps=12, effort="full",
                          options=DeriveOptions(max_seconds=1.5))
    finally:
        d.describe_data = real
    return {"plan": plan.to_json(), "notes": plan.notes}


def _scenario_data_differs(rank: int, tok: Any) -> dict[str, Any]:
    """F: the ranks were given different data: refused on both with one sentence."""
    from leadline.hf import derive_for

    data = DATA / ("text.jsonl" if rank == 0 else "prompt_completion.jsonl")
    try:
        derive_for(_lora_model(tok), tok, str(data), total_steps=12, effort="full")
        return {"raised": None}
    except Exception as e:
        return {"raised": type(e).__name__, "sentence": str(e)}


def _scenario_fsdp_noise(rank: int, tok: Any) -> dict[str, Any]:
    """G: the noise probe on the model sharded by FSDP (ShardedGradFn; FullyShardedDataParallel and
    fully_shard) against the probe on an unsharded copy drawing the same rows (the world's two
    micro-batches of a draw as one)."""
    import copy

    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel

    from helpers import make_model
    from leadline.hf import prepare
    from leadline.lookahead.distributed import ShardedGradFn
    from leadline.lookahead.noise import ModelGradFn, measure_noise_scale

    model = make_model(vocab_size=len(tok))  # seeded: the same full fine-tune on every rank
    task, _ = prepare(model, tok, str(DATA / "text.jsonl"))
    alone = copy.deepcopy(model)
    one = ModelGradFn(alone, task.micro_batch_of)

    def world_draw(i: int) -> Any:  # micro-batches 2i and 2i+1 as one, token-weighted
        a, b = one(2 * i), one(2 * i + 1)
        if a is None or b is None:
            return None
        (ga, ta), (gb, tb) = a, b
        if ta + tb == 0:
            return [], 0
        if not ga or not gb:
            return (ga or gb), ta + tb
        return [(x * ta + y * tb) / (ta + tb) for x, y in zip(ga, gb)], ta + tb

    ref = measure_noise_scale(world_draw, k=6)
    sharded = FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=True)
    params = [p for p in sharded.parameters() if p.requires_grad]
    sentinel = [torch.full_like(p, 7.0) for p in params]
    for p, g in zip(params, sentinel):
        p.grad = g
    with ShardedGradFn(sharded, task.micro_batch_of) as grad_fn:
        got = measure_noise_scale(grad_fn, k=6)
        shard_numel = sum(g.numel() for g in grad_fn(0)[0])
    restored = all(p.grad is g for p, g in zip(params, sentinel))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    two = copy.deepcopy(alone)  # FSDP2: each layer, then the model, sharded as DTensors
    mesh = init_device_mesh("cpu", (WORLD,))
    for layer in two.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(two, mesh=mesh)
    with ShardedGradFn(two, task.micro_batch_of) as grad_fn:
        got2 = measure_noise_scale(grad_fn, k=6)
        # rank 0's time budget runs out after its first draws, rank 1 has none: both stop together
        clock = iter(range(10_000))
        import leadline.lookahead.noise.probe as probe_mod

        real_clock = probe_mod._clock
        probe_mod._clock = lambda: float(next(clock))  # one "second" a look at the clock
        try:
            timed = measure_noise_scale(grad_fn, budget_s=5.0 if rank == 0 else None, max_k=50)
        finally:
            probe_mod._clock = real_clock
        from leadline.lookahead.derive import derive

        plan = derive(pieces=Pieces(gradients=grad_fn))  # the noise phase of derive() on the sharded model
    return {"ref": {"b": ref.b_noise_tokens, "se": ref.se_tokens, "micro_tokens": ref.micro_tokens},
            "got": {"b": got.b_noise_tokens, "se": got.se_tokens, "micro_tokens": got.micro_tokens},
            "got2": {"b": got2.b_noise_tokens, "se": got2.se_tokens, "micro_tokens": got2.micro_tokens},
            "timed": {"k": timed.k, "stopped": timed.stopped_because},
            "derived": {"b": plan.noise_scale_tokens, "k": plan["noise_scale_tokens"].evidence.get("k")},
            "restored": restored, "shard_numel": shard_numel,
            "full_numel": sum(p.numel() for p in alone.parameters() if p.requires_grad)}


def _fsdp1(tok: Any) -> Any:
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel

    from helpers import make_model

    return FullyShardedDataParallel(make_model(vocab_size=len(tok)), device_id=torch.device("cpu"), use_orig_params=True)


def _fsdp2(tok: Any) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from helpers import make_model

    model = make_model(vocab_size=len(tok))
    mesh = init_device_mesh("cpu", (WORLD,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _sharded_derive(model: Any, tok: Any, held_out: int | float) -> dict[str, Any]:
    """derive_for on a sharded full fine-tune: the plan, the weights and grads after, and on an
    unsharded copy alone, alpha1 at the world's first step and the anchor's rewrite scale."""
    from leadline import Plan
    from leadline.lookahead.digest import tensors_digest
    from leadline.lookahead.distributed import plan_digest
    from leadline.lookahead.distributed.sharded import _local

    params = [p for p in model.parameters() if p.requires_grad]
    before = tensors_digest([_local(p.detach()) for p in params])
    from leadline.hf import DeriveOptions

    plan = _derive(model, tok, options=DeriveOptions(held_out=held_out))
    return {"plan": plan.to_json(), "digest": plan_digest(plan),
            "weights_kept": tensors_digest([_local(p.detach()) for p in params]) == before,
            "grads_none": all(p.grad is None for p in params),
            "local_numel": sum(_local(p.detach()).numel() for p in params),
            "alone": _alone(tok, WORLD * Plan.from_json(plan.to_json()).rows_fit, held_out)}


def _alone(tok: Any, rows: int, held_out: int | float) -> dict[str, Any]:
    """On an unsharded copy in this process alone: alpha1, its step the world's step's rows as one
    micro-batch (what derive's first step trains at: rows_fit a rank, one micro-batch, 2 ranks),
    and the anchor's rewrite scale."""
    from helpers import make_model
    from leadline.hf import prepare, trained_named_weights
    from leadline.lookahead.rate import anchor_rate, measure_first_step

    model = make_model(vocab_size=len(tok))
    task, _ = prepare(model, tok, str(DATA / "text.jsonl"), held_out=held_out)
    named = trained_named_weights(model)
    fs = measure_first_step([p for _, p in named], task.optimizer, task.train_step_of(rows, 1), task.held_out_losses())
    return {"alpha1": fs.alpha1, "rewrite_scale": anchor_rate(named, "weights").rewrite.scale}


def _scenario_fsdp_derive(rank: int, tok: Any) -> dict[str, Any]:
    """H: derive_for on the tiny Llama sharded by FullyShardedDataParallel (use_orig_params)."""
    return _sharded_derive(_fsdp1(tok), tok, held_out=0.1)


def _scenario_fsdp2_derive(rank: int, tok: Any) -> dict[str, Any]:
    """I: the same, sharded by fully_shard (each layer, then the model), on 5 held-out rows:
    rank 0 reads 3, rank 1 reads 2 and a repeat it drops."""
    return _sharded_derive(_fsdp2(tok), tok, held_out=5)


def _scenario_fsdp_lora(rank: int, tok: Any) -> dict[str, Any]:
    """K: a PEFT LoRA model (the same adapter on both ranks) sharded by FullyShardedDataParallel."""
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel

    from leadline.lookahead.digest import tensors_digest
    from leadline.lookahead.distributed import plan_digest

    model = FullyShardedDataParallel(_lora_model(tok), device_id=torch.device("cpu"), use_orig_params=True)
    before = tensors_digest(list(model.parameters()))
    plan = _derive(model, tok)
    return {"plan": plan.to_json(), "digest": plan_digest(plan), "weights_kept": tensors_digest(list(model.parameters())) == before}


def _scenario_fsdp_ramp_oom(rank: int, tok: Any) -> dict[str, Any]:
    """J: every rank's card refuses 2 rows in the lockstep ramp, inside the forward (an injected
    OOM in the second layer, after its parameters were gathered; the same step on both ranks, as
    identical cards would): rows_fit 1 on both, a measurement, under either kind of FSDP."""
    import torch

    import leadline.run.task as task_module

    real = task_module.Task.loss_of
    out: dict[str, Any] = {}
    for kind, shard in (("fsdp1", _fsdp1), ("fsdp2", _fsdp2)):
        model = shard(tok)
        layer = next(m for n, m in model.named_modules() if n.endswith("layers.1"))

        def refuse(module: Any, args: Any) -> None:
            if args[0].shape[0] >= 2:
                raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (injected on rank {rank})")

        def loss_of(self: Any, b: int, length: int, layer: Any = layer) -> Any:  # only the ramp's steps run out of memory
            hook = layer.register_forward_pre_hook(refuse)
            try:
                return real(self, b, length)
            finally:
                hook.remove()

        task_module.Task.loss_of = loss_of  # type: ignore[method-assign]
        try:
            plan = _derive(model, tok)
        finally:
            task_module.Task.loss_of = real  # type: ignore[method-assign]
        out[kind] = {"plan": plan.to_json(), "rows_fit": plan.rows_fit, "alpha1": plan.alpha1,
                     "ranks": plan["rows_fit"].evidence["ranks"]}
    return out


def _scenario_fsdp_mix(rank: int, tok: Any) -> dict[str, Any]:
    """L: the lockstep ramp's length mix (run here as on CUDA): rank 1's allocator retries on a
    mix step at 2 rows or more (injected after the real step, so both ranks ran it): the
    candidate fails on both, and the rows kept ran the mix clean on both."""
    import dataclasses
    import importlib

    import leadline.lookahead.distributed.sharded_job as sj

    probe_mod = importlib.import_module("leadline.memory.probe")  # the sharded ramp measures each step there

    real_probe, real_mix_on = probe_mod.probe, sj._mix_on

    def probe(step: Any, mem: Any, rows: int, length: int, repeats: int = 1, phase: str = "search", empty: bool = True) -> Any:
        rung, timing = real_probe(step, mem, rows, length, repeats, phase, empty)
        if rank == 1 and phase == "mix" and rows >= 2:
            rung = dataclasses.replace(rung, retries=1, verdict="squeezed")
        return rung, timing

    probe_mod.probe, sj._mix_on = probe, (lambda mem: True)
    try:
        plan = _derive(_fsdp1(tok), tok)
    finally:
        probe_mod.probe, sj._mix_on = real_probe, real_mix_on
    from leadline.lookahead.distributed import plan_digest

    return {"plan": plan.to_json(), "digest": plan_digest(plan), "rows_fit": plan.rows_fit, "seq_len": plan.seq_len,
            "source": plan["rows_fit"].source, "evidence": plan["rows_fit"].evidence}


STUCK_TIMEOUT_S = 8.0


def _short_group_timeout() -> None:
    """gloo cannot end a pending collective from outside (an abort on either side leaves it
    waiting while anything holds the group): the rank left inside FSDP's collectives leaves them
    at the group's timeout, set short here (NCCL's abort ends it at once)."""
    import datetime

    import torch.distributed as dist

    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=STUCK_TIMEOUT_S))


_failed_at: list[float] = []  # when this rank's injected failure first raised (time.monotonic)


def _failing(error: Exception) -> Exception:
    """``error``, its instant kept: how long a rank took to stop is counted from the failure,
    not from a derive start whose work before it a busy machine slows."""
    _failed_at.append(time.monotonic())
    return error


def _until_stopped(run: Any, undo: Any) -> dict[str, Any]:
    """Run a derive that one rank's failure should stop; then ``undo()`` the injection. What it
    raised, when it ended and when this rank failed (``time.monotonic``, one clock for the
    host's processes), and whether the process groups are still there."""
    import torch.distributed as dist

    _failed_at.clear()
    try:
        run()
        out: dict[str, Any] = {"raised": None}
    except Exception as e:
        out = {"raised": type(e).__name__, "sentence": str(e), "oom": getattr(e, "out_of_memory", None),
               "rank": getattr(e, "rank", None)}
    finally:
        undo()
    out.update(ended=time.monotonic(), failed_at=_failed_at[0] if _failed_at else None, group_left=dist.is_initialized())
    return out


def _armed(cls: Any, rank: int, failing_rank: int, armed: dict[str, bool]) -> Any:
    """Wrap ``cls.train_step_of`` so ``armed["on"]`` holds on ``failing_rank`` during its training
    steps; returns the original, to put back."""
    real = cls.train_step_of

    def train_step_of(self: Any, micro_batch: int, grad_accum: int) -> Any:
        step = real(self, micro_batch, grad_accum)

        def armed_step(t: int) -> float:
            armed["on"] = rank == failing_rank
            try:
                return step(t)
            finally:
                armed["on"] = False

        return armed_step

    cls.train_step_of = train_step_of
    return real


def _scenario_fsdp_one_rank_oom(rank: int, tok: Any) -> dict[str, Any]:
    """M (it aborts the job's process groups; the worker joins a new group after it): rank 1 alone runs out of memory inside the
    sharded forward at 2 rows (in the second layer, after the parameters were gathered), while
    rank 0's card holds the step and goes on to the backward's reduce-scatter. Both ranks stop
    with rank 1's sentence through the store: rank 1 at once, rank 0 when its collective ends."""
    import torch

    import leadline.run.task as task_module

    _short_group_timeout()
    real = task_module.Task.loss_of
    model = _fsdp1(tok)
    layer = next(m for n, m in model.named_modules() if n.endswith("layers.1"))

    def refuse(module: Any, args: Any) -> None:
        if rank == 1 and args[0].shape[0] >= 2:
            raise _failing(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected on rank 1 alone)"))

    def loss_of(self: Any, b: int, length: int) -> Any:
        hook = layer.register_forward_pre_hook(refuse)
        try:
            return real(self, b, length)
        finally:
            hook.remove()

    task_module.Task.loss_of = loss_of  # type: ignore[method-assign]
    return _until_stopped(lambda: _derive(model, tok), lambda: setattr(task_module.Task, "loss_of", real))


def _scenario_fsdp_step_failure(rank: int, tok: Any) -> dict[str, Any]:
    """N (it aborts the job's process groups; the worker joins a new group after it): rank 0
    alone fails inside the forward of its first sharded training step (a rate phase's), while
    rank 1 goes on to the step's next collective. Both stop with rank 0's sentence."""
    import leadline.lookahead.distributed.sharded_job as sj

    _short_group_timeout()
    model = _fsdp1(tok)
    layer = next(m for n, m in model.named_modules() if n.endswith("layers.1"))
    armed = {"on": False}

    def fail(module: Any, args: Any) -> None:
        if armed["on"]:
            raise _failing(ValueError("a training row is broken (injected on rank 0 alone)"))

    hook = layer.register_forward_pre_hook(fail)
    real = _armed(sj.ShardedWorldTask, rank, 0, armed)

    def undo() -> None:
        sj.ShardedWorldTask.train_step_of = real  # type: ignore[method-assign]
        hook.remove()

    return _until_stopped(lambda: _derive(model, tok), undo)


def _scenario_ddp_backward_failure(rank: int, tok: Any) -> dict[str, Any]:
    """O (it aborts the job's process groups): under DDP, rank 0 alone fails inside the
    all-reducing backward of its first training step (a rate phase's), while rank 1 waits in
    DDP's all-reduce. Both stop with rank 0's sentence."""
    import leadline.lookahead.distributed.job as job_mod

    _short_group_timeout()
    model = _lora_model(tok)
    armed = {"on": False}

    def fail(grad: Any) -> Any:
        if armed["on"]:
            raise _failing(ValueError("the backward broke (injected on rank 0 alone)"))
        return grad

    p = next(p for n, p in model.named_parameters() if p.requires_grad and "lora_A" in n)
    handle = p.register_hook(fail)
    real = _armed(job_mod.WorldTask, rank, 0, armed)

    def undo() -> None:
        job_mod.WorldTask.train_step_of = real  # type: ignore[method-assign]
        handle.remove()

    return _until_stopped(lambda: _derive(model, tok), undo)


def _scenario_fsdp_held_out_failure(rank: int, tok: Any) -> dict[str, Any]:
    """P (it aborts the job's process groups): under FSDP rank 1 alone fails at the start of a
    held-out read, while rank 0 waits for it in the read's first all-gather."""
    import leadline.corpus.losses as losses

    _short_group_timeout()
    real = losses.row_losses

    def broken(*a: Any, **k: Any) -> Any:
        if rank == 1:
            raise _failing(ValueError("a held-out row is broken (injected on rank 1 alone)"))
        return real(*a, **k)

    losses.row_losses = broken
    model = _fsdp1(tok)
    return _until_stopped(lambda: _derive(model, tok), lambda: setattr(losses, "row_losses", real))


SCENARIOS = {"plan": _scenario_plan, "fsdp_noise": _scenario_fsdp_noise, "ramp_oom": _scenario_ramp_oom, "forward_oom": _scenario_forward_oom,
             "held_out_error": _scenario_held_out_error, "budget": _scenario_budget, "data_differs": _scenario_data_differs,
             "fsdp_derive": _scenario_fsdp_derive, "fsdp2_derive": _scenario_fsdp2_derive, "fsdp_lora": _scenario_fsdp_lora,
             "fsdp_ramp_oom": _scenario_fsdp_ramp_oom, "fsdp_mix": _scenario_fsdp_mix,
             # these four abort the job's process groups: the worker joins a new group after each
             "fsdp_one_rank_oom": _scenario_fsdp_one_rank_oom, "fsdp_step_failure": _scenario_fsdp_step_failure,
             "ddp_backward_failure": _scenario_ddp_backward_failure, "fsdp_held_out_failure": _scenario_fsdp_held_out_failure}


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    # rendezvous through files in the job's folder: a port chosen ahead can be taken by any
    # connection's ephemeral port before a scenario that aborts the groups needs a new one
    stores = (f"file://{Path(out_dir, f'store{n}')}" for n in range(len(SCENARIOS) + 1))
    dist.init_process_group("gloo", init_method=next(stores), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    from helpers import make_tokenizer

    tok = make_tokenizer()
    results: dict[str, Any] = {}
    only = os.environ.get("LEADLINE_SCENARIOS")  # a comma-separated subset, while working on one
    for name, fn in SCENARIOS.items():
        if only and name not in only.split(","):
            continue
        try:
            results[name] = fn(rank, tok)
        except Exception:
            results[name] = {"error": traceback.format_exc()}
        Path(out_dir, f"rank{rank}.done").write_text(name)  # the parent's watchdog: a scenario ended
        if not dist.is_initialized():  # the scenario aborted the process groups: a new group
            dist.init_process_group("gloo", init_method=next(stores), rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=30))
        dist.barrier()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    import gc

    gc.collect()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def job(tmp_path_factory: Any) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("job")
    ctx = mp.start_processes(_worker, args=(WORLD, free_port(), str(out)), nprocs=WORLD, join=False,
                             start_method="spawn")
    # a hang is a scenario that does not end: the deadline moves on each time one ends, so a busy
    # machine's slower scenarios still finish while a stuck collective fails the tests
    done = [out / f"rank{r}.done" for r in range(WORLD)]
    seen, deadline = None, time.monotonic() + DEADLINE_S
    try:
        while not ctx.join(timeout=1.0):
            now = [p.stat().st_mtime_ns if p.exists() else 0 for p in done]
            if now != seen:
                seen, deadline = now, time.monotonic() + DEADLINE_S
            if time.monotonic() > deadline:
                pytest.fail(f"a scenario of the 2-process job did not end within {DEADLINE_S:.0f} s: a collective hung")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


def _ok(job: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    got = [r[name] for r in job]
    for r, g in enumerate(got):
        assert "error" not in g, f"rank {r}, scenario {name}:\n{g['error']}"
    return got


def test_every_rank_ends_with_the_same_plan(job):
    from leadline import Plan

    a, b = _ok(job, "plan")
    assert a["digest"] == b["digest"] and a["plan"] == b["plan"]
    plan = Plan.from_json(a["plan"])
    assert plan.world_size == 2 and plan.machine["world"]["world_size"] == 2
    assert [r["rank"] for r in plan.machine["world"]["ranks"]] == [0, 1]
    for name in ("noise_scale_tokens", "rows_fit", "t_allreduce_seconds", "tokens_per_step", "micro_batch", "grad_accum", "alpha1", "lr"):
        assert name in plan, name
    # tokens per step count the whole world: micro x accum x world size rows
    ev = plan["tokens_per_step"].evidence
    assert ev["rows_per_step"] == plan.micro_batch * plan.grad_accum * 2
    assert plan.micro_batch <= plan.rows_fit
    assert any("derive used rank 0's" in n for n in plan.notes)  # the ranks' adapters differed
    assert a["weights_kept"] and b["weights_kept"], "each rank's own weights must come back"
    assert a["grads_none"] and b["grads_none"]
    assert a["ddp_left"] == 0 == b["ddp_left"], "derive_for's DDP wrapper outlived it"


def test_the_noise_from_the_all_reduce_is_the_single_process_probe(job):
    """On 2 ranks the hook's draws are the probe's draws on the same micro-batches in the same
    order, so the estimates agree within float rounding — far inside one standard error."""
    from leadline import Plan

    a, _ = _ok(job, "plan")
    plan = Plan.from_json(a["plan"])
    ddp = plan["noise_scale_tokens"]
    assert ddp.evidence["via"] == "ddp_hook" and "DDP's all-reduce on 2 ranks" in ddp.source
    for rank in job:
        probe = rank["plan"]["probe"]
        assert probe["micro_tokens"] == ddp.evidence["micro_tokens"]
        assert abs(ddp.value - probe["b"]) <= probe["se"], "outside one standard error"
        assert ddp.value == pytest.approx(probe["b"], rel=1e-4)
        assert ddp.evidence["se_tokens"] == pytest.approx(probe["se"], rel=1e-3)


def test_an_oom_in_one_ranks_ramp_is_a_measurement_on_both(job):
    a, b = _ok(job, "ramp_oom")
    assert a["plan"] == b["plan"]
    assert a["rows_fit"] == 1 == b["rows_fit"]
    kept = {r["rank"]: r["rows_kept"] for r in a["ranks"]}
    assert kept[1] == 1 and kept[0] >= 1


def test_an_oom_in_one_ranks_forward_is_the_same_sentence_on_both(job):
    a, b = _ok(job, "forward_oom")
    assert a["raised"] == "RankFailed" == b["raised"]
    assert a["sentence"] == b["sentence"]
    assert "ran out of memory on rank 1 of 2" in a["sentence"] and "injected on rank 1" in a["sentence"]
    assert a["oom"] is True and b["oom"] is True
    assert a["weights_kept"] and b["weights_kept"]


def test_an_error_on_one_rank_stops_both_with_its_sentence(job):
    a, b = _ok(job, "held_out_error")
    assert a["raised"] == "RankFailed" == b["raised"]
    assert a["sentence"] == b["sentence"]
    assert "failed on rank 0 of 2" in a["sentence"] and "a held-out row is broken" in a["sentence"]
    assert a["oom"] is False
    assert a["weights_kept"] and b["weights_kept"]


def test_a_time_budget_skips_the_same_phases_on_every_rank(job):
    a, b = _ok(job, "budget")
    assert a["plan"] == b["plan"]
    assert any("max_seconds" in n for n in a["notes"]), a["notes"]


def test_ranks_given_different_data_are_refused_on_both(job):
    a, b = _ok(job, "data_differs")
    assert a["raised"] == "InputError" == b["raised"] and a["sentence"] == b["sentence"]
    assert "the tokenized training rows differ between ranks" in a["sentence"]


def test_the_probe_on_a_model_sharded_by_fsdp_is_the_single_process_probe(job):
    """Each rank sums its shard; one all-reduce of three numbers a draw gives the whole
    gradient's sums, so the estimate is the unsharded probe's on the same rows."""
    for r in _ok(job, "fsdp_noise"):
        for got in (r["got"], r["got2"]):  # FullyShardedDataParallel, fully_shard
            assert got["micro_tokens"] == r["ref"]["micro_tokens"]
            assert got["b"] == pytest.approx(r["ref"]["b"], rel=1e-4)
            assert got["se"] == pytest.approx(r["ref"]["se"], rel=1e-3)
        assert r["shard_numel"] < r["full_numel"], "each rank must hold a shard, not the whole gradient"
        assert r["restored"], "the .grad the trained tensors held before the probe must come back"
    a, b = _ok(job, "fsdp_noise")
    # a time budget on one rank's clock stops both at the same draw, instead of a hang
    assert a["timed"] == b["timed"] and a["timed"]["stopped"] == "time" and 0 < a["timed"]["k"] < 50
    assert a["derived"] == b["derived"] and a["derived"]["b"] > 0


@pytest.mark.parametrize("scenario", ["fsdp_derive", "fsdp2_derive"])
def test_derive_for_on_a_model_sharded_by_fsdp_gives_every_rank_the_same_plan(job, scenario):
    """FullyShardedDataParallel (use_orig_params) and fully_shard: the ramp in lockstep through
    the sharded model, the step over the world, and the first step through the sharded
    optimizer step and held-out reads, whose alpha1 is the unsharded model's alone on the same rows."""
    from leadline import Plan

    a, b = _ok(job, scenario)
    assert a["digest"] == b["digest"] and a["plan"] == b["plan"]
    plan = Plan.from_json(a["plan"])
    assert plan.world_size == 2
    for name in ("noise_scale_tokens", "rows_fit", "t_micro_seconds", "t_step_seconds", "tokens_per_step", "micro_batch",
                 "grad_accum", "alpha1", "lr"):
        assert name in plan and plan.get(name) is not None, name
    assert "t_allreduce_seconds" not in plan  # FSDP's communication is inside the timed forward+backward
    rows_fit = plan["rows_fit"]
    assert "lockstep ramp through the sharded model" in rows_fit.source
    ranks = rows_fit.evidence["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [(g["rows"], g["phase"]) for g in ranks[0]["rungs"]] == [(g["rows"], g["phase"]) for g in ranks[1]["rungs"]]
    for r in ranks:  # the kept rows: confirmed on every rank
        last = r["rungs"][-1]
        assert (last["rows"], last["phase"], last["verdict"]) == (plan.rows_fit, "confirm", "fits")
    ev = plan["tokens_per_step"].evidence
    assert ev["rows_per_step"] == plan.micro_batch * plan.grad_accum * 2  # the whole world's rows
    assert plan.model["trained_parameters"] == 2 * a["local_numel"] == 2 * b["local_numel"]  # the whole tensors, not a shard
    assert plan.model["trained_as"] == "weights"
    assert len(plan.held_out["held_out"]) == (4 if scenario == "fsdp_derive" else 5)  # 5: the ranks read 3 and 2 rows
    alone = a["alone"]
    assert alone["alpha1"] is not None
    assert plan.alpha1 == pytest.approx(alone["alpha1"], rel=1e-3), "the first step through the sharded model is not the model's"
    assert plan.rewrite_scale == pytest.approx(alone["rewrite_scale"], rel=1e-6), "the anchor read a shard, not the whole tensors"
    for r in (a, b):
        assert r["weights_kept"], "each rank's shards must come back as they were"
        assert r["grads_none"]


def test_an_oom_on_every_rank_in_the_lockstep_ramp_is_a_measurement_on_every_rank(job):
    a, b = _ok(job, "fsdp_ramp_oom")
    for kind in ("fsdp1", "fsdp2"):
        assert a[kind]["plan"] == b[kind]["plan"]
        assert a[kind]["rows_fit"] == 1 == b[kind]["rows_fit"]
        assert a[kind]["alpha1"] is not None, "the sharded model must train after the refused forward"
        for r in a[kind]["ranks"]:
            assert {"rows": 2, "phase": "search", "verdict": "oom"}.items() <= next(g for g in r["rungs"] if g["rows"] == 2).items()
            assert r["rungs"][-1]["rows"] == 1 and r["rungs"][-1]["phase"] == "confirm"


def test_derive_for_on_a_lora_model_sharded_by_fsdp(job):
    from leadline import Plan

    a, b = _ok(job, "fsdp_lora")
    assert a["digest"] == b["digest"] and a["plan"] == b["plan"]
    plan = Plan.from_json(a["plan"])
    assert plan.model["trained_as"] == "factors" and plan.model["trained_parameters"] == 4096  # r 4 on 2 layers x 7 linears: the whole adapter, not a shard
    for name in ("noise_scale_tokens", "rows_fit", "tokens_per_step", "alpha1", "lr"):
        assert plan.get(name) is not None, name
    assert a["weights_kept"] and b["weights_kept"]


def test_the_lockstep_ramp_confirms_through_the_length_mix_on_every_rank(job):
    """A retry on one rank at a mix length fails the candidate on every rank; the kept rows ran
    the whole mix (shorter lengths, the full length after each) clean on both."""
    a, b = _ok(job, "fsdp_mix")
    assert a["digest"] == b["digest"] and a["plan"] == b["plan"]
    assert a["rows_fit"] == 1 == b["rows_fit"]
    ev = a["evidence"]
    assert ev["lengths_mix"] and all(n < a["seq_len"] for n in ev["lengths_mix"])
    assert "length mix" in a["source"]
    r0, r1 = (r["rungs"] for r in ev["ranks"])
    assert [(g["rows"], g["length"], g["phase"]) for g in r0] == [(g["rows"], g["length"], g["phase"]) for g in r1]
    failed = [i for i, g in enumerate(r1) if g["phase"] == "mix" and g["verdict"] == "squeezed"]
    assert failed and all(r1[i]["rows"] >= 2 and r0[i]["verdict"] == "fits" for i in failed)
    for i in failed:  # the mix stopped at the failed step: the next rung is another candidate's
        assert i + 1 == len(r1) or r1[i + 1]["phase"] != "mix" or r1[i + 1]["rows"] != r1[i]["rows"]
    kept_mix = [g for g in r1 if g["rows"] == 1 and g["phase"] == "mix"]
    assert len(kept_mix) == 2 * len(ev["lengths_mix"]) and all(g["verdict"] == "fits" for g in kept_mix)
    assert [g["length"] for g in kept_mix][1::2] == [a["seq_len"]] * len(ev["lengths_mix"])


def _stopped_after(rank: dict[str, Any], failing: dict[str, Any]) -> float:
    """Seconds from the failing rank's failure to ``rank``'s raise."""
    assert failing["failed_at"] is not None, "the injected failure did not raise"
    return rank["ended"] - failing["failed_at"]


def test_an_oom_on_one_rank_inside_the_sharded_forward_stops_every_rank_with_its_sentence(job):
    """The other rank waits inside FSDP's collectives, where no agreement reaches it: the failing
    rank stops the job through the store and raises within seconds; the other raises the same
    sentence when its collective ends (NCCL: at once, by the abort; gloo: at the group's timeout),
    instead of a collective mismatch."""
    a, b = _ok(job, "fsdp_one_rank_oom")
    assert a["raised"] == "WorldAborted" == b["raised"]
    assert a["sentence"] == b["sentence"]
    assert "ran out of memory on rank 1 of 2 inside the sharded model's forward or backward" in a["sentence"]
    assert "rank(s) 0 stayed inside its collectives" in a["sentence"]
    assert "(the most rows that fitted on every rank so far: 1)" in a["sentence"]
    assert a["oom"] is True and a["rank"] == 1 == b["rank"]
    # the failing rank: its wait for the marks (5 s at least) and the abort, not the timeout
    assert _stopped_after(b, b) < STUCK_TIMEOUT_S + 5
    # the rank left inside: out at its group's timeout on gloo, with the failing rank's sentence
    # (without the stop line: a collective mismatch that aborted both processes)
    assert _stopped_after(a, b) < 2 * STUCK_TIMEOUT_S + 10
    assert not a["group_left"] and not b["group_left"], "the process groups must be aborted on every rank"


def test_a_failure_on_one_rank_inside_a_sharded_training_step_stops_every_rank_with_its_sentence(job):
    """Outside the ramp no failure is a measurement: rank 0's error inside the forward of a rate
    phase's sharded step stops both ranks with its sentence, instead of rank 1 waiting in the
    step's next collective."""
    a, b = _ok(job, "fsdp_step_failure")
    assert a["raised"] == "WorldAborted" == b["raised"]
    assert a["sentence"] == b["sentence"]
    assert "failed on rank 0 of 2: ValueError: a training row is broken (injected on rank 0 alone)" in a["sentence"]
    assert a["sentence"].startswith("the sharded training step ")
    assert a["oom"] is False and a["rank"] == 0 == b["rank"]
    assert _stopped_after(a, a) < STUCK_TIMEOUT_S  # the failing rank stops at once
    assert _stopped_after(b, a) < 2 * STUCK_TIMEOUT_S + 10  # the other at its group's timeout (gloo)
    assert not a["group_left"] and not b["group_left"]


def test_a_failure_on_one_rank_inside_ddps_backward_stops_every_rank_with_its_sentence(job):
    """DDP's backward all-reduces: a rank that fails inside it leaves the others in the
    all-reduce. Both ranks raise its sentence (before: the backend's timeout, no sentence)."""
    a, b = _ok(job, "ddp_backward_failure")
    assert a["raised"] == "WorldAborted" == b["raised"] and a["sentence"] == b["sentence"]
    assert "backward (micro-batch 0) failed on rank 0 of 2: ValueError: the backward broke (injected on rank 0 alone)" in a["sentence"]
    assert a["rank"] == 0 == b["rank"]
    assert _stopped_after(a, a) < STUCK_TIMEOUT_S and _stopped_after(b, a) < 2 * STUCK_TIMEOUT_S + 10
    assert not a["group_left"] and not b["group_left"]


def test_a_failure_on_one_rank_at_a_sharded_held_out_read_stops_every_rank_with_its_sentence(job):
    a, b = _ok(job, "fsdp_held_out_failure")
    assert a["raised"] == "WorldAborted" == b["raised"] and a["sentence"] == b["sentence"]
    assert a["sentence"].startswith("the sharded held-out read failed on rank 1 of 2: ValueError: a held-out row is broken")
    assert a["rank"] == 1 == b["rank"]
    assert _stopped_after(b, b) < STUCK_TIMEOUT_S and _stopped_after(a, b) < 2 * STUCK_TIMEOUT_S + 10
    assert not a["group_left"] and not b["group_left"]
