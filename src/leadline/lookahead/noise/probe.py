"""The noise-scale probe: draw micro-batch gradients until B_noise is seen, then stop.

:func:`measure_noise_scale` feeds :mod:`leadline.lookahead.noise.estimator` (McCandlish et al., 2018,
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

:class:`~leadline.lookahead.noise.gradfn.ModelGradFn` is the ``grad_fn`` for a model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError
from leadline.lookahead.noise._stream import MeanStream, as_tensor_list
from leadline.lookahead.noise.estimator import Draw, NoiseEstimate, NoiseSums
from leadline.lookahead.pieces import ShardedSource
from leadline.plan import Value

if TYPE_CHECKING:
    pass

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
        records: each draw's scalars (:class:`~leadline.lookahead.noise.estimator.Draw`), to recompute
            the estimate another way from the same draws.

    Examples:
        A probe held to 8 draws of 20-60 tokens on a source whose true B_noise is 2,000 tokens:

        >>> import torch
        >>> from leadline.lookahead.noise.synthetic import KnownNoise
        >>> source = KnownNoise(b_noise_tokens=2_000, dim=256, tokens=(20, 60), seed=0, dtype=torch.float64)
        >>> noise = measure_noise_scale(source, k=8)
        >>> round(noise.b_noise_tokens), round(noise.se_tokens), noise.k, noise.tokens, noise.stopped_because
        (1259, 805, 8, 303, 'k')
        >>> noise.confirmed_tokens, noise.coarse     # min(B_noise, tokens reached): it did not see the scale
        (303.0, True)
        >>> noise.sentence().endswith("(stopped: k); COARSE: the probe did not reach B_noise + SE")
        True
        >>> sorted(noise.as_values()), noise.evidence()["plot"]
        (['noise_scale_confirmed_tokens', 'noise_scale_tokens'], 'noise_probe')
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
        return (f"B_noise = tr(Σ)/|G|² (McCandlish et al. 2018) = {what} over {reach} (stopped: "
                f"{self.stopped_because}){coarse}")

    def as_values(self) -> dict[str, Value]:
        """The plan's entries: ``noise_scale_tokens`` (measured), ``noise_scale_confirmed_tokens`` (derived)."""
        ev = self.evidence()
        return {
            "noise_scale_tokens": Value(
                self.b_noise_tokens, "measured", self.sentence(), evidence=ev, seconds=self.seconds,
                unit="scored tokens",
            ),
            "noise_scale_confirmed_tokens": Value(
                self.confirmed_tokens, "derived",
                f"min(B_noise, the {self.tokens:,} scored tokens the probe reached): a coarse probe cuts the rate only "
                "as far as it reached",
                evidence={"b_noise_tokens": self.b_noise_tokens, "reached_tokens": self.tokens,
                          "settled": self.settled},
                unit="scored tokens",
            ),
        }


def tokens_text(x: float) -> str:
    """A token count as a person reads it: separators from 100 on, three significant digits below.

    Examples:
        >>> tokens_text(19_109.4), tokens_text(2.3456), tokens_text(0)
        ('19,109', '2.35', '0')
    """
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _check_count(name: str, v: Any, lo: float = 1) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v,
                                                                (int, float)) or not v >= lo or not math.isfinite(v)):
        raise InputError(f"measure_noise_scale({name}={v!r}): {name} must be a number >= {lo:g}, or None")


