"""derive() on a Hugging Face model (derive_for's full effort): the pieces built on its Task, the
torchrun job's own where there is one, and the rows that fit without gradient checkpointing.

:func:`leadline.hf.derive_for` unpacks what it was given (a trainer's model, rows, length and loss
policy) and puts the model back after; here :func:`model_pieces` joins the job, checks the model
and prepares the :class:`~leadline.run.task.Task`, :func:`join_the_job` takes the job's own pieces
(FSDP's sharded step, DDP's wrapper), and :func:`derive_on` runs derive() on them.
:func:`probe_of` is the noise probe over the task's rows; :func:`rows_fit_unchecked` the ramp run
again with checkpointing off, so the plan holds what checkpointing buys.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.lookahead.derive.strategy import strategy_for
from leadline.lookahead.noise.gradfn import ModelGradFn
from leadline.lookahead.pieces import Corpus, Pieces, optimizer_of
from leadline.lookahead.strategy import Strategy
from leadline.plan import Plan, Value
from leadline.run.precision import check_trainable, checkpointing, precision_of
from leadline.run.task import Task, loss_resolution, prepare, rows_of, trained_as_of, trained_named_weights

if TYPE_CHECKING:
    import torch

__all__ = ["ModelPieces", "adapter_dtype_note", "at_batch", "derive_on", "describe_model", "join_the_job",
           "measured_after", "model_pieces", "probe_of", "rows_fit_unchecked"]


@dataclass
class ModelPieces:
    """The model as measured (in a torchrun job: unwrapped) and the pieces derive() is given."""

    model: Any
    inner: Any  # FullyShardedDataParallel's model, for what it says of itself
    world: Strategy
    sharded: bool
    was_training: bool
    task: Task
    prof: Any
    named: list[tuple[str, Any]]
    kind: str
    model_info: dict[str, Any]
    step_fn: Any
    train_step_of: Callable[[int, int], Any]
    lengths: list[int]
    grad_fn: Any = None
    held_out_losses: Any = None
    job: Any = None


def describe_model(model: torch.nn.Module | None = None, *, name: str | None = None,
                   trained_as: str | None = None) -> dict[str, Any]:
    """The model's name, its trained (requires_grad) parameter count and how they are trained.

    The name is ``name``, else the config's ``_name_or_path``, else the class name.

    Examples:
        >>> import torch
        >>> describe_model(torch.nn.Linear(4, 2))  # 4 x 2 weights + 2 biases
        {'name': 'Linear', 'parameters': 10, 'trained_parameters': 10}
        >>> frozen_bias = torch.nn.Linear(4, 2)
        >>> _ = frozen_bias.bias.requires_grad_(False)
        >>> describe_model(frozen_bias, name="probe", trained_as="lora")
        {'name': 'probe', 'parameters': 10, 'trained_parameters': 8, 'trained_as': 'lora'}
        >>> describe_model(name="my-model")
        {'name': 'my-model'}
    """
    out: dict[str, Any] = {}
    if model is not None:
        cfg = getattr(model, "config", None)
        out["name"] = name or getattr(cfg, "_name_or_path", None) or type(model).__name__
        params = list(model.parameters())
        out["parameters"] = int(sum(p.numel() for p in params))
        out["trained_parameters"] = int(sum(p.numel() for p in params if p.requires_grad))
    elif name:
        out["name"] = name
    if trained_as:
        out["trained_as"] = trained_as
    return out


def model_pieces(model: Any, tokenizer: Any, train_dataset: Any, *, seq_len: int | None, quantile: float | None,
                 held_out: int | float, test: int | float, seed: int, probe_rows: int, fields: dict[str, str] | None,
                 trained_as: str | None, batch: tuple[int, int] | None) -> ModelPieces:
    """The job joined, the model checked, the task prepared and the one-process pieces built on it."""
    from leadline.lookahead.distributed.world import join_job
    from leadline.memory import TrainingStep

    # in a torchrun job: DDP or FSDP pieces below, the plan agreed by every rank
    world = strategy_for(join_job(next(model.parameters()).device))
    model, sharded = world.unwrap(model)
    inner = model.module if sharded and hasattr(model, "module") else model
    was_training = model.training
    check_trainable(inner)  # a quantized base without an adapter, or off CUDA: one sentence before anything runs
    task, prof = prepare(model, tokenizer, train_dataset, seq_len=seq_len, quantile=quantile,
                         held_out=held_out, test=test, seed=seed, probe_rows=probe_rows, fields=fields)
    named = trained_named_weights(model)
    kind = trained_as or trained_as_of(inner)
    model_info = describe_model(inner, trained_as=kind)
    model.train()
    step_fn = TrainingStep(task.loss_of, task.optimizer)
    lengths = [len(task.rows[i].input_ids) for i in task.order[:64]]  # the corpus's length mix, for the ramp
    train_step_of = task.train_step_of if batch is None else at_batch(task.train_step_of, batch)
    return ModelPieces(model, inner, world, sharded, was_training, task, prof, named, kind, model_info, step_fn,
                       train_step_of, lengths)


def join_the_job(p: ModelPieces, batch: tuple[int, int] | None) -> None:
    """In a torchrun job, the pieces of the job's own: FSDP's sharded step, or DDP's wrapper."""
    p.job = p.world.task_job(p.task, [w for _, w in p.named], p.sharded)
    if p.job is not None and p.sharded:
        p.step_fn = p.job.step_fn()
        # the whole tensors' entries, not this rank's shards'
        p.model_info.update(parameters=p.job.world_numel(list(p.model.parameters())),
                            trained_parameters=p.job.world_numel(p.job.params))
    if p.job is not None:
        p.grad_fn, p.train_step_of, p.held_out_losses = p.job.grad_fn(), p.job.train_step_of, p.job.held_out_losses()
        if batch is not None:
            p.train_step_of = at_batch(p.job.train_step_of, batch)


