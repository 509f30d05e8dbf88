"""alpha1: the pure bracketing on known curves first, then the walk on a regression whose line
minimum along Adam's first update is known in closed form."""

from __future__ import annotations

import math

import pytest

from leadline.lookahead.rate.first_step import golden_section_log, walk

torch = pytest.importorskip("torch")

from test_rate_toys import Regression  # noqa: E402


def bowl(center: float, floor: float = 1.0):
    """A 1-D curve in log(lr) with its minimum at ``center``; ``floor`` at the minimum."""
    return lambda lr: floor + (math.log(lr) - math.log(center)) ** 2


def test_walk_brackets_a_known_minimum():
    f = bowl(3e-3)
    w = walk(f, base=f(1e-9), start=1e-7, factor=4.0, max_lr=1.0)
    assert w.fell and w.bracket is not None
    lo, mid, hi = w.bracket
    assert lo < 3e-3 < hi
    assert f(mid) < f(lo) and f(mid) < f(hi)
    assert w.points[-1][0] == hi  # it stopped at the first rise


def test_golden_section_lands_on_the_minimum_within_tolerance():
    f = bowl(3e-3)
    seen = golden_section_log(f, 1e-3, 1.6e-2, rel_tol=0.02)
    best = min(seen, key=lambda p: p[1])[0]
    assert best == pytest.approx(3e-3, rel=0.02)
    # golden section shrinks the bracket by 0.618 per evaluation (plus the first two)
    assert len(seen) <= 2 + math.ceil(math.log(math.log(16) / math.log(1.02)) / math.log(1 / 0.618))


def test_walk_waits_for_a_fall_before_it_stops():
    # flat noise-level wiggles below the base first, then the real fall
    def f(lr: float) -> float:
        if lr < 1e-5:
            return 5.0 + (1e-9 if int(math.log(lr / 1e-7, 4)) % 2 else 0.0)
        return 4.0 + (math.log(lr) - math.log(1e-3)) ** 2 / 10

    w = walk(f, base=5.0, start=1e-7, factor=4.0)
    assert w.bracket is not None and w.bracket[0] < 1e-3 < w.bracket[2]


def test_walk_reports_no_fall_and_a_loss_still_falling():
    rising = walk(lambda lr: 1.0 + lr, base=1.0, start=1e-3, factor=10.0, max_lr=1.0)
    assert not rising.fell and rising.bracket is None and len(rising.points) == 4
    falling = walk(lambda lr: 1.0 - lr, base=1.0, start=1e-3, factor=10.0, max_lr=1.0)
    assert falling.fell and falling.bracket is None
    nan = walk(lambda lr: 1.0 - lr if lr < 0.05 else math.nan, base=1.0, start=1e-3, factor=10.0)
    assert nan.bracket is not None and nan.points[-1][1] == math.inf


def line_minimum(toy: Regression) -> float:
    """The exact minimizer along Adam's first update from w = 0 on the held-out rows.

    Adam's first step at lr = 1: u = g / (|g| + eps); the loss along w0 - lr u is a parabola
    in lr with its minimum at (Xh u) . (Xh w0 - yh) / |Xh u|^2.
    """
    w0 = toy.w.detach().clone()
    x, y = toy.xs[0], toy.ys[0]
    g = 2 * x.T @ (x @ w0 - y) / x.shape[0]
    u = g / (g.abs() + 1e-8)
    xu = toy.xh @ u
    return float(xu @ (toy.xh @ w0 - toy.yh) / (xu @ xu))


def test_alpha1_is_the_line_minimum_and_nothing_changed():
    from leadline.lookahead.rate import measure_first_step

    toy = Regression(seed=1, dim=32)
    before = toy.state()
    fs = measure_first_step(toy.params, toy.opt, toy.train_step, toy.held_out, rel_tol=0.01)
    toy.assert_state(before)
    assert fs.found and fs.alpha1 == pytest.approx(line_minimum(toy), rel=0.05)  # to the rows' resolution
    assert fs.loss < fs.base_loss and fs.versus_base["mean"] < 0
    ev = fs.evidence()
    assert ev["plot"] == "first_step" and ev["alpha1"] == fs.alpha1 and {"lr", "loss"} <= set(ev["walk"][0])
    v = fs.as_values()["alpha1"]
    assert v.kind == "measured" and v.value == fs.alpha1 and "stops falling" in v.source


def test_at_alpha1_reads_with_the_weights_at_alpha1_then_restores():
    from leadline.lookahead.rate import measure_first_step

    toy = Regression(seed=1, dim=32)
    before = toy.state()
    seen = []

    def read():
        seen.append((float(sum(toy.held_out()) / len(toy.held_out())), torch.is_grad_enabled()))
        return "read"

    fs = measure_first_step(toy.params, toy.opt, toy.train_step, toy.held_out, at_alpha1=read)
    toy.assert_state(before)
    assert fs.at_alpha1 == "read" and len(seen) == 1
    assert seen[0][0] == pytest.approx(fs.loss, rel=1e-6) and seen[0][1]


