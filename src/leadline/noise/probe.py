"""The noise-scale probe: draw micro-batch gradients until B_noise is seen, then stop.

:func:`measure_noise_scale` feeds :mod:`leadline.noise.estimator` (McCandlish et al., 2018,
B_noise = tr(Σ)/|G|², with unequal scored tokens per micro-batch) from ``grad_fn(i)`` and
stops at the first of:

- ``settled``: |G|² and S above zero by one standard error, **and** the tokens drawn
  (the largest batch: all draws together) cover B_noise at the upper edge of its error,
  T >= B_noise + SE — at the earliest after ``MIN_DRAWS`` draws;
- ``k``: the fixed number of draws asked for;
- ``max_k``: the most draws allowed (default ``DEFAULT_MAX_K``);
- ``data``: ``grad_fn`` had no more micro-batches;
- ``tokens``: ``max_tokens`` scored tokens drawn;
- ``time``: the next draw, at the mean draw time so far, would pass ``budget_s``.

:class:`ModelGradFn` is the ``grad_fn`` for a model: the gradient of the mean loss over one
micro-batch's scored tokens, the model's ``.grad`` and weights left as they were.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.noise._stream import MeanStream, as_tensor_list
from leadline.noise.estimator import Draw, NoiseEstimate, NoiseSums
from leadline.plan import Value

if TYPE_CHECKING:
    import torch

MIN_DRAWS = 8
"""The fewest draws before ``settled`` may stop the probe: with fewer, the standard error
itself rests on one or two innovations and can be small by chance."""

DEFAULT_MAX_K = 1024
"""The most draws when neither ``k`` nor ``max_k`` is given, so an unresolvable source
(no signal at all) cannot keep the probe running for ever."""

METHOD = (
    "McCandlish et al. (2018) B_noise = tr(Σ)/|G|², micro-batches token-weighted (E|g_j|² = |G|² + S/t_j), "
    "standard error by the delta method on the Helmert innovations"
)

_clock: Callable[[], float] = time.perf_counter  # tests replace it


@dataclass
class NoiseScale:
    """What the probe measured.

    Attributes:
        b_noise_tokens: B_noise in scored tokens (a bound under ``lower_bound``/``upper_bound``;
            None when nothing resolved).
        se_tokens: its standard error (None when unresolved).
        confirmed_tokens: min(B_noise, the tokens the probe reached): what a rate may lean on.
        k: micro-batches drawn (skipped ones not counted).
        micro_tokens: the scored tokens of each draw, in order.
        resolved: |G|² and S both above zero by one standard error.
        settled: resolved, and the tokens drawn cover B_noise + SE.
        lower_bound / upper_bound: |G|² (resp. S) did not resolve; ``b_noise_tokens`` is a bound.
        stopped_because: settled / k / max_k / data / tokens / time.
        estimate: the estimator's full result (S, |G|² and their errors).
        draws: the estimate after each draw (evidence, see docs/evidence.md).
        skipped: draws that scored no token.
        seconds: wall-clock the probe took.
        records: each draw's scalars (:class:`~leadline.noise.estimator.Draw`), to recompute
            the estimate another way from the same draws.
    """

    b_noise_tokens: float | None
    se_tokens: float | None
    confirmed_tokens: float | None
    k: int
    micro_tokens: list[int]
    resolved: bool
    settled: bool
    lower_bound: bool
    upper_bound: bool
    stopped_because: str
    estimate: NoiseEstimate
    draws: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0
    seconds: float = 0.0
    records: list[Draw] = field(default_factory=list, repr=False)

    @property
    def tokens(self) -> int:
        """The scored tokens drawn (the largest batch the probe saw)."""
        return sum(self.micro_tokens)

    @property
    def coarse(self) -> bool:
        """The probe did not see the scale it reports (not settled)."""
        return not self.settled

    def evidence(self) -> dict[str, Any]:
        """The ``noise_probe`` plot's evidence (docs/evidence.md), plus the estimator's parts."""
        return {
            "plot": "noise_probe",
            "draws": self.draws,
            "b_noise_tokens": self.b_noise_tokens,
            "confirmed_tokens": self.confirmed_tokens,
            "stopped_because": self.stopped_because,
            "se_tokens": self.se_tokens,
            "resolved": self.resolved,
            "settled": self.settled,
            "lower_bound": self.lower_bound,
            "upper_bound": self.upper_bound,
            "micro_tokens": self.micro_tokens,
            "skipped": self.skipped,
            "estimate": self.estimate.as_dict(),
            "method": METHOD,
        }

    def sentence(self) -> str:
        """One line: the number, its error, how it was read and why the probe stopped."""
        reach = f"{self.k} micro-batches, {self.tokens:,} scored tokens"
        if self.b_noise_tokens is None:
            return f"the noise scale did not resolve over {reach} (stopped: {self.stopped_because})"
        b = tokens_text(float(self.b_noise_tokens))
        if self.lower_bound:
            what = f"at least {b} tokens (|G|² not above zero by one SE)"
        elif self.upper_bound:
            what = f"at most {b} tokens (S not above zero by one SE)"
        else:
            what = f"{b} ± {tokens_text(float(self.se_tokens or 0.0))} tokens"
        coarse = "" if self.settled else "; COARSE: the probe did not reach B_noise + SE"
        return f"B_noise = tr(Σ)/|G|² (McCandlish et al. 2018) = {what} over {reach} (stopped: {self.stopped_because}){coarse}"

    def as_values(self) -> dict[str, Value]:
        """The plan's entries: ``noise_scale_tokens`` (measured), ``noise_scale_confirmed_tokens`` (derived)."""
        ev = self.evidence()
        return {
            "noise_scale_tokens": Value(
                self.b_noise_tokens, "measured", self.sentence(), evidence=ev, seconds=self.seconds, unit="scored tokens",
            ),
            "noise_scale_confirmed_tokens": Value(
                self.confirmed_tokens, "derived",
                f"min(B_noise, the {self.tokens:,} scored tokens the probe reached): a coarse probe cuts the rate only as far as it reached",
                evidence={"b_noise_tokens": self.b_noise_tokens, "reached_tokens": self.tokens, "settled": self.settled},
                unit="scored tokens",
            ),
        }


