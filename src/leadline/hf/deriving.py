"""derive_for() and derive_parts(): a plan for a Hugging Face model (PEFT or not, or a built
``Trainer`` / TRL ``SFTTrainer``) and a data set.

What was given is unpacked (a trainer's model, rows, length and loss policy), the torchrun job
joined, the :class:`~leadline.run.task.Task` prepared and derive() run on its pieces; the values
the model and the trainer say go on the plan, and the model is put back as it was.

The race (the default effort) is the core's :func:`~leadline.run.one.run_in_one`. The full effort
(``effort="full"``, and :func:`derive_parts`) runs derive() from the look-ahead annex
(:mod:`leadline.lookahead.model`): this module is the core's door onto it for the library.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.hf.trainer import is_trainer, loss_policy_of, tokenizer_of, trainer_checkpointing, trainer_rows
from leadline.plan import Plan, Value
from leadline.run import RunOptions, race_only
from leadline.run.precision import check_trainable, checkpointing, precision_of
from leadline.run.task import rows_of

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase, Trainer

    from leadline.corpus.rows import RowSource
    from leadline.lookahead.model import ModelPieces

__all__ = ["EFFORTS", "PARTS", "DeriveOptions", "derive_for", "derive_parts"]

PARTS = ("batch", "rate")
"""The phases :func:`derive_parts` can run alone: the batch (noise, memory, step) and the rate."""
EFFORTS = ("race", "full")
"""derive_for's efforts, the default first: ``race`` (schedule-free AdamW, its rate raced on the
run's opening steps, :func:`leadline.run.one.run_in_one`) and ``full`` (derive()'s look-ahead)."""


@dataclass(frozen=True)
class DeriveOptions:
    """What shapes derive()'s phases (``effort="full"``), as :func:`derive_for`'s
    ``options``. The race (the default effort) runs none of these phases: an option set away
    from its default is refused with it, in one sentence naming it.

    Attributes:
        quantile: the length as a quantile of the rows' lengths (instead of ``seq_len``).
        max_seconds: a bound on the whole derive, its set-up included.
        on_progress: called with each phase's progress event.
        resume: the resume file of a derive cut short, to go on from.
        prior: an earlier plan (or its path) whose measurements derive may reuse.
        trained_as: ``"factors"`` or ``"weights"``, where the model's own answer is not the run's.
        held_out / test: the held-out and test rows, a share or a count.
        probe_rows: the rows of one noise-probe draw.
        fit_rank: also the largest LoRA rank whose real step fits (a PEFT LoRA model).
        step_for: ``"rows"`` (the default) or ``"time"``: what the step is chosen for.

    Examples:
        >>> DeriveOptions().changed()
        []
        >>> DeriveOptions(max_seconds=60, held_out=8).changed()
        ['max_seconds', 'held_out']
    """

    quantile: float | None = None
    max_seconds: float | None = None
    on_progress: Callable[[dict[str, Any]], None] | None = None
    resume: str | os.PathLike[str] | None = None
    prior: Plan | str | None = None
    trained_as: str | None = None
    held_out: int | float = 0.1
    test: int | float = 0.1
    probe_rows: int = 2
    fit_rank: bool = False
    step_for: str | None = None

    def changed(self) -> list[str]:
        """The options set away from their defaults, in the order the class lists them."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) != f.default]