def test_an_adamw_first_step_includes_its_decoupled_decay():
    from leadline.lookahead.rate import measure_first_step

    toy = Regression(seed=1, dim=32)
    with torch.no_grad():
        toy.w.fill_(0.05)
    toy.opt = torch.optim.AdamW(toy.params, lr=1e-3, weight_decay=0.5)
    fs = measure_first_step(toy.params, toy.opt, toy.train_step, toy.held_out, rel_tol=0.01)
    w0 = toy.w.detach().clone()
    x, y = toy.xs[0], toy.ys[0]
    g = 2 * x.T @ (x @ w0 - y) / x.shape[0]
    u = g / (g.abs() + 1e-8) + 0.5 * w0  # AdamW at lr = 1: W1 = W0 (1 - wd) - g/(|g| + eps)
    xu = toy.xh @ u
    assert fs.alpha1 == pytest.approx(float(xu @ (toy.xh @ w0 - toy.yh) / (xu @ xu)), rel=0.01)


def test_state_is_restored_after_an_exception_inside_train_step():
    from leadline.lookahead.rate import measure_first_step

    toy = Regression(seed=2)
    # a used optimizer with state, a gradient in place, a changed lr: all must come back
    toy.opt.zero_grad()
    toy.train_step(5)
    toy.opt.step()
    toy.train_step(6)
    toy.opt.param_groups[0]["lr"] = 0.123
    before = toy.state()
    toy.fail_at = 0
    with pytest.raises(RuntimeError, match="planted"):
        measure_first_step(toy.params, toy.opt, toy.train_step, toy.held_out)
    toy.assert_state(before)
    toy.fail_at = None
    fs = measure_first_step(toy.params, toy.opt, toy.train_step, toy.held_out)
    toy.assert_state(before)
    assert fs.found


def test_no_fall_is_reported_not_invented():
    from leadline.lookahead.rate import measure_first_step

    toy = Regression(seed=0)
    with torch.no_grad():
        toy.w.copy_(toy.w_star)
    toy.yh = toy.xh @ toy.w_star  # held-out rows the weights already fit exactly
    fs = measure_first_step(toy.params, toy.opt, toy.train_step, toy.held_out, start=1e-4, max_lr=1e-1)
    assert not fs.found and fs.alpha1 is None
    assert "not found" in fs.as_values()["alpha1"].source


def test_walk_does_not_read_rounding_as_a_fall():
    """A loss flat to bf16's grain at small steps, falling for real later: the walk passes the
    rounding (14.13 -> 14.1299 -> 14.1301) and brackets the real minimum near 1e-2."""
    import math

    from leadline.lookahead.rate.first_step import walk

    def f(lr):
        if lr < 1e-5:
            return 14.13 + (1e-4 if int(-math.log10(lr) * 10) % 2 else -1e-4)
        return 14.13 - 5 * math.exp(-((math.log10(lr) + 2) ** 2))

    from leadline.run.precision import BF16_RESOLUTION

    w = walk(f, 14.13, resolution=BF16_RESOLUTION)
    assert w.bracket is not None and 1e-3 < w.bracket[1] < 1e-1



def test_the_refinement_stops_where_its_inner_points_read_within_their_error():
    """Near the line's minimum the held-out rows disagree on which of two close steps is better
    (each row has its own minimum): the golden section stops once its inner points' paired
    difference is below its standard error, with fewer reads than rel_tol alone asks, and alpha1
    within that spacing of the line's minimum. Rows that all agree (every row the mean: a paired
    difference without spread) refine to rel_tol."""
    import math as m

    from leadline.lookahead.rate import measure_first_step

    toy = Regression(seed=1, dim=32)
    fs = measure_first_step(toy.params, toy.opt, toy.train_step, toy.held_out, rel_tol=0.01)
    assert "read within their standard error" in fs.stopped_because
    spacing = float(fs.stopped_because.split("inner points, x")[1].split(" ")[0])
    assert abs(m.log(fs.alpha1 / line_minimum(toy))) < m.log(spacing)
    ladder = [p for p in fs.walk if abs(m.log(p["lr"] / 1e-7, 4) - round(m.log(p["lr"] / 1e-7, 4))) < 1e-9]
    lo, hi = ladder[-3]["lr"], ladder[-1]["lr"]  # the walk's bracket: the two points either side of its lowest
    full = golden_section_log(lambda lr: (m.log(lr) - m.log(fs.alpha1)) ** 2, lo, hi, rel_tol=0.01)
    assert len(fs.walk) - len(ladder) < len(full)  # fewer refinements than rel_tol alone takes

    def agreeing() -> list[float]:
        rows = toy.held_out()
        return [sum(rows) / len(rows)] * len(rows)

    agree = measure_first_step(toy.params, toy.opt, toy.train_step, agreeing, rel_tol=0.01)
    assert "to 1%" in agree.stopped_because and len(agree.walk) > len(fs.walk)
    assert agree.alpha1 == pytest.approx(line_minimum(toy), rel=0.01)
