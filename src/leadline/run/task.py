"""The task a Hugging Face model trains on: its rows split, tokenized and collated, the loss
of a batch, the train step and the held-out reader (the look-ahead effort's noise probe over its
rows is :func:`leadline.lookahead.model.probe_of`).

:func:`prepare` builds the :class:`Task`; the run (:func:`leadline.run.run_in_one`) prepares one
and trains on it, :func:`leadline.hf.derive_for` prepares one and runs derive() on its pieces.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.run.precision import precision_of

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from leadline.corpus import CorpusProfile, MicroBatch, Split, TokenizedRow
    from leadline.corpus.rows import RowSource

__all__ = ["MAX_HELD_OUT_ROWS", "Task", "loss_resolution", "prepare", "rows_of", "split_sizes", "tokens_to_steps",
           "trained_as_of", "trained_named_weights"]

MAX_HELD_OUT_ROWS = 256
"""The held-out rows derive decides on, at most: every alpha1 evaluation and every look-ahead
comparison reads all of them, so their count bounds the rate phases' time (measured: docs/hf.md)."""


def rows_of(train_dataset: RowSource) -> RowSource:
    """A path stays a path; a ``datasets.Dataset`` or any iterable of dicts becomes a list.

    Examples:
        >>> rows_of("train.jsonl"), rows_of(iter([{"text": "a"}]))
        ('train.jsonl', [{'text': 'a'}])
        >>> try:
        ...     rows_of(3)
        ... except InputError as e:
        ...     print(e)
        train_dataset must be a jsonl path, a datasets.Dataset or a list of rows, got int
    """
    if isinstance(train_dataset, (str, os.PathLike)):
        return train_dataset
    if hasattr(train_dataset, "to_list"):
        return train_dataset.to_list()
    try:
        return list(train_dataset)
    except TypeError:
        raise InputError("train_dataset must be a jsonl path, a datasets.Dataset or a list of rows, got "
                         f"{type(train_dataset).__name__}") from None