def tokens_text(x: float) -> str:
    """A token count as a person reads it: 19,109 / 2.35 / 0."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _check_count(name: str, v: Any, lo: float = 1) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= lo or not math.isfinite(v)):
        raise InputError(f"measure_noise_scale({name}={v!r}): {name} must be a number >= {lo:g}, or None")


def measure_noise_scale(
    grad_fn: Callable[[int], Any],
    k: int | None = None,
    max_k: int | None = None,
    max_tokens: float | None = None,
    budget_s: float | None = None,
    rel_se: float | None = None,
) -> NoiseScale:
    """Measure the gradient noise scale B_noise = tr(Σ)/|G|² (McCandlish et al., 2018).

    Args:
        grad_fn: ``grad_fn(i) -> (gradient, scored_tokens)`` for micro-batch i = 0, 1, ...:
            the gradient of the MEAN loss over the micro-batch's scored tokens (a tensor, or a
            list of tensors, the same shapes every call) and how many tokens it scored. It
            returns None — or raises IndexError — when the data runs out. A draw that scores
            0 tokens is skipped. The probe never writes to the tensors it gets.
        k: draw exactly this many micro-batches (no early stop), unless the data ends first.
        max_k: at most this many draws (default ``DEFAULT_MAX_K`` when ``k`` is None too).
        max_tokens: stop once this many scored tokens are drawn.
        budget_s: stop before a draw that, at the mean draw time so far, would pass this.
        rel_se: a precision to reach: past settled, keep drawing until the standard error is at
            most this share of the estimate (0.035: two independent probes then agree within
            10% about 19 times in 20). The other limits still stop it; ``stopped_because`` says which.

    Returns:
        :class:`NoiseScale`, with ``stopped_because`` one of settled/k/max_k/data/tokens/time.

    The streaming keeps one accumulator of the gradient's size (fp32), the token-weighted
    mean, and three scalars per draw (see :mod:`leadline.noise.estimator`).

    References:
        McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch Training",
        arXiv:1812.06162 (2018), §2.2 and Appendix A.
    """
    _check_count("k", k)
    _check_count("max_k", max_k)
    _check_count("max_tokens", max_tokens, lo=1e-300)
    _check_count("budget_s", budget_s, lo=0)
    if rel_se is not None and (isinstance(rel_se, bool) or not isinstance(rel_se, (int, float)) or not 0 < rel_se < 1):
        raise InputError(f"measure_noise_scale(rel_se={rel_se!r}): give the standard error's share of the estimate, between 0 and 1 (0.035 for two probes within 10%)")
    if k is not None and int(k) != k:
        raise InputError(f"measure_noise_scale(k={k!r}): k must be a whole number of micro-batches")
    limit = int(k) if k is not None else int(max_k if max_k is not None else DEFAULT_MAX_K)
    if k is not None and max_k is not None:
        limit = min(limit, int(max_k))
    stream, sums = MeanStream(), NoiseSums()
    micro_tokens: list[int] = []
    records: list[Draw] = []
    draws: list[dict[str, Any]] = []
    skipped, i = 0, 0
    start = _clock()
    est = sums.estimate()
    stopped = ""
    while not stopped:
        elapsed = _clock() - start
        calls = len(micro_tokens) + skipped
        if len(micro_tokens) >= limit:
            stopped = "k" if k is not None and (max_k is None or k <= max_k) else "max_k"
        elif skipped >= limit:  # a source that scores nothing must not run for ever
            stopped = "max_k"
        elif max_tokens is not None and stream.tokens >= max_tokens:
            stopped = "tokens"
        elif budget_s is not None and calls and elapsed + elapsed / calls > budget_s:
            stopped = "time"
        elif budget_s is not None and elapsed >= budget_s:
            stopped = "time"
        if stopped:
            break
        try:
            out = grad_fn(i)
        except IndexError:
            out = None
        if out is None:
            stopped = "data"
            break
        gradient, tokens = _unpack(out, i)
        i += 1
        if tokens == 0:
            skipped += 1
            continue
        grads = as_tensor_list(gradient, f"grad_fn({i - 1})'s gradient")
        try:
            record = stream.add(grads, tokens)
            sums.add(record)
        except InputError as e:
            raise InputError(f"micro-batch {i - 1} ({tokens} scored tokens): {e}") from None
        records.append(record)
        micro_tokens.append(tokens)
        est = sums.estimate()
        draws.append({
            "k": len(micro_tokens), "tokens": int(stream.tokens),
            "estimate": est.b_noise_tokens if est.resolved else None, "se": est.se_tokens,
            "g2": est.g2, "s": est.s,
        })
        if k is None and len(micro_tokens) >= MIN_DRAWS and est.settled and _precise(est, rel_se):
            stopped = "settled"
    seconds = _clock() - start
    b = est.b_noise_tokens
    return NoiseScale(
        b_noise_tokens=b,
        se_tokens=est.se_tokens,
        confirmed_tokens=None if b is None else min(b, stream.tokens),
        k=len(micro_tokens),
        micro_tokens=micro_tokens,
        resolved=est.resolved,
        settled=est.settled,
        lower_bound=est.lower_bound,
        upper_bound=est.upper_bound,
        stopped_because=stopped,
        estimate=est,
        draws=draws,
        skipped=skipped,
        seconds=max(seconds, 0.0),
        records=records,
    )


def _precise(est: Any, rel_se: float | None) -> bool:
    """The estimate's standard error is within ``rel_se`` of it (always, when none is asked)."""
    if rel_se is None:
        return True
    b, se = est.b_noise_tokens, est.se_tokens
    return b is not None and se is not None and b > 0 and se <= rel_se * b


