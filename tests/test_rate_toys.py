"""Toys with known answers for the rate phases, and the checks that the toys are what they claim.

:class:`Regression`: y = x . w* + noise with x ~ N(0, I); a linear model trained by Adam on
``rows`` fresh rows a step (the same rows for the same step). Its expected loss is exact,
E[(x . w - y)^2] = ||w - w*||^2 + noise^2, so the best constant rate over T steps is known by
sweeping it on that formula; the held-out rows are fixed draws.
"""

from __future__ import annotations

import math
import random

import pytest

torch = pytest.importorskip("torch")


class Regression:
    def __init__(self, dim: int = 8, rows: int = 8, noise: float = 0.1, held_out_rows: int = 256,
                 steps: int = 512, seed: int = 0, lr: float = 1e-3, dropout: float = 0.0, scale: float = 0.1) -> None:
        g = torch.Generator().manual_seed(seed)
        self.w_star = scale * torch.randn(dim, generator=g)
        self.noise = noise
        self.xs = torch.randn(steps, rows, dim, generator=g)
        self.ys = self.xs @ self.w_star + noise * torch.randn(steps, rows, generator=g)
        self.xh = torch.randn(held_out_rows, dim, generator=g)
        self.yh = self.xh @ self.w_star + noise * torch.randn(held_out_rows, generator=g)
        self.w = torch.nn.Parameter(torch.zeros(dim))
        self.params = [self.w]
        self.opt = torch.optim.Adam(self.params, lr=lr)
        self.dropout = dropout
        self.calls: list[int] = []
        self.spike: set[int] = set()
        self.fail_at: int | None = None

    def train_step(self, step: int) -> float:
        if self.fail_at is not None and step == self.fail_at:
            raise RuntimeError("planted failure inside train_step")
        self.calls.append(step)
        x, y = self.xs[step % len(self.xs)], self.ys[step % len(self.ys)]
        if step in self.spike:
            y = -20.0 * y  # a planted loss spike: targets that pull the weights far away
        if self.dropout:
            x = torch.nn.functional.dropout(x, self.dropout)
        loss = ((x @ self.w - y) ** 2).mean()
        loss.backward()
        return float(loss.detach())

    def held_out(self) -> list[float]:
        with torch.no_grad():
            return ((self.xh @ self.w - self.yh) ** 2).tolist()

    def expected_loss(self) -> float:
        with torch.no_grad():
            return float(((self.w - self.w_star) ** 2).sum()) + self.noise**2

    def state(self) -> dict:
        """Everything a phase must leave as it found it."""
        return {
            "w": self.w.detach().clone(),
            "grad": None if self.w.grad is None else self.w.grad.clone(),
            "opt": {k: (v.clone() if torch.is_tensor(v) else v) for k, v in self.opt.state.get(self.w, {}).items()},
            "groups": [{k: v for k, v in g.items() if k != "params"} for g in self.opt.param_groups],
            "rng": torch.get_rng_state().clone(),
            "py_rng": random.getstate(),
        }

    def assert_state(self, before: dict) -> None:
        after = self.state()
        assert torch.equal(after["w"], before["w"]), "weights changed"
        assert (after["grad"] is None) == (before["grad"] is None)
        if before["grad"] is not None:
            assert torch.equal(after["grad"], before["grad"])
        assert after["opt"].keys() == before["opt"].keys()
        for k, v in before["opt"].items():
            assert torch.equal(after["opt"][k], v) if torch.is_tensor(v) else after["opt"][k] == v
        assert after["groups"] == before["groups"]
        assert torch.equal(after["rng"], before["rng"])
        assert after["py_rng"] == before["py_rng"]


def constant_rate_loss(seed: int, lr: float, steps: int, alpha1: float | None = None, warmup: int = 10, **kw) -> float:
    """Expected loss after ``steps`` Adam steps at a constant rate (warmup from alpha1 if given)."""
    from leadline.lookahead.rate.warmup import warmup_lr

    toy = Regression(seed=seed, **kw)
    for t in range(steps):
        for g in toy.opt.param_groups:
            g["lr"] = warmup_lr(t, lr, alpha1, warmup if alpha1 else 0)
        toy.opt.zero_grad(set_to_none=True)
        toy.train_step(t)
        toy.opt.step()
    return toy.expected_loss()


def best_constant_rate(seed: int, steps: int, alpha1: float | None = None, **kw) -> float:
    """The known answer: the best constant rate over ``steps`` on the exact expected loss
    (a sweep of 25 rates, 2^(1/4) apart)."""
    rates = [1e-4 * 2 ** (k / 4) for k in range(40)]
    return min(rates, key=lambda r: constant_rate_loss(seed, r, steps, alpha1, **kw))


def test_the_toy_has_an_interior_best_rate():
    steps = 64
    best = best_constant_rate(0, steps)
    assert 2e-4 < best < 0.05
    # too low and too high are both clearly worse
    assert constant_rate_loss(0, best / 8, steps) > 1.5 * constant_rate_loss(0, best, steps)
    assert constant_rate_loss(0, best * 8, steps) > 1.5 * constant_rate_loss(0, best, steps)


def test_expected_loss_formula_matches_many_rows():
    toy = Regression(held_out_rows=20000, seed=3)
    with torch.no_grad():
        toy.w.add_(0.3)
    emp = sum(toy.held_out()) / 20000
    assert emp == pytest.approx(toy.expected_loss(), rel=0.05)
    assert math.isfinite(emp)