def derive_for(model: Trainer | torch.nn.Module, tokenizer: PreTrainedTokenizerBase | None = None,
               train_dataset: RowSource | None = None, *, total_steps: int | None = None, epochs: float | None = None,
               effort: str = "race", seq_len: int | None = None, seed: int = 0, fields: dict[str, str] | None = None,
               rows_per_step: int | None = None, progress: bool | None = None,
               options: DeriveOptions | None = None) -> Plan:
    """derive() for a Hugging Face causal LM (PEFT or not) and a data set in any corpus
    format: builds the TrainingStep, ModelGradFn, held-out reader and named weights itself.

    ``effort="race"`` (the default, as ``leadline run``'s): schedule-free AdamW, its rate decided
    by the run's opening race alone (:func:`leadline.run.race_only`: the model put back
    bit for bit); ``"full"`` runs derive() and its look-ahead. ``derive_for(trainer)``: a built
    ``Trainer`` or TRL ``SFTTrainer`` in place of the model, derived on the rows it trains on.
    The model is measured as it trains (a bf16 or 4-bit base, an adapter or every weight,
    checkpointing) and left as it was. Under torchrun every rank calls it and gets rank 0's plan.
    ``options``: what shapes derive()'s phases (:class:`DeriveOptions`), refused with the race.
    Every argument, what each effort takes and refuses: ``docs/hf.md``, "derive_for's arguments".

    Examples:
        A whole derive takes seconds even on a tiny model (:func:`derive_parts` shows one that
        runs the rate phases alone); what it refuses, it refuses in one sentence before any work:

        >>> import torch
        >>> try:
        ...     derive_for(torch.nn.Linear(4, 2))
        ... except InputError as e:
        ...     print(e)
        derive_for needs a Trainer/SFTTrainer, or a model, its tokenizer and the train_dataset; got a model alone
        >>> try:
        ...     derive_for(torch.nn.Linear(4, 2), None, [{"text": "a"}], effort="full",
        ...                options=DeriveOptions(fit_rank=True))  # a full fine-tune
        ... except InputError as e:
        ...     print(e)
        fit_rank needs a PEFT model with a LoRA adapter (peft.get_peft_model); for a full fine-tune there is no ...
        >>> try:
        ...     derive_for(torch.nn.Linear(4, 2), None, [{"text": "a"}], options=DeriveOptions(max_seconds=60))
        ... except InputError as e:
        ...     print(e)
        max_seconds shapes derive()'s phases, which effort='race' (the default) does not run; leave it out, or pass ...
    """
    check_effort(effort)
    asked = _Asked(total_steps=total_steps, epochs=epochs, effort=effort, seq_len=seq_len, seed=seed, fields=fields,
                   rows_per_step=rows_per_step, progress=progress, options=options)
    if effort == "race":
        return _race_for(model, tokenizer, train_dataset, asked)
    return _derive(model, tokenizer, train_dataset, asked)


@dataclass(frozen=True)
class _Asked:
    """derive_for's keywords (:func:`derive_parts`'s ``kw``), read by the race and by the full effort."""

    total_steps: int | None = None
    epochs: float | None = None
    effort: str = "full"
    seq_len: int | None = None
    seed: int = 0
    fields: dict[str, str] | None = None
    rows_per_step: int | None = None
    progress: bool | None = None
    options: DeriveOptions | None = None


def check_effort(effort: object) -> None:
    """``effort`` refused in one sentence unless one of :data:`EFFORTS` (the removed ``quick`` named as such).

    Examples:
        >>> check_effort("quick")
        Traceback (most recent call last):
            ...
        leadline.errors.InputError: effort='quick' was removed: pass effort='race' (the default) or 'full'
    """
    if effort == "quick":
        raise InputError("effort='quick' was removed: pass effort='race' (the default) or 'full'")
    if effort not in EFFORTS:
        raise InputError(f"effort={effort!r} is not one of {', '.join(EFFORTS)}; race races schedule-free AdamW's "
                         "rate on the run's opening steps, full runs the look-ahead")