def trained_named_weights(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The tensors the run trains (``requires_grad``), by name; one sentence when there are none.

    Examples:
        >>> import torch
        >>> layer = torch.nn.Linear(4, 2)
        >>> [name for name, _ in trained_named_weights(layer)]
        ['weight', 'bias']
        >>> _ = layer.bias.requires_grad_(False)
        >>> [name for name, _ in trained_named_weights(layer)]
        ['weight']
        >>> _ = layer.requires_grad_(False)
        >>> try:
        ...     trained_named_weights(layer)
        ... except InputError as e:
        ...     print(e)
        the model has no trained parameters (requires_grad); wrap it with PEFT or unfreeze the weights you train
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise InputError("the model has no trained parameters (requires_grad); wrap it with PEFT or unfreeze the "
                         "weights you train")
    return named


def trained_as_of(model: torch.nn.Module) -> str:
    """``factors`` for a PEFT adapter model (one with a ``peft_config``), ``weights`` otherwise.

    Examples:
        >>> import torch
        >>> layer = torch.nn.Linear(4, 2)
        >>> trained_as_of(layer)
        'weights'
        >>> layer.peft_config = {"default": None}  # what a peft.PeftModel holds
        >>> trained_as_of(layer)
        'factors'
    """
    return "factors" if hasattr(model, "peft_config") else "weights"


@dataclass
class Task:
    """What derive() needs, built from a model, a tokenizer and tokenized rows.

    ``rows`` are truncated to ``seq_len``; ``split`` holds train / held-out / test indices.
    The probe draws the first training rows in a seeded order (``order``), the rate phases the
    rows after them, so no row decides twice.

    Examples:
        >>> from leadline.corpus import TokenizedRow, split_rows
        >>> rows = [TokenizedRow.from_labels([i, i + 1, i + 2], [i, i + 1, i + 2]) for i in range(10)]
        >>> split = split_rows(10, held_out=1, test=1, seed=0)
        >>> task = Task(model=None, rows=rows, split=split, seq_len=3, pad_id=0, device="cpu",
        ...             order=sorted(split.train))
        >>> task.order  # rows 7 and 8 are the held-out and test rows
        [0, 1, 2, 3, 4, 5, 6, 9]
        >>> task.draws_of(4)(1).input_ids.tolist()  # the second draw of 4 rows: order[4:8]
        [[4, 5, 6], [5, 6, 7], [6, 7, 8], [9, 10, 11]]
        >>> task.draws_of(4)(2) is None  # 8 training rows: a third draw of 4 runs out
        True
    """

    model: torch.nn.Module
    rows: list[TokenizedRow]
    split: Split
    seq_len: int
    pad_id: int
    device: torch.device | str
    probe_rows: int = 2
    optimizer: torch.optim.Optimizer | None = None
    order: list[int] = field(default_factory=list)

    # ---- the pieces derive() takes --------------------------------------------------------
    def batch(self, idx: Sequence[int], pad_to: int | None = None) -> MicroBatch:
        from leadline.corpus import collate

        return collate([self.rows[i] for i in idx], self.pad_id, pad_to=pad_to)

    def loss_of(self, b: int, length: int) -> torch.Tensor:
        """The loss of ``b`` of the longest training rows at ``length`` tokens — cut to it when
        longer (a length of the corpus's mix), padded to it when shorter (the ramp)."""
        from leadline.corpus import collate

        fitting = [i for i in self.split.train if len(self.rows[i].input_ids) <= length]
        if fitting:  # the longest rows that fit, padded to the length (a length of the corpus's mix)
            pick = sorted(fitting, key=lambda i: -len(self.rows[i].input_ids))
            rows = [self.rows[pick[j % len(pick)]] for j in range(b)]
        else:  # shorter than every row: cut the shortest, its scored tail kept where it can be
            short = min(self.split.train, key=lambda i: len(self.rows[i].input_ids))
            rows = [self.rows[short].truncated(length)] * b
        mb = collate(rows, self.pad_id, pad_to=length).to(self.device)
        return self.model(**mb.model_inputs()).loss

    def micro_batch_of(self, i: int) -> MicroBatch | None:
        """The probe's i-th micro-batch of ``probe_rows`` rows, None when the rows run out."""
        return self.draws_of(self.probe_rows)(i)

    def draws_of(self, rows: int) -> Callable[[int], MicroBatch | None]:
        """``micro_batch_of`` for draws of ``rows`` rows: the i-th draw reads rows
        ``order[i*rows : (i+1)*rows]``, None when the rows run out (see :class:`Task`)."""

        def of(i: int) -> MicroBatch | None:
            lo = i * rows
            if lo + rows > len(self.order):
                return None
            return self.batch(self.order[lo:lo + rows])

        return of

    def train_step_of(self, micro_batch: int, grad_accum: int) -> Callable[[int], float]:
        """``train_step(step)``: the forward+backward of step ``step`` — ``grad_accum``
        micro-batches of ``micro_batch`` rows, the same rows for the same step, the loss
        weighted by scored tokens so the step's gradient is the mean over its scored tokens."""
        order = self.order
        per_step = micro_batch * grad_accum

        def train_step(step: int) -> float:
            start = (step * per_step) % max(1, len(order))
            idx = [order[(start + j) % len(order)] for j in range(per_step)]
            micro = [self.batch(idx[k * micro_batch:(k + 1) * micro_batch]) for k in range(grad_accum)]
            total = sum(m.scored_tokens for m in micro) or 1
            loss_sum = 0.0
            for m in micro:
                loss = self.model(**m.to(self.device).model_inputs()).loss
                (loss * (m.scored_tokens / total)).backward()
                loss_sum += float(loss.detach()) * m.scored_tokens
            return loss_sum / total

        return train_step

    def held_out_losses(self) -> Callable[[], list[float]]:
        return self.split.reader(self.model, self.rows, "held_out", device=self.device, pad_id=self.pad_id)


def _scored_rows(model: Any, tokenizer: Any, source: Any, seq_len: int | None, quantile: float | None,
                 fields: dict[str, str] | None) -> tuple[Any, list[Any]]:
    """The corpus profile and the rows tokenized as the loader will, cut to its length, those with
    nothing to score dropped; at least 8 must remain."""
    from leadline.corpus import profile_corpus, tokenize_rows

    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    prof = profile_corpus(source, tokenizer, seq_len=seq_len, quantile=quantile, fields=fields,
                          positions=positions if isinstance(positions, int) else None)
    rows = [r.truncated(prof.seq_len) for r in tokenize_rows(source, tokenizer, fields=fields)]
    rows = [r for r in rows if r.scored_tokens > 0]
    if len(rows) < 8:
        raise InputError(f"the data has {len(rows)} rows with something to score at seq_len {prof.seq_len}; derive "
                         "needs at least 8")
    return prof, rows


def split_sizes(held_out: object) -> dict[str, int | float]:
    """``prepare``'s ``held_out`` and ``test`` for the split a plan records (``plan.held_out``): its
    parts' row counts where it lists them (none held out: every row trains, a comparison's baseline),
    else the defaults (a tenth each).

    Examples:
        >>> split_sizes({"train": [0, 2], "held_out": [1], "test": [], "seed": 3})
        {'held_out': 1, 'test': 0}
        >>> split_sizes({"held_out": [], "test": [], "seed": 0})
        {'held_out': 0, 'test': 0}
        >>> split_sizes({"seed": 0})
        {'held_out': 0.1, 'test': 0.1}
    """
    parts = held_out if isinstance(held_out, dict) else {}
    if isinstance(parts.get("held_out"), list) and isinstance(parts.get("test"), list):
        return {"held_out": len(parts["held_out"]), "test": len(parts["test"])}
    return {"held_out": 0.1, "test": 0.1}


def _with_eval(model: Any, tokenizer: Any, eval_dataset: Any, seq_len: int, fields: dict[str, str] | None,
               rows: list[Any], split: Any, test: int | float) -> tuple[list[Any], Any]:
    """The user's eval rows appended to ``rows`` as the split's test part."""
    from leadline.corpus import tokenize_rows
    from leadline.corpus.splits import Split

    if test:
        raise InputError(f"test={test!r} asks for a test share and eval rows were given too; pass one of them")
    extra = [r.truncated(seq_len) for r in tokenize_rows(rows_of(eval_dataset), tokenizer, fields=fields)]
    extra = [r for r in extra if r.scored_tokens > 0]
    if not extra:
        raise InputError("the eval rows have nothing to score; give rows in the training data's format")
    n = len(rows)
    return rows + extra, Split(train=split.train, held_out=split.held_out, test=list(range(n, n + len(extra))),
                               seed=split.seed)


def prepare(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, train_dataset: RowSource, *,
            seq_len: int | None = None, quantile: float | None = None, held_out: int | float = 0.1,
            test: int | float = 0.1, seed: int = 0, probe_rows: int = 2, fields: dict[str, str] | None = None,
            eval_dataset: RowSource | None = None) -> tuple[Task, CorpusProfile]:
    """Tokenize the rows as the loader will, profile them, split them, and build the
    :class:`Task` derive() runs on. Returns the task and the corpus profile.

    ``eval_dataset``: the user's own rows for the verdict (tokenized the same way, cut to the
    training rows' length); they are the split's ``test`` part, and ``test`` must then be 0.

    Rows with nothing to score are dropped and at least 8 must remain; a ``held_out`` share is
    capped at :data:`MAX_HELD_OUT_ROWS` rows; the training rows are shuffled by ``seed``; the
    task's optimizer is an AdamW over the trained weights.

    Examples:
        >>> import torch
        >>> from tokenizers import Tokenizer, models, pre_tokenizers
        >>> from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
        >>> words = ["<eos>", "<unk>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
        >>> wl = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
        >>> wl.pre_tokenizer = pre_tokenizers.Whitespace()
        >>> tokenizer = PreTrainedTokenizerFast(tokenizer_object=wl, eos_token="<eos>", pad_token="<eos>")
        >>> _ = torch.manual_seed(0)
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32,
        ...                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
        >>> rows = [{"text": "the cat sat on the mat"}, {"text": "a dog ran on the mat"}] * 5
        >>> task, profile = prepare(model, tokenizer, rows)
        >>> task.seq_len, len(task.split.train), len(task.split.held_out), len(task.split.test)
        (7, 8, 1, 1)
        >>> task.rows[0].input_ids  # "the cat sat on the mat" and the EOS
        [2, 3, 4, 5, 2, 6, 0]
        >>> train_step = task.train_step_of(2, 2)  # 2 micro-batches of 2 rows a step
        >>> round(train_step(0), 1)  # the step's mean loss over its scored tokens, near ln(16) untrained
        2.8
        >>> try:
        ...     prepare(model, tokenizer, rows[:3])
        ... except InputError as e:
        ...     print(e)
        the data has 3 rows with something to score at seq_len 7; derive needs at least 8
    """
    import random

    import torch

    from leadline.corpus import split_rows

    prof, rows = _scored_rows(model, tokenizer, rows_of(train_dataset), seq_len, quantile, fields)
    if isinstance(held_out, float):  # a share, capped: each check reads every held-out row
        held_out = min(round(held_out * len(rows)), MAX_HELD_OUT_ROWS)
    split = split_rows(len(rows), held_out=held_out, test=test, seed=seed)
    if eval_dataset is not None:  # the user's rows are the test part
        rows, split = _with_eval(model, tokenizer, eval_dataset, prof.seq_len, fields, rows, split, test)
    order = list(split.train)
    random.Random(seed).shuffle(order)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    task = Task(model=model, rows=rows, split=split, seq_len=prof.seq_len, pad_id=int(pad_id),
                device=next(model.parameters()).device, probe_rows=probe_rows, order=order)
    trained = [p for _, p in trained_named_weights(model)]
    task.optimizer = torch.optim.AdamW(trained, lr=1e-4, weight_decay=0.0)
    return task, prof


def loss_resolution(model: torch.nn.Module) -> float:
    """The grain of the held-out loss: bf16/fp16 forwards (a 4-bit base computing in bf16
    included) round it at ~1e-3 of its size."""
    from leadline.run.precision import BF16_RESOLUTION, RESOLUTION

    return BF16_RESOLUTION if precision_of(model).half else RESOLUTION


def tokens_to_steps(tokens: float, tokens_per_step: float) -> int:
    """The optimizer steps that cover ``tokens`` at ``tokens_per_step``: ceil(tokens / tokens_per_step),
    at least 1.

    Examples:
        >>> tokens_to_steps(1_000_000, 65_536)
        16
        >>> tokens_to_steps(100, 65_536)
        1
    """
    return max(1, math.ceil(tokens / tokens_per_step))
