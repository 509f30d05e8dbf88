"""The one context manager that puts the model back as the run found it: its train/eval mode, its
gradients and the RNG streams (:mod:`leadline.rng`), and whatever a block registers to undo
(the race's weights, :meth:`leadline.run.opening.Opening.rewind`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal

from leadline.rng import capture_rng, restore_rng

if TYPE_CHECKING:
    import torch

Part = Literal["mode", "grads", "rng"]
PARTS: tuple[Part, ...] = ("mode", "grads", "rng")


class Found:
    """What :func:`as_found` put back on exit: the model's mode, the RNG states, and the undo
    steps a block registered (run last registered, first)."""

    def __init__(self, model: torch.nn.Module, parts: tuple[Part, ...]) -> None:
        self.model, self.parts = model, parts
        self.training = bool(model.training)
        self.rng = capture_rng() if "rng" in parts else None
        self.undo: list[Callable[[], None]] = []

    def callback(self, undo: Callable[[], None]) -> None:
        """``undo()`` runs first when the model is put back (the block's own state: the race's weights)."""
        self.undo.append(undo)

    def put_back(self) -> None:
        while self.undo:
            self.undo.pop()()
        if "grads" in self.parts:
            self.model.zero_grad(set_to_none=True)
        if "mode" in self.parts:
            self.model.train(self.training)
        if self.rng is not None:
            restore_rng(self.rng)


@contextmanager
def as_found(model: torch.nn.Module, *parts: Part, keep: bool = False) -> Iterator[Found]:
    """The model as the block found it, on every exit path: its train/eval mode (``"mode"``), its
    gradients freed (``"grads"``: a block that took steps leaves none), the RNG streams where they
    stood (``"rng"``), and the undo steps the block registered (:meth:`Found.callback`). No
    ``parts``: all three. ``keep``: where the block ends without an error its changes stay (the
    run goes on from the race's winner); an error puts everything back all the same.

    Examples:
        >>> import torch
        >>> model = torch.nn.Linear(2, 1).eval()
        >>> with as_found(model):
        ...     _ = model.train()
        ...     model(torch.ones(1, 2)).sum().backward()
        ...     drawn = torch.rand(1)
        >>> model.training, model.weight.grad, torch.equal(torch.rand(1), drawn)
        (False, None, True)
        >>> with as_found(model, "mode", keep=True):
        ...     _ = model.train()
        >>> model.training
        True
        >>> try:
        ...     with as_found(model, keep=True) as found:
        ...         found.callback(lambda: print("undone"))
        ...         _ = model.eval()
        ...         raise KeyboardInterrupt
        ... except KeyboardInterrupt:
        ...     print("put back in train mode:", model.training)
        undone
        put back in train mode: True
    """
    found = Found(model, parts or PARTS)
    try:
        yield found
    except BaseException:
        found.put_back()
        raise
    if not keep:
        found.put_back()