def measure_noise_scale(
    grad_fn: Callable[[int], Any],
    k: int | None = None,
    max_k: int | None = None,
    max_tokens: float | None = None,
    budget_s: float | None = None,
    rel_se: float | None = None,
    reduce: Callable[[Any], Any] | None = None,
    min_k: int = MIN_DRAWS,
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
        reduce: for gradients sharded across ranks (each rank's ``grad_fn`` returns its shard
            and the world's scored tokens), sums each draw's three partial sums over the ranks
            in place (:class:`~leadline.lookahead.distributed.sharded.ShardedGradFn` gives one as
            ``reduce_sums``, used when this is None). Every rank must call the probe; a
            ``grad_fn`` with ``agree_stop(stopping) -> bool`` (any rank stopping) is asked before
            each draw, so a time budget stops every rank at the same draw.
        min_k: the fewest draws before the reading may settle (at least ``MIN_DRAWS``); the
            other limits still stop it sooner.

    Returns:
        :class:`NoiseScale`, with ``stopped_because`` one of settled/k/max_k/data/tokens/time.

    The streaming keeps one accumulator of the gradient's size (fp32), the token-weighted
    mean, and three scalars per draw (see :mod:`leadline.lookahead.noise.estimator`).

    Examples:
        A source of known noise scale (true B_noise 2,000 tokens), read until it settles:

        >>> import torch
        >>> from leadline.lookahead.noise.synthetic import KnownNoise
        >>> source = KnownNoise(b_noise_tokens=2_000, dim=256, tokens=(100, 400), seed=0, dtype=torch.float64)
        >>> noise = measure_noise_scale(source)
        >>> round(noise.b_noise_tokens), round(noise.se_tokens), noise.k, noise.tokens, noise.stopped_because
        (2111, 298, 11, 2765, 'settled')
        >>> noise.settled, noise.tokens >= noise.b_noise_tokens + noise.se_tokens
        (True, True)
        >>> measure_noise_scale(lambda i: None).stopped_because     # no micro-batch at all
        'data'
        >>> measure_noise_scale(lambda i: 1.0)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: grad_fn(0) must return (gradient, scored_tokens) or None when the data runs out, ...

    References:
        McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch Training",
        arXiv:1812.06162 (2018), §2.2 and Appendix A.
    """
    limit = _limit(k, max_k, max_tokens, budget_s, rel_se)
    _check_count("min_k", min_k)
    fewest = max(MIN_DRAWS, int(min_k))
    sharded = isinstance(grad_fn, ShardedSource)
    if reduce is None and sharded:
        reduce = grad_fn.reduce_sums
    agree_stop = grad_fn.agree_stop if sharded else None  # ranks drawing one sharded gradient stop together
    r = _Reading(MeanStream(reduce=reduce), NoiseSums())
    i = 0
    start = _clock()
    r.est = r.sums.estimate()
    stopped = ""
    while not stopped:
        stopped = r.why_stop(_clock() - start, limit, k, max_k, max_tokens, budget_s)
        if agree_stop is not None and agree_stop(bool(stopped)) and not stopped:
            stopped = "time"  # another rank's clock ran out first (every other stop is the same on each rank)
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
            r.skipped += 1
            continue
        r.add(gradient, tokens, i - 1)
        if k is None and len(r.micro_tokens) >= fewest and r.est.settled and _precise(r.est, rel_se):
            stopped = "settled"
    seconds = _clock() - start
    return r.result(stopped, seconds)


def _limit(k: int | None, max_k: int | None, max_tokens: float | None, budget_s: float | None,
           rel_se: float | None) -> int:
    """The most draws the reading takes, after checking the bounds it was given."""
    _check_count("k", k)
    _check_count("max_k", max_k)
    _check_count("max_tokens", max_tokens, lo=1e-300)
    _check_count("budget_s", budget_s, lo=0)
    if rel_se is not None and (isinstance(rel_se, bool) or not isinstance(rel_se, (int, float)) or not 0 < rel_se < 1):
        raise InputError(f"measure_noise_scale(rel_se={rel_se!r}): give the standard error's share of the estimate, "
                         "between 0 and 1 (0.035 for two probes within 10%)")
    if k is not None and int(k) != k:
        raise InputError(f"measure_noise_scale(k={k!r}): k must be a whole number of micro-batches")
    limit = int(k) if k is not None else int(max_k if max_k is not None else DEFAULT_MAX_K)
    if k is not None and max_k is not None:
        limit = min(limit, int(max_k))
    return limit


@dataclass
class _Reading:
    """The draws read so far: the stream and the sums they feed, and what the result reports."""

    stream: MeanStream
    sums: NoiseSums
    est: Any = None
    micro_tokens: list[int] = field(default_factory=list)
    records: list[Draw] = field(default_factory=list)
    draws: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0

    def why_stop(self, elapsed: float, limit: int, k: int | None, max_k: int | None, max_tokens: float | None,
                 budget_s: float | None) -> str:
        """Why the reading stops before its next draw ("" where it goes on)."""
        calls = len(self.micro_tokens) + self.skipped
        if len(self.micro_tokens) >= limit:
            return "k" if k is not None and (max_k is None or k <= max_k) else "max_k"
        if self.skipped >= limit:  # a source that scores nothing must not run for ever
            return "max_k"
        if max_tokens is not None and self.stream.tokens >= max_tokens:
            return "tokens"
        if budget_s is not None and calls and elapsed + elapsed / calls > budget_s:
            return "time"
        if budget_s is not None and elapsed >= budget_s:
            return "time"
        return ""

    def add(self, gradient: Any, tokens: int, i: int) -> None:
        """Draw i's gradient over its ``tokens`` scored tokens into the stream, the sums and the record."""
        grads = as_tensor_list(gradient, f"grad_fn({i})'s gradient")
        try:
            record = self.stream.add(grads, tokens)
            self.sums.add(record)
        except InputError as e:
            raise InputError(f"micro-batch {i} ({tokens} scored tokens): {e}") from None
        self.records.append(record)
        self.micro_tokens.append(tokens)
        est = self.est = self.sums.estimate()
        self.draws.append({
            "k": len(self.micro_tokens), "tokens": int(self.stream.tokens),
            "estimate": est.b_noise_tokens if est.resolved else None, "se": est.se_tokens,
            "g2": est.g2, "s": est.s,
        })

    def result(self, stopped: str, seconds: float) -> NoiseScale:
        est = self.est
        b = est.b_noise_tokens
        return NoiseScale(
            b_noise_tokens=b,
            se_tokens=est.se_tokens,
            confirmed_tokens=None if b is None else min(b, self.stream.tokens),
            k=len(self.micro_tokens),
            micro_tokens=self.micro_tokens,
            resolved=est.resolved,
            settled=est.settled,
            lower_bound=est.lower_bound,
            upper_bound=est.upper_bound,
            stopped_because=stopped,
            estimate=est,
            draws=self.draws,
            skipped=self.skipped,
            seconds=max(seconds, 0.0),
            records=self.records,
        )


def _precise(est: Any, rel_se: float | None) -> bool:
    """The estimate's standard error is within ``rel_se`` of it (always, when none is asked)."""
    if rel_se is None:
        return True
    b, se = est.b_noise_tokens, est.se_tokens
    return b is not None and se is not None and b > 0 and se <= rel_se * b


def _unpack(out: Any, i: int) -> tuple[Any, int]:
    if not (isinstance(out, tuple) and len(out) == 2):
        raise InputError(f"grad_fn({i}) must return (gradient, scored_tokens) or None when the data runs out, got "
                         f"{type(out).__name__}")
    gradient, tokens = out
    if hasattr(tokens, "item"):
        tokens = tokens.item()
    if isinstance(tokens, bool) or not isinstance(tokens, (int, float)) or tokens < 0 or int(tokens) != tokens:
        raise InputError(f"grad_fn({i}) returned scored_tokens={tokens!r}; it must be a whole number >= 0 (what the "
                         "loss scores: labels != -100 after the shift)")
    return gradient, int(tokens)
