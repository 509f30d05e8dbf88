"""The model put back as the run found it (:func:`leadline.run.restore.as_found`) and the RNG
streams captured in one place (:mod:`leadline.rng`): the state checked after an exception, and no
module but leadline.rng reading an RNG state itself."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

SRC = Path(__file__).resolve().parent.parent / "src" / "leadline"


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 1)).eval()


def _step(model):
    model.train()
    model(torch.randn(2, 3)).sum().backward()  # draws from torch's stream (the input, the dropout)
    return random.random()


def test_the_rng_streams_come_back_drawn_for_drawn():
    import numpy as np

    from leadline.rng import capture_rng, restore_rng

    state = capture_rng()
    first = (torch.rand(3), random.random(), np.random.rand())
    restore_rng(state)
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(first[0], again[0]) and first[1:] == again[1:]


@pytest.mark.parametrize("keep", [False, True])
def test_an_error_puts_the_model_back_whether_or_not_the_block_keeps_its_changes(keep):
    from leadline.run.restore import as_found

    model, undone = _model(), []
    torch_state, python_state = torch.get_rng_state(), random.getstate()
    with pytest.raises(KeyboardInterrupt), as_found(model, keep=keep) as found:
        found.callback(lambda: undone.append("weights"))
        _step(model)
        raise KeyboardInterrupt
    assert undone == ["weights"] and not model.training
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), torch_state) and random.getstate() == python_state


def test_a_block_that_keeps_its_changes_keeps_them_where_it_ends_without_an_error():
    from leadline.run.restore import as_found

    model, undone = _model(), []
    with as_found(model, keep=True) as found:
        found.callback(lambda: undone.append("weights"))
        _step(model)
    assert not undone and model.training and all(p.grad is not None for p in model.parameters())


def test_a_block_that_names_the_mode_alone_puts_back_the_mode_alone():
    from leadline.run.restore import as_found

    model = _model()
    with as_found(model, "mode"):
        _step(model)
        after = torch.get_rng_state()
    assert not model.training and all(p.grad is not None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), after)  # the stream goes on from the block's draws


READS = {"get_rng_state", "get_rng_state_all", "getstate", "get_state"}
"""The calls that read an RNG state: torch's (CPU and CUDA), Python's and NumPy's."""


def _reads_rng(source: str) -> list[int]:
    """The lines of ``source`` that call one of :data:`READS` (docstrings and comments not counted)."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in READS]


def test_no_module_but_leadline_rng_reads_an_rng_state():
    reading = {str(p.relative_to(SRC)): _reads_rng(p.read_text(encoding="utf-8")) for p in SRC.rglob("*.py")}
    assert reading["rng.py"], "leadline.rng reads the RNG states (the check found its calls)"
    others = {path: lines for path, lines in reading.items() if lines and path != "rng.py"}
    assert not others, f"RNG states read outside leadline.rng (use capture_rng): {others}"


def test_the_rng_check_finds_a_call_and_ignores_a_docstring():
    assert _reads_rng('def f():\n    """torch.get_rng_state()"""\n    return random.getstate()\n') == [3]
