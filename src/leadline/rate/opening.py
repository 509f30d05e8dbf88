"""The opening race: the run's rate decided on the run's own opening steps, and kept.

Schedule-free AdamW (Defazio et al. 2024) runs the whole job: its averaged weights are the
model at every step, so the run needs no ending and no rerun of its tail. What its README leaves
to the user, the rate, is decided on the run's first ``h`` optimizer steps:

1. the candidates are the default ``c`` (2.5e-3 for adapters, schedule-free's own default;
   2.5e-4 for every weight, a tenth, the ratio of TRL's defaults 2e-4 / 2e-5 and of published LoRA
   guidance) and the lower ``c/4``. No rate above ``c`` is raced: an opening horizon favours fast
   rates (the seed measured LoRA's best rate at 2 and 4 steps at twice the one that won at 90
   steps), so a higher rate that reads lower there says little about the run, and on the
   scoreboard's boards ``4c`` never replaced ``c`` (docs/results.md). A rate the user wants higher
   is given (``--lr``) and guarded;
2. ``c`` runs the run's first ``h`` steps and is read on the held-out rows at its averaged
   weights;
3. ``c/4`` runs the same ``h`` steps from the same start only when ``c`` *stalled*: its held-out
   loss is not significantly below the start's (the one-sided paired t at 5%). A lower rate learns
   more slowly over an opening horizon, so against a ``c`` that is learning it cannot win there;
   against a ``c`` too high to learn it can. It replaces ``c`` only when its held-out loss is lower
   by the same test and its held-out answers did not collapse. A rate never reaches the run
   without beating the rate the user would have typed, on rows no step trained on;
4. the winner's ``h`` steps are the run's first: the run continues from its weights and optimizer
   state (and under the guard, :mod:`leadline.rate.guard`). The loser's steps are the decision's
   overhead: none where ``c`` learns, ``h`` where it stalled, with ``2h`` at most the decision's
   share of the run (``decide_share``, 20% by default).

A challenger that reads lower *collapses* (the check is not run for one that does not: it could
not win) when the data has a small set of answers (at most :data:`MAX_ANSWERS`
distinct completions among the training rows) and, on the held-out rows (the first
:data:`ANSWER_ROWS`), one answer takes over 60% of its choices where the held-out gold's majority
is under 40% (the scoreboard's rule).

Reference: Defazio et al. 2024, "The Road Less Scheduled", <https://arxiv.org/abs/2405.15682>.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from leadline.errors import InputError
from leadline.rate.compare import compare

DEFAULT_RATE = {"factors": 2.5e-3, "weights": 2.5e-4}
"""The incumbent ``c`` by what is trained: an adapter's factors or every weight."""
SPREAD = 4.0
"""The challenger's distance below ``c``: ``c/4``."""
DECIDE_SHARE = 0.2
"""The share of the run's steps the decision may spend on steps it does not keep."""
MAX_ANSWERS = 32
"""Data with at most this many distinct completions is checked for collapse."""
ANSWER_ROWS = 64
"""The held-out rows a challenger's answers are chosen on: 64 rows put a 60% share 4 standard
errors above a 40% majority, at a fraction of scoring every answer on every held-out row."""
ALPHA = 0.05


def opening_rates(trained_as: str) -> tuple[float, float]:
    """The incumbent and its challenger, in the order they run: ``c``, ``c/4``.

    Examples:
        >>> opening_rates("factors")
        (0.0025, 0.000625)
        >>> opening_rates("weights")
        (0.00025, 6.25e-05)
        >>> opening_rates("bits")
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: trained_as must be 'factors' or 'weights', got 'bits'
    """
    if trained_as not in DEFAULT_RATE:
        raise InputError(f"trained_as must be 'factors' or 'weights', got {trained_as!r}")
    c = DEFAULT_RATE[trained_as]
    return c, c / SPREAD


