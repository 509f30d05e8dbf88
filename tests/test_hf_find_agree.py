"""find_batch_size's figure marks the number suggestion() returns, and run_micro_batch() reads the
micro-batch `leadline run` trains at from the same ramp, by the run's own rule."""

from __future__ import annotations

import pytest

from leadline.hf import FoundBatchSize
from leadline.plan import Plan, Value


def _found(rows_fit: int, micro_batch: int, device: str) -> FoundBatchSize:
    if device == "cpu":
        rungs = [{"rows": r, "rows_per_second": v} for r, v in ((1, 10.0), (2, 18.0), (4, 30.0), (8, 41.0), (16, 42.0))]
        ramp = {"plot": "ramp", "rule": "throughput", "device": device, "rungs": rungs}
    else:
        rungs = [{"rows": r, "peak_bytes": r * 2**30, "verdict": "fits" if r <= rows_fit else "oom"} for r in (1, 2, 4, 8, 16)]
        ramp = {"plot": "ramp", "rule": "memory", "device": device, "budget_bytes": 12 * 2**30, "rungs": rungs}
    plan = Plan()
    plan.set("rows_fit", Value(rows_fit, "measured", "the memory ramp", evidence=ramp, unit="rows"))
    plan.set("micro_batch", Value(micro_batch, "derived", "the rows the step needs, at most rows_fit", unit="rows"))
    return FoundBatchSize(plan, "micro_batch", ("rows_fit", "micro_batch"))


def test_the_ramps_figure_marks_the_suggestion_not_rows_fit(tmp_path):
    pytest.importorskip("matplotlib")
    found = _found(rows_fit=8, micro_batch=5, device="cpu")
    svg = found.plot(tmp_path / "ramp.svg")
    assert found.suggestion() == 5
    assert "chosen: 5 rows" in svg and "chosen: 8 rows" not in svg
    assert (tmp_path / "ramp.svg").read_text() == svg


@pytest.mark.parametrize("rows_fit, rows_per_step, device, run", [
    (40, 16, "cuda:0", 16),  # the whole step runs
    (12, 16, "cuda:0", 8),   # 16 does not fit: halved once
    (5, 16, "cuda:0", 4),
    (1, 16, "cuda:0", 1),
    (5, 12, "cuda:0", 3),    # 12 -> 6 -> 3: the divisors the run halves through
    (8, 16, "cpu", 16),      # off a CUDA card the run takes the whole step
])
def test_run_micro_batch_follows_the_runs_rule(rows_fit, rows_per_step, device, run):
    found = _found(rows_fit=rows_fit, micro_batch=min(rows_fit, 5), device=device)
    assert found.run_micro_batch(rows_per_step) == run
    assert found.run_micro_batch(rows_per_step) <= max(rows_fit, rows_per_step if device == "cpu" else 0)


def test_run_micro_batch_matches_the_runs_halving():
    """The same sequence the run's micro-batch fit walks on a card that holds ``fit`` rows."""
    from types import SimpleNamespace

    import torch

    from leadline.run.fit import micro_batch

    class Loss:
        def __init__(self, rows, fit):
            self.rows, self.fit = rows, fit

        def backward(self):
            if self.rows > self.fit:
                raise torch.OutOfMemoryError("no room")

    for fit in (1, 3, 5, 8, 11, 16, 20):
        model = SimpleNamespace(zero_grad=lambda set_to_none=True: None)
        task = SimpleNamespace(device="cuda:0", seq_len=8, model=model, loss_of=lambda b, n, fit=fit: Loss(b, fit))
        empty = torch.cuda.empty_cache
        torch.cuda.empty_cache = lambda: None
        try:
            ran, _ = micro_batch(task, 16)
        finally:
            torch.cuda.empty_cache = empty
        assert _found(rows_fit=fit, micro_batch=1, device="cuda:0").run_micro_batch(16) == ran, fit