def derive_parts(model: Trainer | torch.nn.Module, tokenizer: PreTrainedTokenizerBase | None = None,
                 train_dataset: RowSource | None = None, *, measure: Sequence[str] = PARTS,
                 batch: tuple[int, int] | None = None, **kw: Any) -> Plan:
    """:func:`derive_for` running only the phases of ``measure``: ``"batch"`` (the noise
    scale, the memory ramp and the step: ``rows_fit``, ``micro_batch``, ``grad_accum``) and
    ``"rate"`` (alpha1 and the rate). ``batch=(micro_batch, grad_accum)`` runs the rate phases
    at that step, given, instead of the one the batch phases decide (the batch a trainer's
    arguments already hold). ``kw``: :func:`derive_for`'s keywords, ``options`` included. The
    one-liners of :mod:`leadline.hf.find` are these calls.

    Examples:
        The rate phases alone at a given batch, on a tiny Llama and 20 rows (about a second on
        a CPU core), the model left as it was:

        >>> import torch
        >>> from tokenizers import Tokenizer, models, pre_tokenizers
        >>> from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
        >>> words = ["<eos>", "<unk>", "the", "a", "cat", "dog", "sat", "on", "mat"]
        >>> wl = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
        >>> wl.pre_tokenizer = pre_tokenizers.Whitespace()
        >>> tokenizer = PreTrainedTokenizerFast(tokenizer_object=wl, eos_token="<eos>", pad_token="<eos>")
        >>> _ = torch.manual_seed(0)
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32,
        ...                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
        >>> rows = [{"text": f"{a} {b} sat on {c} mat"} for a in ("the", "a") for b in ("cat", "dog")
        ...         for c in ("the", "a", "cat", "dog", "mat")]
        >>> before = [p.detach().clone() for p in model.parameters()]
        >>> plan = derive_parts(model, tokenizer, rows, measure=("rate",), batch=(2, 1), progress=False)
        >>> plan["alpha1"].kind, plan["micro_batch"].kind, plan.micro_batch, plan.grad_accum
        ('measured', 'given', 2, 1)
        >>> "noise_scale_tokens" in plan  # no batch phase ran
        False
        >>> plan.held_out["held_out"], plan.held_out["test"]  # row indices, split by seed=0
        ([14, 16], [10, 18])
        >>> all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        True
        >>> try:
        ...     derive_parts(model, tokenizer, rows, measure=("noise",))
        ... except InputError as e:
        ...     print(e)
        measure=('noise',) must name some of batch, rate
    """
    check_effort(kw.get("effort", "full"))
    if kw.get("effort") == "race":
        raise InputError("derive_parts runs derive()'s phases, and effort='race' has none apart from its race; call "
                         "derive_for(..., effort='race') or find_lr(..., effort='race')")
    unknown = sorted(set(measure) - set(PARTS))
    if unknown or not measure:
        raise InputError(f"measure={tuple(measure)!r} must name some of {', '.join(PARTS)}")
    return _derive(model, tokenizer, train_dataset, _Asked(**kw), measure=tuple(measure), batch=batch)


def _derive(model: Any, tokenizer: Any, train_dataset: Any, asked: _Asked, *, measure: tuple[str, ...] = PARTS,
            batch: tuple[int, int] | None = None) -> Plan:
    import time

    from leadline.lookahead.model import derive_on, join_the_job, measured_after, model_pieces  # the annex

    started = time.monotonic()  # max_seconds bounds the set-up below too, not only derive's phases
    o = _options(asked.options)
    if batch is not None and asked.rows_per_step is not None:
        raise InputError("pass batch=(micro_batch, grad_accum) or rows_per_step, not both: each fixes the step")
    given = _given(model, tokenizer, train_dataset, asked.total_steps, asked.epochs, o.fit_rank)
    p = model_pieces(given.model, given.tokenizer, given.train_dataset, seq_len=asked.seq_len, quantile=o.quantile,
                     held_out=o.held_out, test=o.test, seed=asked.seed, probe_rows=o.probe_rows, fields=asked.fields,
                     trained_as=o.trained_as, batch=batch)
    bar, on_progress = _bar(asked.progress, o.on_progress)
    scoped = ExitStack()
    try:
        if given.checkpointed is not None:
            scoped.enter_context(checkpointing(p.inner, *given.checkpointed))
        join_the_job(p, batch)
        sizes = "batch" in measure  # the noise, the ramp and the step run when they are given their pieces
        plan = derive_on(p, given.train_dataset, given.tokenizer, measure=measure, effort=asked.effort,
                         total_steps=given.total_steps, epochs=given.epochs, rows_per_step=asked.rows_per_step,
                         step_for=o.step_for, max_seconds=o.max_seconds, started=started, on_progress=on_progress,
                         resume=o.resume, prior=o.prior)
        _given_values(plan, p, batch, given.policy)
        if o.trained_as is None and full_fine_tune(p.kind, p.model_info):
            plan.notes.append(FULL_NOTE)
        measured_after(plan, p, sizes=sizes, fit_rank=o.fit_rank, max_seconds=o.max_seconds, started=started)
    finally:
        if bar is not None:
            bar.close()
        scoped.close()
        if p.job is not None:
            p.job.close()
        p.model.train(p.was_training)
        p.model.zero_grad(set_to_none=True)
    if p.job is not None:
        plan.notes.extend(p.job.notes)
    return plan