def horizon(total_steps: int, decide_share: float = DECIDE_SHARE) -> int:
    """``h``: the steps each candidate runs, so that the two losers' ``2h`` steps are at most
    ``decide_share`` of the run; 0 where the run is too short for a race (``h`` under 2 steps).

    Examples:
        >>> horizon(107), horizon(50), horizon(10), horizon(107, 0.0)
        (10, 5, 0, 0)
        >>> horizon(100, 1.5)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: decide_share must be in [0, 1), got 1.5
    """
    if not 0 <= decide_share < 1:
        raise InputError(f"decide_share must be in [0, 1), got {decide_share}")
    h = math.floor(decide_share * total_steps / 2)
    return h if h >= 2 else 0


def collapsed(choices: Sequence[Hashable], gold: Sequence[Hashable]) -> bool:
    """One answer over 60% of the choices where the gold's majority is under 40%.

    Examples:
        >>> collapsed(["a"] * 7 + ["b"] * 3, list("abcdabcdab"))
        True
        >>> collapsed(["a"] * 5 + ["b"] * 5, list("abcdabcdab"))
        False
        >>> collapsed(["a"] * 10, ["a"] * 9 + ["b"])  # the gold itself is one answer
        False
    """
    if not choices or not gold:
        return False
    top = Counter(choices).most_common(1)[0][1] / len(choices)
    majority = Counter(gold).most_common(1)[0][1] / len(gold)
    return top > 0.6 and majority < 0.4


@dataclass
class Reading:
    """One candidate after its ``h`` steps: its held-out losses (at the averaged weights) and,
    where the data has a small set of answers, the answers it chose."""

    lr: float
    losses: list[float]
    choices: list[Any] | None = None
    collapsed: bool = False

    @property
    def mean(self) -> float:
        return math.fsum(self.losses) / len(self.losses) if self.losses else math.inf


@dataclass
class Decision:
    """What the climb decided: the kept rate and each step of the rule, for the plan's evidence."""

    lr: float
    tests: list[dict[str, Any]] = field(default_factory=list)

    def sentence(self) -> str:
        last = self.tests[-1] if self.tests else None
        if last is None:
            return "the default: the run was too short to race"
        return "; ".join(t["why"] for t in self.tests)


def challenger_ran(decision: Decision) -> bool:
    """Whether any rate raced the default: a race that ran the default alone measured no choice.

    Examples:
        >>> challenger_ran(Decision(2.5e-3)), challenger_ran(Decision(2.5e-3, [{"ran": False}]))
        (False, False)
        >>> challenger_ran(Decision(2.5e-3, [{"replaces": False}]))  # a test that ran has no "ran": False
        True
    """
    return any(t.get("ran", True) for t in decision.tests)


def default_rate_source(trained_as: str, why_alone: str) -> str:
    """The sentence of the default rate where no challenger raced it (``why_alone``: why none ran):
    a constant, not a measurement; what the run measures of it is the guard's checks.

    Examples:
        >>> default_rate_source("factors", "a run of 5 steps is too short to race")
        "schedule-free's default, checked by the guard; no challenger ran: a run of 5 steps is too short to race"
        >>> default_rate_source("weights", "--decide-share 0")  # doctest: +NORMALIZE_WHITESPACE
        "schedule-free's default, checked by the guard (a tenth of its 0.0025, where every weight trains);
        no challenger ran: --decide-share 0"
    """
    c = DEFAULT_RATE["factors"]
    whose = "" if DEFAULT_RATE.get(trained_as) == c else f" (a tenth of its {c:.3g}, where every weight trains)"
    return f"schedule-free's default, checked by the guard{whose}; no challenger ran: {why_alone}"


