"""The raced ending's lines: the losses read, the one kept, and why in words when it is not the lowest."""

import math

from leadline import stats
from leadline.report.ending import ending_lines


def _ending(kept, constant, decays, *, t, n=23, better=False, bar=1.72):
    return {"kept": kept, "from_step": 20, "to_step": 26, "alpha": 0.05, "constant": {"loss": constant},
            "decays": [{"steps": s, "loss": loss} for s, loss in decays],
            "constant_versus_decay": {"worse": False, "better": better, "bar": bar, "mean": 0.0, "t": t, "n": n}}


def test_a_decay_kept_above_the_constant_says_the_constant_was_not_significantly_better():
    lines = ending_lines(_ending("decay", 0.1272, [(6, 0.1589), (13, 0.1828)], t=-0.9))
    text = " ".join(ln.strip() for ln in lines)
    assert lines[0].startswith("ending: decay kept on the held-out rows (constant 0.1272, decayed over the last 6 "
                               "steps 0.1589, the")
    assert "the last 13 0.1828)" in text
    p = stats.t_cdf(-0.9, 22)
    assert 0.15 < p < 0.25 and f"p={p:.2g} against alpha 0.05" in text  # one-sided, from t and the rows
    assert "the constant ending read lower, but not significantly (one-sided paired t test on 23 rows" in text
    assert "the decay over the last 6 steps is kept unless the constant ending is significantly better" in text
    assert all(len(ln) < 100 for ln in lines)


def test_a_decay_kept_as_the_lowest_says_so():
    text = " ".join(ln.strip() for ln in ending_lines(_ending("decay", 1.0057, [(6, 0.6761), (13, 0.7993)], t=0.99,
                                                                 n=3)))
    assert "why: the decay over the last 6 steps read lowest, and the constant ending is not significantly better" in text
    assert "read lower, but" not in text


def test_a_constant_kept_names_the_test_that_kept_it():
    text = " ".join(ln.strip() for ln in ending_lines(_ending("constant", 0.10, [(6, 0.20)], t=-4.0, better=True)))
    assert text.startswith("ending: constant kept on the held-out rows (constant 0.1000, decayed over the last 6 "
                           "steps 0.2000)")
    assert f"the constant ending read significantly lower than the decay over the last 6 steps (one-sided paired t " \
           f"test on 23 rows, p={stats.t_cdf(-4.0, 22):.2g}" in text


def test_a_lower_constant_past_the_bar_but_under_the_least_effect_is_a_tie():
    text = " ".join(ln.strip() for ln in ending_lines(_ending("decay", 0.99990, [(6, 0.99995)], t=-9.0)))
    assert "read lower by under 0.1% of the loss, which counts as a tie" in text


def test_a_diverged_decay_is_named():
    diverged = {"kept": "constant", "from_step": 20, "to_step": 26, "alpha": 0.05, "constant": {"loss": 0.5},
                "decays": [{"steps": 6, "loss": math.inf}],
                "constant_versus_decay": {"worse": False, "better": True, "bar": math.inf}}
    text = " ".join(ln.strip() for ln in ending_lines(diverged))
    assert "decayed over the last 6 steps not finite" in text
    assert "the held-out losses of the decay over the last 6 steps are not finite (it diverged)" in text


def test_the_record_race_ending_writes_is_read_as_it_is():
    """The toy of race_ending's own example: the decay from step 2 lands nearer and is kept."""
    import torch

    from leadline.lookahead.rate._run import EndingCopy, race_ending
    from leadline.lookahead.rate.measuring import run_steps
    from leadline.rate.state import Snapshot

    w = torch.zeros(4, requires_grad=True)
    opt = torch.optim.Adam([w])

    def train_step(step):
        ((w - 0.01) ** 2).mean().backward()

    run_steps(opt, train_step, 0, 2, lambda t: 0.0025, [1.0])
    copy = EndingCopy(Snapshot.take([w], opt), 0.0025, start=2)
    run_steps(opt, train_step, 2, 8, lambda t: 0.0025, [1.0])
    ending, _ = race_ending([w], opt, train_step, lambda: ((w - 0.01) ** 2).tolist(), [copy], 8, [1.0], 4,
                            alpha=0.05, place="auto")
    lines = ending_lines(ending)
    assert lines[0].startswith(f"ending: decay kept on the held-out rows (constant {ending['constant']['loss']:.4f}")
    assert "why: the decay over the last 6 steps read lowest" in lines[1]