def _unpack(out: Any, i: int) -> tuple[Any, int]:
    if not (isinstance(out, tuple) and len(out) == 2):
        raise InputError(f"grad_fn({i}) must return (gradient, scored_tokens) or None when the data runs out, got {type(out).__name__}")
    gradient, tokens = out
    if hasattr(tokens, "item"):
        tokens = tokens.item()
    if isinstance(tokens, bool) or not isinstance(tokens, (int, float)) or tokens < 0 or int(tokens) != tokens:
        raise InputError(f"grad_fn({i}) returned scored_tokens={tokens!r}; it must be a whole number >= 0 (what the loss scores: labels != -100 after the shift)")
    return gradient, int(tokens)


# ---- the grad_fn for a model ---------------------------------------------------------------
_BATCH_KEYS = ("input_ids", "attention_mask", "labels")


def _batch_of(mb: Any, i: int) -> tuple[dict[str, Any], int | None]:
    """Model kwargs and the host-side scored-token count (None when not given)."""
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
    """

    def __init__(
        self,
        model: Any,
        micro_batch_of: Callable[[int], Any],
        params: Iterable[torch.Tensor] | None = None,
        row_losses: Callable[[Any, dict[str, Any]], torch.Tensor] | None = None,
    ) -> None:
        if not callable(micro_batch_of):
            raise InputError(f"ModelGradFn(micro_batch_of=...) must be callable i -> micro-batch, got {type(micro_batch_of).__name__}")
        self.model = model
        self.micro_batch_of = micro_batch_of
        self.params = [p for p in (params if params is not None else model.parameters()) if p.requires_grad]
        if not self.params:
            raise InputError("ModelGradFn found no trained tensors (none with requires_grad); pass params= or unfreeze the adapter")
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
        kwargs, scored = _batch_of(mb, i)
        if scored is None:
            labels = kwargs.get("labels")
            if labels is None:
                raise InputError(f"micro-batch {i} has neither labels nor scored_tokens; pass labels (-100 where not scored) or scored_tokens")
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
                raise InputError(f"the model returned no loss for micro-batch {i}; pass labels in the batch or row_losses=")
            if not bool(torch.isfinite(loss.detach())):
                raise InputError(f"the loss of micro-batch {i} is {float(loss.detach())} (noise-scale probe); check these rows and the model's dtype")
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