def derive_on(p: ModelPieces, train_dataset: Any, tokenizer: Any, *, measure: tuple[str, ...],
              **derive_kw: Any) -> Plan:
    """derive() on the model's pieces: the phases of ``measure`` (``"batch"``: the noise, the ramp
    and the step; ``"rate"``: alpha1 and the rate) given what they run on, the others not;
    ``derive_kw``: derive()'s keywords (the effort, the run's length, the bound, the progress)."""
    from leadline.lookahead.derive import derive

    sizes = "batch" in measure  # the noise, the ramp and the step run when they are given their pieces
    rates = "rate" in measure  # alpha1 and the rate run when given the held-out reader
    path = isinstance(train_dataset, (str, os.PathLike))
    corpus = Corpus(train_dataset if path else rows_of(train_dataset), tokenizer=tokenizer,
                    seq_len=p.task.seq_len, lengths=p.lengths, profile=p.prof, held_out=p.task.split.as_dict())
    pieces = Pieces(step=p.step_fn if sizes else None,
                    gradients=(p.grad_fn or probe_of(p.model, p.task, [w for _, w in p.named])) if sizes else None,
                    weights=p.named, trained_as=p.kind, optimizer=p.task.optimizer, train_step_of=p.train_step_of,
                    held_out_losses=(p.held_out_losses or p.task.held_out_losses()) if rates else None,
                    loss_resolution=loss_resolution(p.inner), device=p.task.device, model_info=p.model_info)
    return derive(corpus, pieces, **derive_kw)


def at_batch(train_step_of: Callable[[int, int], Any], batch: tuple[int, int]) -> Callable[[int, int], Any]:
    """``train_step_of`` with every step at ``batch``, whatever the phase asks for."""
    micro_batch, grad_accum = int(batch[0]), int(batch[1])
    if micro_batch < 1 or grad_accum < 1:
        raise InputError(f"batch={batch!r} must be (micro_batch, grad_accum), both >= 1")

    def at(_micro_batch: int, _grad_accum: int) -> Any:
        return train_step_of(micro_batch, grad_accum)

    return at


def probe_of(model: Any, task: Task, params: list[Any]) -> Any:
    """The probe's grad_fn over the task's rows, telling derive how many rows a draw reads."""
    return _TaskProbe(model, task, params)


class _CountedProbe(ModelGradFn):
    """A :class:`~leadline.lookahead.noise.ModelGradFn` over draws of ``rows_per_draw`` rows (a
    :class:`~leadline.lookahead.pieces.CountedSource`)."""

    def __init__(self, model: Any, draws: Callable[[int], Any], params: list[Any], rows_per_draw: int) -> None:
        super().__init__(model, draws, params=params)
        self.rows_per_draw = rows_per_draw


class _TaskProbe(_CountedProbe):
    """The probe over the task's micro-batches; :meth:`with_rows` the same probe over draws of
    ``rows`` rows (the late reading past the format): a :class:`~leadline.lookahead.pieces.ResizableSource`."""

    def __init__(self, model: Any, task: Task, params: list[Any]) -> None:
        super().__init__(model, task.micro_batch_of, params, task.probe_rows)
        self._task, self._given_params = task, params

    def with_rows(self, rows: int) -> _CountedProbe:
        return _CountedProbe(self.model, self._task.draws_of(rows), self._given_params, rows)