def why_alone(decision: Decision, h: int) -> str:
    """Why the race ran the default alone, from its last test's numbers.

    Examples:
        >>> d = Decision(2.5e-3, [{"ran": False, "challenger": 6.25e-4, "incumbent": 2.5e-3,
        ...                        "incumbent_mean": 5.91, "start_mean": 5.94}])
        >>> print(why_alone(d, 2))  # doctest: +NORMALIZE_WHITESPACE
        0.0025 learned in its 2 opening steps (held-out loss 5.94 to 5.91), which a lower rate (0.000625)
        cannot beat over so few steps
    """
    t = decision.tests[-1]
    return (f"{t['incumbent']:.3g} learned in its {h} opening step{'s' if h != 1 else ''} (held-out loss "
            f"{t['start_mean']:.4g} to {t['incumbent_mean']:.4g}), which a lower rate ({t['challenger']:.3g}) cannot "
            "beat over so few steps")


def challenge(incumbent: Reading, challenger: Reading) -> dict[str, Any]:
    """Does ``challenger`` replace ``incumbent``? Lower held-out loss by the one-sided paired t at
    :data:`ALPHA`, and no collapse.

    Examples:
        >>> a = Reading(1e-3, [1.0, 2.0, 3.0, 4.0])
        >>> b = Reading(4e-3, [0.9, 1.9, 2.8, 3.9])
        >>> challenge(a, b)["replaces"], challenge(b, a)["replaces"]
        (True, False)
        >>> b.collapsed = True
        >>> challenge(a, b)["why"]
        '0.004 read lower but its held-out answers collapsed to one: dropped'
    """
    v = compare(challenger.losses, incumbent.losses, alpha=ALPHA)
    test = {"incumbent": incumbent.lr, "challenger": challenger.lr, "incumbent_mean": incumbent.mean,
            "challenger_mean": challenger.mean, **v.as_dict()}
    if challenger.collapsed:
        why = f"{challenger.lr:.3g} read lower but its held-out answers collapsed to one: dropped"
        return {**test, "replaces": False, "why": why if v.better else f"{challenger.lr:.3g} collapsed: dropped"}
    if v.better:
        why = (f"{challenger.lr:.3g} beat {incumbent.lr:.3g} ({challenger.mean:.4f} against {incumbent.mean:.4f}, "
               f"paired t {v.diff.t:.2f} past {v.bar:.2f})" if v.diff is not None else
               f"{challenger.lr:.3g} beat {incumbent.lr:.3g}, which diverged")
        return {**test, "replaces": True, "why": why}
    t = f", paired t {v.diff.t:.2f}" if v.diff is not None else ", diverged"
    why = f"{challenger.lr:.3g} did not beat {incumbent.lr:.3g} ({challenger.mean:.4f} against {incumbent.mean:.4f}{t})"
    return {**test, "replaces": False, "why": why}


def stalled(start: Sequence[float] | None, reading: Reading) -> bool:
    """Whether ``reading``'s held-out loss is not significantly below the start's (the one-sided
    paired t at :data:`ALPHA`); True without a start reading.

    Examples:
        >>> stalled([2.0, 2.1, 2.2], Reading(1.0, [1.0, 1.1, 1.3]))
        False
        >>> stalled([2.0, 2.1, 2.2], Reading(1.0, [2.0, 2.2, 2.1])), stalled(None, Reading(1.0, [1.0]))
        (True, True)
    """
    return start is None or not compare(reading.losses, start, alpha=ALPHA).better