def _race_for(model: Any, tokenizer: Any, train_dataset: Any, asked: _Asked) -> Plan:
    """derive_for's race: :func:`~leadline.run.race_only` on what was given (a trainer unpacked,
    measured with its gradient checkpointing), the model left as it was; the plan gets the values
    the model and the trainer say (precision, loss policy or the rows' formats, the full
    fine-tune's note)."""
    from leadline.torchrun import launched_by_torchrun

    _refuse_for_race(_options(asked.options), asked.progress, asked.rows_per_step)
    if launched_by_torchrun():
        raise InputError("effort='race' races in one process, and this is one of several under torchrun; pass "
                         "effort='full' (docs/distributed.md), or derive outside torchrun")
    given = _given(model, tokenizer, train_dataset, asked.total_steps, asked.epochs, False)
    check_trainable(given.model)
    with ExitStack() as scoped:
        if given.checkpointed is not None:
            scoped.enter_context(checkpointing(given.model, *given.checkpointed))
        plan = race_only(given.model, given.tokenizer, given.train_dataset, RunOptions(
            total_steps=given.total_steps, epochs=given.epochs, rows_per_step=asked.rows_per_step, seed=asked.seed,
            seq_len=asked.seq_len, fields=asked.fields))
        plan.set("precision", precision_of(given.model).as_value())  # checkpointing on, as the run has it
    if given.policy is not None:
        from leadline.corpus.tokenize import count_scored
        from leadline.hf.trainer import policy_value

        rows = given.train_dataset
        plan.set("loss_policy", policy_value(given.policy, sum(count_scored(r["labels"]) for r in rows), len(rows)))
    else:
        plan.set("rows", _rows_read(given.train_dataset, asked.fields))
    parameters = sum(p.numel() for p in given.model.parameters())
    if full_fine_tune(plan.model["trained_as"], {**plan.model, "parameters": parameters}):
        plan.notes.append(FULL_NOTE)
    return plan


def _options(options: DeriveOptions | None) -> DeriveOptions:
    """``options`` as given, the defaults where none is; anything else is refused in one sentence."""
    if options is None:
        return DeriveOptions()
    if not isinstance(options, DeriveOptions):
        raise InputError(f"options must be a DeriveOptions (from leadline.hf import DeriveOptions), got "
                         f"{type(options).__name__}")
    return options


def _refuse_for_race(options: DeriveOptions, progress: bool | None, rows_per_step: int | None) -> None:
    """One sentence naming the options given that the race does not take."""
    given = options.changed()
    if progress:
        given.append("progress")
    if given:
        them = ", ".join(given)
        verb, it = ("shape", "them") if len(given) > 1 else ("shapes", "it")
        raise InputError(f"{them} {verb} derive()'s phases, which effort='race' (the default) does not run; leave "
                         f"{it} out, or pass effort='full'")
    if rows_per_step is not None and (isinstance(rows_per_step, bool) or not isinstance(rows_per_step, int)
                                      or rows_per_step < 1):
        raise InputError(f"rows_per_step={rows_per_step!r} must be a whole number of rows, at least 1")


def _rows_read(data: Any, fields: dict[str, str] | None) -> Value:
    """``rows``: the usable rows of the data and their formats (what ``sft_fields`` reads the
    loss policy from), as derive's corpus profile records them."""
    from leadline.corpus.rows import RowReader

    reader = RowReader(rows_of(data), fields=fields)
    for _ in reader:
        pass
    return Value(reader.rows, "measured", f"rows read from {reader.source}",
                 {"formats": dict(reader.formats), "ignored_fields": dict(reader.ignored), "sha256": reader.sha256})


FULL_NOTE = ("trained_as weights: the model has no adapter, so every weight trains (a full fine-tune, as --full "
             "asks); a LoRA plan needs the adapter on the model first (the CLI without --full, or "
             "peft.get_peft_model in Python)")