def rows_fit_unchecked(model: Any, step: Any, plan: Any, lengths: Any = None,
                       seconds_left: float | None = None) -> Value | None:
    """``rows_fit_without_checkpointing``: derive's ramp run again with gradient checkpointing
    off, up to the plan's ``rows_fit`` (checkpointing on never fits fewer rows), the weights,
    optimizer and RNG put back after. None when the plan's model trains without checkpointing
    or has no ``rows_fit``; a ``constant`` saying why when ``seconds_left`` is shorter than the
    ramp with it on took; 0 rows, measured, when not even one row fits with it off.

    Examples:
        >>> import torch
        >>> from leadline.plan import Plan
        >>> plan = Plan()
        >>> plan.set("rows_fit", Value(6, "measured", "the ramp", seconds=12.0))
        >>> plan.set("seq_len", Value(512, "measured", "the corpus's lengths"))
        >>> model = torch.nn.Linear(4, 2)
        >>> rows_fit_unchecked(model, None, plan) is None  # trained without checkpointing: no second ramp
        True
        >>> model.is_gradient_checkpointing = True  # as a transformers model with it on says
        >>> v = rows_fit_unchecked(model, None, plan, seconds_left=3.0)
        >>> v.value, v.kind, v.source
        (None, 'constant', 'not measured: 3 s were left of max_seconds, the ramp with checkpointing on took 12 s')
    """
    if not precision_of(model).checkpointing or "rows_fit" not in plan or "seq_len" not in plan:
        return None
    on = plan["rows_fit"]
    if seconds_left is not None and seconds_left < on.seconds:
        return Value(None, "constant", f"not measured: {seconds_left:.3g} s were left of max_seconds, the ramp with "
                                       f"checkpointing on took {on.seconds:.3g} s", unit="rows")
    from leadline.lookahead.derive.no_trace import leave_no_trace
    from leadline.lookahead.memory import ramp
    from leadline.lookahead.memory.ramp import WontFit
    from leadline.memory import forbid_spill

    params = [p for p in model.parameters() if p.requires_grad]
    optimizers = [o for o in (optimizer_of(step),) if o is not None]
    try:
        with leave_no_trace(params, optimizers), forbid_spill(step.device), checkpointing(model, False):
            res = ramp(step, int(plan.get("seq_len")), lengths=lengths, max_rows=int(on.value))
    except WontFit as e:  # checkpointing is what lets the run fit at all: a measurement, not a failure
        evidence = e.result.evidence() if e.result is not None else {}
        return Value(0, "measured", f"gradient checkpointing off: {e} (the run trains with it on: {on.value} rows "
                                    "fit)", {**evidence, "rows_fit_with_checkpointing": on.value},
                     float(getattr(e.result, "seconds", 0.0) or 0.0), "rows")
    return Value(res.micro_batch, "measured",
                 f"gradient checkpointing off (the run trains with it on: {on.value} rows fit): {res.source()}",
                 {**res.evidence(), "rows_fit_with_checkpointing": on.value}, res.seconds, "rows")


def measured_after(plan: Plan, p: ModelPieces, *, sizes: bool, fit_rank: bool, max_seconds: float | None,
                    started: float) -> None:
    """What is measured on the plan after derive(): the rows that fit without checkpointing, the
    adapter's dtype note, and the LoRA rank that fits (``fit_rank``)."""
    import time

    if sizes and p.world.size == 1:  # every rank would ramp its own card
        left = None if max_seconds is None else max_seconds - (time.monotonic() - started)
        unchecked = rows_fit_unchecked(p.inner, p.step_fn, plan, lengths=p.lengths, seconds_left=left)
        if unchecked is not None:
            plan.set("rows_fit_without_checkpointing", unchecked)
    note = adapter_dtype_note(p.inner)
    if note is not None:
        plan.notes.append(note)
    if fit_rank and p.world.size > 1:
        plan.notes.append("fit_rank: not measured under torchrun (every rank would measure its own card); run "
                          "`leadline fit` on one card")
    elif fit_rank:
        from leadline.lookahead.fit_rank import fit_rank_values

        left = None if max_seconds is None else max_seconds - (time.monotonic() - started)
        for name, value in fit_rank_values(plan, p.model, seconds_left=left).items():
            plan.set(name, value)


def adapter_dtype_note(model: torch.nn.Module) -> str | None:
    """A plan note when the model's LoRA adapters are float32 on a 16-bit model, else None.

    Examples:
        >>> import torch
        >>> model = torch.nn.Module()  # a bfloat16 base layer and a float32 adapter beside it
        >>> model.base = torch.nn.Linear(4, 4).to(torch.bfloat16)
        >>> model.lora_A = torch.nn.Linear(4, 2)
        >>> print(adapter_dtype_note(model))
        the LoRA adapters are float32 on a bfloat16 model (PEFT's autocast_adapter_dtype=True): ...
        >>> adapter_dtype_note(torch.nn.Linear(4, 2)) is None
        True
    """
    from leadline.memory.model_step import adapter_dtype_gap

    gap = adapter_dtype_gap(model)
    if gap is None:
        return None
    name = str(gap[1]).replace("torch.", "")
    return (f"the LoRA adapters are float32 on a {name} model (PEFT's autocast_adapter_dtype=True): each adapted layer "
            f"keeps a float32 copy of its input for the backward, and the micro-batch was measured so. In {name} they "
            f"keep less: on SmolLM2-135M, r16 saved 1.40x a full fine-tune's activations in float32 and 0.93x in "
            f"bfloat16 (benchmarks/lora_adapter_dtype_cpu.py); `leadline fit` measures both on your card")
