"""The raced ending as a run prints it: what each ending read on the held-out rows, which was
kept, and why in words, from the record :func:`leadline.lookahead.rate._run.race_ending` writes.

The decay is the null: the best decayed ending is kept unless the constant ending is better by a
one-sided paired t test, so the kept ending need not read the lowest; the second line says so
with the test's p-value (``docs/rate.md``).
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

from leadline import stats

COLUMNS = 100


def ending_lines(ending: dict[str, Any]) -> list[str]:
    """Two lines for a raced ending's record (one with ``constant_versus_decay``): the losses
    read, then why the kept one was kept, wrapped under :data:`COLUMNS`.

    Examples:
        The constant ending read lower, but not by enough on 3 rows: the decay is kept, and
        the second line says why:

        >>> ending = {"kept": "decay", "from_step": 20, "to_step": 26, "alpha": 0.05,
        ...           "constant": {"loss": 0.1272}, "decays": [{"steps": 6, "loss": 0.1589}],
        ...           "constant_versus_decay": {"better": False, "bar": 2.92, "mean": -0.0317, "t": -0.9, "n": 3}}
        >>> for line in ending_lines(ending):
        ...     print(line)
        ending: decay kept on the held-out rows (constant 0.1272, decayed over the last 6 steps 0.1589)
          why: the constant ending read lower, but not significantly (one-sided paired t test on 3 rows,
               p=0.23 against alpha 0.05); the decay over the last 6 steps is kept unless the constant
               ending is significantly better (docs/rate.md)
    """
    read = [f"constant {_loss(ending['constant']['loss'])}"]
    read += [f"decayed over the last {d['steps']} steps {_loss(d['loss'])}" if i == 0 else
             f"the last {d['steps']} {_loss(d['loss'])}" for i, d in enumerate(_decays(ending))]
    head = f"ending: {ending['kept']} kept on the held-out rows ({', '.join(read)})"
    wrap = {"width": COLUMNS - 1, "subsequent_indent": "  ", "break_on_hyphens": False}
    why = textwrap.wrap(f"why: {_why(ending)}", initial_indent="  ", **{**wrap, "subsequent_indent": " " * 7})
    return [*textwrap.wrap(head, **wrap), *why]


def _loss(x: float) -> str:
    return f"{x:.4f}" if math.isfinite(x) else "not finite"


def _why(ending: dict[str, Any]) -> str:
    """Why the kept ending was kept, from the test's record."""
    verdict = ending.get("constant_versus_decay") or {}
    alpha = float(ending.get("alpha", 0.05))
    rivals = [(f"the decay over the last {d['steps']} steps", d["loss"]) for d in _decays(ending)]
    other, best = min(rivals, key=lambda r: r[1] if math.isfinite(r[1]) else math.inf)
    constant = ending["constant"]["loss"]
    if "t" not in verdict or "n" not in verdict:  # no test: a side's losses were not finite
        if ending["kept"] == "constant":
            return f"the held-out losses of {other} are not finite (it diverged); the constant ending is put back"
        return f"the held-out losses of the constant ending are not finite; {other} is kept"
    test = f"one-sided paired t test on {verdict['n']} rows, {_p(verdict)} against alpha {alpha:g}"
    if ending["kept"] == "constant":
        if verdict.get("better"):
            return f"the constant ending read significantly lower than {other} ({test})"
        return f"the held-out losses of {other} are not finite (it diverged); the constant ending is put back"
    rule = f"{other} is kept unless the constant ending is significantly better (docs/rate.md)"
    if constant < best:
        t = float(verdict["t"])
        if math.isfinite(t) and t < -float(verdict.get("bar", math.inf)):  # past the bar, yet not better
            return f"the constant ending read lower by under 0.1% of the loss, which counts as a tie ({test}); {rule}"
        return f"the constant ending read lower, but not significantly ({test}); {rule}"
    return f"{other} read lowest, and the constant ending is not significantly better ({test})"


def _decays(ending: dict[str, Any]) -> list[dict[str, Any]]:
    """Every decayed ending raced (a record from before ``decays`` holds one, as ``decay``)."""
    if ending.get("decays"):
        return list(ending["decays"])
    if isinstance(ending.get("decay"), dict):
        return [{"steps": ending["to_step"] - ending["from_step"], **ending["decay"]}]
    return []


def _p(verdict: dict[str, Any]) -> str:
    """The one-sided p-value of "the constant ending is lower", from t and n."""
    t, n = float(verdict["t"]), int(verdict["n"])
    if n < 2 or math.isnan(t):
        return "p not defined"
    return f"p={stats.t_cdf(t, n - 1):.2g}"
