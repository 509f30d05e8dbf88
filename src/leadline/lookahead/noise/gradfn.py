"""The probe's ``grad_fn`` for a model: the gradient of the mean loss over one micro-batch's
scored tokens, the model's ``.grad`` and weights left as they were (:class:`ModelGradFn`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.lookahead.pieces import CountedSource

if TYPE_CHECKING:
    import torch

_BATCH_KEYS = ("input_ids", "attention_mask", "labels")


def batch_inputs(mb: Any, i: int) -> tuple[dict[str, Any], int | None]:
    """Model kwargs and the host-side scored-token count (None when not given).

    ``mb`` is a dict of model inputs (its ``scored_tokens`` popped) or an object with
    ``input_ids`` and ``labels`` attributes; ``i`` names the micro-batch in the error.

    Examples:
        >>> batch_inputs({"input_ids": [[5, 6]], "labels": [[5, 6]], "scored_tokens": 1}, 0)
        ({'input_ids': [[5, 6]], 'labels': [[5, 6]]}, 1)
        >>> batch_inputs([5, 6], 3)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: micro_batch_of(3) returned list; return a dict of model inputs ...
    """
    if isinstance(mb, Mapping):
        kwargs = dict(mb)
        scored = kwargs.pop("scored_tokens", None)
    elif all(hasattr(mb, k) for k in ("input_ids", "labels")):
        kwargs = {k: getattr(mb, k) for k in _BATCH_KEYS if getattr(mb, k, None) is not None}
        scored = getattr(mb, "scored_tokens", None)
    else:
        raise InputError(
            f"micro_batch_of({i}) returned {type(mb).__name__}; return a dict of model inputs "
            "(input_ids, attention_mask, labels) or an object with those attributes and scored_tokens"
        )
    if scored is not None and hasattr(scored, "item"):
        scored = int(scored.item())
    return kwargs, scored


class ModelGradFn:
    """``grad_fn`` for :func:`measure_noise_scale` from a model and its micro-batches.

    Args:
        model: a torch module; ``model(**batch).loss`` is the mean loss over the batch's
            scored tokens (Hugging Face causal LMs with ``labels``), unless ``row_losses``.
        micro_batch_of: ``micro_batch_of(i)`` returns micro-batch i as a dict of model inputs
            (``input_ids``, ``attention_mask``, ``labels`` as CPU tensors, optionally
            ``scored_tokens``) or an object with those attributes (e.g. the corpus's
            ``MicroBatch``); None or IndexError when the data runs out. Without
            ``scored_tokens`` they are counted on the host as (labels[..., 1:] != -100).sum()
            before the batch moves to the device.
        params: the trained tensors (default: every parameter with ``requires_grad``).
        row_losses: optional ``row_losses(model, batch) -> Tensor[rows]``, each row's loss
            SUMMED over its scored tokens; the gradient is then of their sum / scored tokens.

    ``grad_fn(i)`` returns ``(gradients, scored_tokens)`` — one tensor per trained param, in
    the param's dtype — or None when the data ran out; a micro-batch that scores nothing
    returns ``([], 0)`` without running the model. The gradients come from
    ``torch.autograd.grad``, so the params' ``.grad`` (None, zero or a half-accumulated step)
    and the weights are as they were; under re-entrant gradient checkpointing, which
    autograd.grad cannot run through, ``.grad`` is set aside, backward run, and put back.

    Examples:
        A one-row "model" whose row loss is x·w summed over its 2 scored tokens (labels 5 and 7):

        >>> import torch
        >>> model = torch.nn.Linear(2, 1, bias=False)
        >>> _ = torch.nn.init.ones_(model.weight)
        >>> rows = [{"x": torch.tensor([[1.0, 2.0]]), "labels": torch.tensor([[-100, 5, 7]])},
        ...         {"x": torch.tensor([[1.0, 2.0]]), "labels": torch.tensor([[-100, -100, -100]])}]
        >>> summed = lambda model, batch: model(batch["x"]).sum(dim=1)      # each row's loss, summed
        >>> grad_fn = ModelGradFn(model, lambda i: rows[i], row_losses=summed)
        >>> grads, scored = grad_fn(0)
        >>> grads[0].tolist(), scored            # d(x·w / 2)/dw = x / 2
        ([[0.5, 1.0]], 2)
        >>> print(model.weight.grad)             # .grad left as it was
        None
        >>> grad_fn(1), grad_fn(2)               # scores nothing: no forward; IndexError: the data ran out
        (([], 0), None)
    """

    def __init__(
        self,
        model: Any,
        micro_batch_of: Callable[[int], Any],
        params: Iterable[torch.Tensor] | None = None,
        row_losses: Callable[[Any, dict[str, Any]], torch.Tensor] | None = None,
    ) -> None:
        if not callable(micro_batch_of):
            raise InputError("ModelGradFn(micro_batch_of=...) must be callable i -> micro-batch, got "
                             f"{type(micro_batch_of).__name__}")
        self.model = model
        self.micro_batch_of = micro_batch_of
        self.params = [p for p in (params if params is not None else model.parameters()) if p.requires_grad]
        if not self.params:
            raise InputError("ModelGradFn found no trained tensors (none with requires_grad); pass params= or unfreeze "
                             "the adapter")
        self.row_losses = row_losses
        self.via_backward = False

    def __call__(self, i: int) -> tuple[list[torch.Tensor], int] | None:
        import torch

        try:
            mb = self.micro_batch_of(i)
        except IndexError:
            return None
        if mb is None:
            return None
        kwargs, scored = batch_inputs(mb, i)
        if scored is None:
            labels = kwargs.get("labels")
            if labels is None:
                raise InputError(f"micro-batch {i} has neither labels nor scored_tokens; pass labels (-100 where not "
                                 "scored) or scored_tokens")
            scored = int((labels[..., 1:] != -100).sum())
        if scored == 0:
            return [], 0
        device = self.params[0].device
        batch = {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}

        def mean_loss() -> torch.Tensor:
            with torch.enable_grad():
                if self.row_losses is not None:
                    loss = self.row_losses(self.model, batch).sum() / scored
                else:
                    loss = self.model(**batch).loss
            if loss is None:
                raise InputError(f"the model returned no loss for micro-batch {i}; pass labels in the batch or "
                                 "row_losses=")
            if not bool(torch.isfinite(loss.detach())):
                raise InputError(f"the loss of micro-batch {i} is {float(loss.detach())} (noise-scale probe); check "
                                 "these rows and the model's dtype")
            return loss

        return self._grads(mean_loss), scored

    def _grads(self, mean_loss: Callable[[], torch.Tensor]) -> list[torch.Tensor]:
        import torch

        if not self.via_backward:
            loss = mean_loss()
            try:
                got = torch.autograd.grad(loss, self.params, allow_unused=True)
                return [g if g is not None else torch.zeros_like(p) for g, p in zip(got, self.params)]
            except RuntimeError as e:
                if "checkpoint" not in str(e).lower():
                    raise
                self.via_backward = True  # and run the forward again: the failed call freed the graph
        # re-entrant checkpointing: set every .grad aside, backward, take ours, put them back
        trained = [p for p in self.model.parameters() if p.requires_grad]
        seen = {id(p) for p in trained}
        trained += [p for p in self.params if id(p) not in seen]
        saved = [p.grad for p in trained]
        try:
            for p in trained:
                p.grad = None
            with torch.enable_grad():
                mean_loss().backward()
            return [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        finally:
            for p, g in zip(trained, saved):
                p.grad = g


class AccumulatedDraws:
    """A gradient source whose draw i is ``parts`` draws of ``source`` together: the gradient of
    the mean loss over their scored tokens, sum_k n_k g_k / sum_k n_k, from draws
    i x parts ... i x parts + parts - 1 — the rows one draw of ``parts`` times as many rows reads
    (``Task.draws_of``), on a card that holds only ``source``'s.

    Args:
        source: a gradient source with ``rows_per_draw`` (``grad_fn(i) -> (gradients, scored)``).
        parts: how many of its draws make one.

    Examples:
        >>> import torch
        >>> src = lambda i: ([torch.tensor([float(i)])], i + 1)
        >>> src.rows_per_draw = 2
        >>> both = AccumulatedDraws(src, 2)
        >>> g, n = both(1)                   # draws 2 and 3: (3 x 2 + 4 x 3) / 7
        >>> round(float(g[0]), 4), n, both.rows_per_draw
        (2.5714, 7, 4)
    """

    def __init__(self, source: Callable[[int], Any], parts: int) -> None:
        if not isinstance(parts, int) or parts < 1:
            raise InputError(f"AccumulatedDraws(parts={parts!r}) needs a whole number of draws >= 1")
        self.source, self.parts = source, parts
        per_draw = source.rows_per_draw if isinstance(source, CountedSource) else 1
        self.rows_per_draw = int(per_draw or 1) * parts

    def __call__(self, i: int) -> tuple[list[Any], int] | None:
        total, acc = 0, None
        for k in range(self.parts):
            got = self.source(i * self.parts + k)
            if got is None:
                return None  # the rows ran out inside the draw, as one draw of all its rows would
            grads, scored = got
            if not scored:
                continue
            weighted = [g.float() * scored for g in grads]
            acc = weighted if acc is None else [a.add_(w) for a, w in zip(acc, weighted)]
            total += scored
            dtypes = [g.dtype for g in grads]
        if acc is None:
            return [], 0
        return [(a / total).to(d) for a, d in zip(acc, dtypes)], total
