"""The LoRA rank the memory holds at the plan's shape, for a PEFT model
(``derive_for(..., options=DeriveOptions(fit_rank=True))``, ``leadline derive --fit-rank``).

The rank is what the memory holds. After derive() has the plan's micro-batch and
length, :func:`rank_fit_for` bisects over LoRA ranks with :func:`~leadline.memory.rank.rank_to_fit`:
each rank is a probe adapter added beside the model's own (same target modules and options, rank
r), made the active one, measured by a real training step of micro_batch x seq_len
(:func:`~leadline.memory.fit.measure_fit`), then deleted. The model's own adapter is never
touched: its weights, its place as the active adapter and every ``requires_grad`` flag are put
back on every exit path. Its weights stay on the card during the measurement, so the rank found
is what fits beside them (a little conservative for a run that trains the probe's rank alone).
"""

from __future__ import annotations

import copy
import math
from typing import Any

from leadline.errors import InputError
from leadline.plan import Plan, Value

PROBE = "leadline_rank_probe"
RANKS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TRIES = math.ceil(math.log2(len(RANKS) + 1))  # bisection over RANKS
STEPS_A_TRY = 2.5  # measure_fit's two steps in a row, and the set-up around them, in step times


def lora_config_of(model: Any) -> Any:
    """The active LoRA adapter's config of a PEFT model; an InputError naming the fix otherwise.

    Examples:
        >>> from types import SimpleNamespace
        >>> peft_model = SimpleNamespace(active_adapter="default",  # what a peft.PeftModel holds
        ...                              peft_config={"default": SimpleNamespace(r=16, lora_alpha=32)})
        >>> lora_config_of(peft_model).r
        16
        >>> try:
        ...     lora_config_of(SimpleNamespace())  # a full fine-tune
        ... except InputError as e:
        ...     print(e)
        fit_rank needs a PEFT model with a LoRA adapter (peft.get_peft_model); for a full fine-tune there is no ...
    """
    configs = getattr(model, "peft_config", None)
    active = getattr(model, "active_adapter", None)
    if not isinstance(configs, dict) or active not in configs:
        raise InputError("fit_rank needs a PEFT model with a LoRA adapter (peft.get_peft_model); "
                         "for a full fine-tune there is no rank to fit: leave fit_rank off")
    cfg = configs[active]
    if not hasattr(cfg, "r"):
        raise InputError(f"fit_rank needs a LoRA adapter; the active adapter {active!r} is a {type(cfg).__name__}")
    return cfg


def rank_fit_for(model: Any, rows: int, length: int, *, ranks: tuple[int, ...] = RANKS,
                 card_bytes: int | None = None) -> Any:
    """:class:`~leadline.memory.rank.RankFit`: the largest rank in ``ranks`` whose real training
    step of ``rows`` x ``length`` fits, each measured on a probe adapter beside the model's own.

    The search bisects ``ranks`` (at most :data:`TRIES` real steps for :data:`RANKS`); the probe's
    adapter draws from a forked RNG, and the model's own adapter, ``requires_grad`` flags and
    train/eval mode are put back on every exit. A model without a LoRA adapter is refused before
    anything runs (the example below; a real search measures training steps on the card).

    Examples:
        >>> from types import SimpleNamespace
        >>> try:
        ...     rank_fit_for(SimpleNamespace(), rows=4, length=512)  # a model without an adapter
        ... except InputError as e:
        ...     print(e)
        fit_rank needs a PEFT model with a LoRA adapter (peft.get_peft_model); for a full fine-tune there is no ...
    """
    from leadline.memory.model_step import ModelStep
    from leadline.memory.rank import rank_to_fit

    base_cfg = lora_config_of(model)
    own = model.active_adapter
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    was_training = model.training

    def put_back() -> None:
        if PROBE in model.peft_config:
            model.set_adapter(own)
            model.delete_adapter(PROBE)
        for n, p in model.named_parameters():
            if n in flags:
                p.requires_grad_(flags[n])

    def step_at_rank(r: int) -> Any:
        cfg = copy.deepcopy(base_cfg)
        cfg.r = int(r)
        cfg.lora_alpha = 2 * int(r)  # the scale does not change the memory
        try:
            model.add_adapter(PROBE, cfg)
            model.set_adapter(PROBE)  # the probe alone is trained
            return ModelStep(model, on_close=put_back)
        except BaseException:
            put_back()
            raise

    import torch

    device = next(model.parameters()).device
    try:  # a probe adapter's init draws from torch's generator: the caller's draws are put back
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            return rank_to_fit(step_at_rank, rows, length, ranks=ranks, card_bytes=card_bytes)
    finally:
        put_back()
        model.train(was_training)  # ModelStep put it in training mode


def fit_rank_values(plan: Plan, model: Any, *, seconds_left: float | None = None,
                    card_bytes: int | None = None) -> dict[str, Value]:
    """The plan's ``lora_rank_fit`` at its micro-batch and length, or a note why not (returned
    as ``{}`` with the note added to ``plan.notes``): the plan has no micro-batch and length,
    or the bisection's real steps, TRIES x STEPS_A_TRY x (t_micro + t_step), would not fit in
    ``seconds_left``.

    Examples:
        >>> from types import SimpleNamespace
        >>> peft_model = SimpleNamespace(active_adapter="default", peft_config={"default": SimpleNamespace(r=16)})
        >>> plan = Plan()
        >>> fit_rank_values(plan, peft_model), plan.notes
        ({}, ['fit_rank: not measured, the plan has no micro_batch and seq_len to measure it at'])
        >>> for name, number in [("micro_batch", 4), ("seq_len", 512), ("t_micro_seconds", 0.5),
        ...                      ("t_step_seconds", 2.0)]:
        ...     plan.set(name, Value(number, "measured", "derive"))
        >>> fit_rank_values(plan, peft_model, seconds_left=10.0)  # 4 x 2.5 x (0.5 + 2.0) = 25 s needed
        {}
        >>> print(plan.notes[-1])
        fit_rank: not measured, about 25 s of real steps (4 ranks by bisection) against 10 s left of max_seconds; ...
    """
    mb, seq = plan.get("micro_batch"), plan.get("seq_len")
    if not isinstance(mb, int) or not isinstance(seq, int):
        plan.notes.append("fit_rank: not measured, the plan has no micro_batch and seq_len to measure it at")
        return {}
    t = [plan.get("t_micro_seconds"), plan.get("t_step_seconds")]
    if seconds_left is not None and all(isinstance(x, (int, float)) for x in t):
        need = TRIES * STEPS_A_TRY * (float(t[0]) + float(t[1]))
        if need > seconds_left:
            plan.notes.append(f"fit_rank: not measured, about {need:.0f} s of real steps ({TRIES} ranks by bisection) "
                              f"against {max(0.0, seconds_left):.0f} s left of max_seconds; raise max_seconds or run "
                              "`leadline fit`")
            return {}
    own = int(lora_config_of(model).r)
    found = rank_fit_for(model, mb, seq, card_bytes=card_bytes)
    v = found.as_values()["lora_rank"]
    trains = ("" if found.rank != max(RANKS) else f" (the largest rank tried: the memory holds at least {found.rank})")
    trains += f"; the plan trains rank {own}" + ("" if found.rank is None or found.rank >= own else
                                                  f", above what fits: train at rank {found.rank} or fewer rows")
    return {"lora_rank_fit": Value(found.rank, v.kind, v.source + trains, v.evidence, v.seconds)}