def climb(run: Callable[[float], Reading], rates: Sequence[float],
          start: Sequence[float] | None = None) -> tuple[Decision, dict[float, Reading]]:
    """The rule: ``rates[0]`` the incumbent, the others challenge it in order until one replaces it; a
    rate below the incumbent runs only when the incumbent :func:`stalled` against ``start`` (the
    held-out losses before any step). ``run(lr)`` runs a candidate and reads it. The default run
    passes :func:`opening_rates` (no rate above the default); a caller may race a higher one.

    Examples:
        A higher rate that reads lower wins, and the lower one never runs:

        >>> table = {1.0: [2.0, 2.1, 2.2], 4.0: [1.0, 1.1, 1.3], 0.25: [0.1, 0.1, 0.1]}
        >>> d, ran = climb(lambda lr: Reading(lr, table[lr]), [1.0, 4.0, 0.25])
        >>> d.lr, sorted(ran)
        (4.0, [1.0, 4.0])

        A higher rate that does not read lower leaves the lower one to challenge where the
        default stalled, and not where it learned:

        >>> table[4.0] = [2.5, 2.6, 2.6]
        >>> d, ran = climb(lambda lr: Reading(lr, table[lr]), [1.0, 4.0, 0.25], start=[2.0, 2.1, 2.3])
        >>> d.lr, sorted(ran)
        (0.25, [0.25, 1.0, 4.0])
        >>> d, ran = climb(lambda lr: Reading(lr, table[lr]), [1.0, 4.0, 0.25], start=[3.0, 3.1, 3.2])
        >>> d.lr, sorted(ran)
        (1.0, [1.0, 4.0])
        >>> d.tests[-1]["why"]
        '0.25 not run: 1 learned (held-out 2.1 from 3.1), which a lower rate cannot beat over the opening'

    """
    readings = {rates[0]: run(rates[0])}
    decision = Decision(lr=rates[0])
    for lr in rates[1:]:
        if lr < rates[0] and not stalled(start, readings[rates[0]]):
            assert start is not None
            before = math.fsum(start) / len(start)
            after = readings[rates[0]].mean
            decision.tests.append({"challenger": lr, "ran": False, "replaces": False, "incumbent": rates[0],
                                   "incumbent_mean": after, "start_mean": before,
                                   "why": f"{lr:.3g} not run: {rates[0]:.3g} learned (held-out {after:.4g} from "
                                          f"{before:.4g}), which a lower rate cannot beat over the opening"})
            break
        readings[lr] = run(lr)
        test = challenge(readings[decision.lr], readings[lr])
        decision.tests.append(test)
        if test["replaces"]:
            decision.lr = lr
            break
    return decision, readings


# ---- answers: the collapse check ------------------------------------------------------------
class LabeledRow(Protocol):
    """A tokenized row as the answer rules read it (:class:`leadline.corpus.TokenizedRow` is one):
    its token ids and its labels, ``-100`` where a token is not scored."""

    @property
    def input_ids(self) -> Sequence[int]: ...

    @property
    def labels(self) -> Sequence[int]: ...


def answer_set(rows: Sequence[LabeledRow], train: Sequence[int]) -> list[tuple[int, ...]] | None:
    """The distinct completions (scored token ids) of the training rows, or None where there are
    more than :data:`MAX_ANSWERS` (free text: no collapse to check)."""
    seen: dict[tuple[int, ...], None] = {}
    for i in train:
        seen[_answer(rows[i])] = None
        if len(seen) > MAX_ANSWERS:
            return None
    return list(seen) if len(seen) >= 2 else None


def gold_of(rows: Sequence[LabeledRow], asked: Sequence[int], answers: Sequence[tuple[int, ...]]) -> list[int]:
    """Each asked row's own answer (its scored tokens) as an index into ``answers``; -1 where it
    is none of them.

    Examples:
        >>> from leadline.corpus import TokenizedRow
        >>> rows = [TokenizedRow.from_labels([5, 6, a], [-100, -100, a]) for a in (1, 2, 3)]
        >>> gold_of(rows, [0, 1, 2], [(2,), (1,)])
        [1, 0, -1]
    """
    return [answers.index(a) if a in answers else -1 for a in (_answer(rows[i]) for i in asked)]


def first_scored(row: LabeledRow) -> int:
    """The position of a row's first scored token (its answer's start; the row's length where none is)."""
    return next((p for p, lab in enumerate(row.labels) if lab != -100), len(row.labels))


def _answer(row: LabeledRow) -> tuple[int, ...]:
    return tuple(row.input_ids[first_scored(row):])