"""The plan's note for a model given without an adapter, every weight trainable."""


def full_fine_tune(kind: str, model_info: dict[str, Any]) -> bool:
    """The model trains as a full fine-tune: no adapter (``trained_as`` ``weights``) and every
    parameter trainable.

    Examples:
        >>> full_fine_tune("weights", {"parameters": 10, "trained_parameters": 10})
        True
        >>> full_fine_tune("weights", {"parameters": 10, "trained_parameters": 2})  # a head alone
        False
        >>> full_fine_tune("factors", {"parameters": 10, "trained_parameters": 2})  # LoRA
        False
    """
    return kind == "weights" and model_info.get("parameters") == model_info.get("trained_parameters")


@dataclass
class _Given:
    """What derive_for was given, a trainer unpacked: the model, its tokenizer and rows, the
    run's length, the trainer's loss policy and its gradient checkpointing."""

    model: Any
    tokenizer: Any
    train_dataset: Any
    total_steps: int | None
    epochs: float | None
    policy: dict[str, Any] | None = None
    # a trainer's run turns checkpointing on in train(): measure with it on
    checkpointed: tuple[bool, Any] | None = None


def _given(model: Any, tokenizer: Any, train_dataset: Any, total_steps: int | None, epochs: float | None,
           fit_rank: bool) -> _Given:
    """The model, rows and length derive_for measures: a trainer's own where a trainer is given;
    one epoch where no length is."""
    given = _Given(model, tokenizer, train_dataset, total_steps, epochs)
    if is_trainer(model):
        trainer = model
        given.model = trainer.model
        given.checkpointed = trainer_checkpointing(trainer)
        given.tokenizer = tokenizer if tokenizer is not None else tokenizer_of(trainer)
        given.policy = loss_policy_of(trainer)
        given.train_dataset = trainer_rows(trainer)
        if total_steps is None and epochs is None:
            if int(getattr(trainer.args, "max_steps", -1) or -1) > 0:
                given.total_steps = int(trainer.args.max_steps)
            else:
                given.epochs = float(trainer.args.num_train_epochs)
    elif train_dataset is None:
        raise InputError("derive_for needs a Trainer/SFTTrainer, or a model, its tokenizer and the train_dataset; got "
                         "a model alone")
    if fit_rank:
        from leadline.lookahead.fit_rank import lora_config_of

        m = given.model
        lora_config_of(m.module if hasattr(m, "module") else m)  # a full fine-tune is refused before anything runs
    if given.total_steps is None and given.epochs is None:
        given.epochs = 1.0
    return given


def _bar(progress: bool | None, on_progress: Callable[[dict[str, Any]], None] | None
         ) -> tuple[Any, Callable[[dict[str, Any]], None] | None]:
    """The bar over the phases on stderr, where one is asked for or stderr is a terminal; and
    the progress callback that feeds it."""
    import sys

    from leadline.lookahead.progress import PhaseBar
    from leadline.progress import wants_bar

    bar = None
    if progress or (progress is None and on_progress is None and wants_bar(sys.stderr)):
        bar = PhaseBar()
        on_progress = bar if on_progress is None else _both(bar, on_progress)
    return bar, on_progress


def _given_values(plan: Plan, p: ModelPieces, batch: tuple[int, int] | None, policy: dict[str, Any] | None) -> None:
    """The plan's values the model and the trainer say: the precision, the batch given, the loss policy."""
    plan.set("precision", precision_of(p.inner).as_value())
    if batch is not None:
        for name, v in zip(("micro_batch", "grad_accum"), batch):
            plan.set(name, Value(int(v), "given", f"the trainer's {name.replace('_', ' ')}, given: the rate "
                                                  "phases ran their steps at it", unit="rows" if
                                 name == "micro_batch" else "micro-batches"))
    if policy is not None:
        from leadline.hf.trainer import policy_value

        plan.set("loss_policy", policy_value(policy, sum(r.scored_tokens for r in p.task.rows), len(p.task.rows)))


def _both(*fns: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def call(ev: dict[str, Any]) -> None:
        for fn in fns:
            fn(ev)

    return call
