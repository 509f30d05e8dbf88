"""One real training step at a shape: the step the ramp, the fit pre-flight and B* measure.

A ramp is only as right as the step it runs. :class:`TrainingStep` puts in the peak what a
real run holds: the weights, the gradient buffers (present while the next micro-batch runs,
as in every accumulating run), the optimizer's state (present from the run's second step on),
the activations of ``rows`` rows at ``length`` tokens, and the optimizer's own temporaries.
It steps at learning rate 0, so the weights do not move, and hands the optimizer back fresh.

What any training step a ramp, the fit pre-flight or derive() runs may say of itself is named here
once, as :class:`typing.Protocol`: :class:`TimedStep` (the step at a shape, on its ``device``),
:class:`ModelStep` (it exposes its model) and :class:`ClosableStep` (it holds memory to give back).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from leadline.errors import InputError
from leadline.stats import median

if TYPE_CHECKING:
    import torch

    from leadline.memory_readings import Device


@runtime_checkable
class TimedStep(Protocol):
    """``step_fn(rows, length, repeats=1) -> StepTiming``: the real training step at a shape, on
    ``device``. A :class:`~leadline.memory.TrainingStep` also has its ``optimizer``."""

    device: Any

    def __call__(self, rows: int, length: int, repeats: int = 1) -> Any: ...


@runtime_checkable
class ModelStep(Protocol):
    """A training step that exposes the model it runs (an ``nn.Module``): the fit's estimate of
    a step's bytes reads the model's shapes."""

    model: Any


@runtime_checkable
class ClosableStep(Protocol):
    """A training step that holds memory to give back (a model built for one rank): ``close()``
    frees it."""

    def close(self) -> None: ...


def device_of(step_fn: object) -> Device | None:
    """The device a training step runs on, None where it does not say.

    Examples:
        >>> def step(rows, length, repeats=1): ...
        >>> step.device = "cpu"
        >>> device_of(step), device_of(lambda r, n, repeats=1: None)
        ('cpu', None)
    """
    return step_fn.device if isinstance(step_fn, TimedStep) else None



@dataclass(frozen=True)
class StepTiming:
    """What one :class:`TrainingStep` call timed, in seconds, at one shape.

    Attributes:
        rows, length: the shape.
        t_micro_seconds: median over the repeats of one forward+backward of ``rows`` rows.
        t_step_seconds: median over the repeats of the per-step work: ``per_step_loss``'s
            backward (when given) and the optimizer's update.
        micro_seconds, step_seconds: every repeat, in order.

    Examples:
        >>> timing = StepTiming(4, 512, 0.21, 0.03, [0.22, 0.21, 0.20], [0.03, 0.03, 0.04])
        >>> timing.t_micro_seconds, 4 / timing.t_micro_seconds  # rows per second, as the ramp reads it
        (0.21, 19.047619047619047)
    """

    rows: int
    length: int
    t_micro_seconds: float
    t_step_seconds: float
    micro_seconds: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)


class TrainingStep:
    """One real training step of ``rows`` rows at ``length`` tokens, measured and undone.

    Contract:
        ``loss_of(rows, length)`` returns the scalar loss of ``rows`` rows at ``length`` tokens:
        exactly what one forward pass of the real run computes and backpropagates (pad to
        ``length`` yourself). Put only that in it: a loss the run backpropagates once per
        optimizer step, after the micro-batches (an EWC penalty), goes in ``per_step_loss``
        (a no-argument callable); tensors that only sit on the device during the run (a Fisher,
        an anchor copy) go in ``resident``, so they are held while the step runs and counted.

        A call runs ``repeats`` consecutive steps, each: the gradient buffers of every trained
        parameter present (zeros) while the forward runs, one forward+backward (timed:
        ``t_micro``), then ``per_step_loss().backward()`` and ``optimizer.step()`` (timed
        together: ``t_step``). The optimizer state exists before the first forward (a step on
        zero gradients creates it), as it does from a real run's second step on. Every timed
        region is bracketed by device synchronisations; the times are the medians.

        The learning rate of every parameter group is 0 during the call, so the weights come
        back bit-identical (an update of ``lr * x`` with ``lr == 0`` adds exactly zero for any
        finite ``x``). On every exit path, exceptions included: the learning rates are
        restored, the gradients are set to None and the optimizer's state is cleared, the
        optimizer handed back fresh. The optimizer must be fresh when a call starts.

    Args:
        loss_of: ``(rows, length) -> loss`` as above.
        optimizer: the run's torch optimizer, fresh (no state).
        per_step_loss: ``() -> loss`` backpropagated once per step, after the micro-batches.
        resident: tensors held on the device for the duration of each call.

    Raises:
        InputError: the optimizer has state when a call starts; ``loss_of`` does not return a
            scalar tensor that requires grad; the loss is NaN or infinite (naming the shape).

    Examples:
        >>> import torch
        >>> model = torch.nn.Linear(4, 2)
        >>> before = model.weight.detach().clone()
        >>> opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        >>> step = TrainingStep(lambda rows, length: model(torch.ones(rows, length, 4)).pow(2).mean(), opt)
        >>> timing = step(2, 8, repeats=3)
        >>> timing.rows, timing.length, len(timing.micro_seconds), step.device
        (2, 8, 3, 'cpu')
        >>> torch.equal(model.weight, before), len(opt.state), opt.param_groups[0]["lr"], model.weight.grad
        (True, 0, 0.001, None)

        A loss that is not a scalar is refused with the shape; the rate is restored all the same.

        >>> TrainingStep(lambda rows, length: model(torch.ones(rows, 4)), opt)(2, 8)
        Traceback (most recent call last):
        ...
        leadline.errors.InputError: TrainingStep's loss_of must return a scalar loss tensor that requires grad, ...
        >>> opt.param_groups[0]["lr"]
        0.001
    """

    def __init__(
        self,
        loss_of: Callable[[int, int], Any],
        optimizer: Any,
        per_step_loss: Callable[[], Any] | None = None,
        resident: Sequence[Any] = (),
    ) -> None:
        if not callable(loss_of):
            raise InputError("TrainingStep's loss_of must be a callable (rows, length) -> loss; pass e.g. lambda b, n: "
                             "model(**batch(b, n)).loss")
        if not hasattr(optimizer, "param_groups") or not hasattr(optimizer, "step"):
            raise InputError(f"TrainingStep's optimizer must be a torch optimizer, got {type(optimizer).__name__}; "
                             "pass torch.optim.AdamW(trained_params, lr=...)")
        if per_step_loss is not None and not callable(per_step_loss):
            raise InputError("TrainingStep's per_step_loss must be a no-argument callable returning a loss, or None")
        self.loss_of = loss_of
        self.optimizer = optimizer
        self.per_step_loss = per_step_loss
        self.resident = tuple(resident)

    # ---- what the step touches ----------------------------------------------------------
    def params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    @property
    def device(self) -> str:
        """The device of the optimizer's first parameter (``"cuda:N"`` or ``"cpu"``)."""
        for p in self.params():
            dev = p.device
            return f"cuda:{dev.index if dev.index is not None else 0}" if dev.type == "cuda" else dev.type
        return "cpu"

    # ---- the step -----------------------------------------------------------------------
    def __call__(self, rows: int, length: int, repeats: int = 1) -> StepTiming:
        """Run ``repeats`` real steps of ``rows`` rows at ``length`` tokens; see the class contract."""
        import torch

        rows, length, repeats = int(rows), int(length), int(repeats)
        if rows < 1 or length < 1 or repeats < 1:
            raise InputError(f"a training step needs rows >= 1, length >= 1 and repeats >= 1, got rows={rows}, "
                             f"length={length}, repeats={repeats}")
        opt = self.optimizer
        if len(opt.state) > 0:
            raise InputError("TrainingStep needs a fresh optimizer (no state yet); create it anew, or measure before "
                             "the run's first step")
        params = [p for p in self.params() if p.requires_grad]
        saved_lrs = [g["lr"] for g in opt.param_groups]
        sync = _synchronizer(self.device)
        micro: list[float] = []
        stepped: list[float] = []
        try:
            for g in opt.param_groups:
                g["lr"] = _zero_like(g["lr"])
            with torch.no_grad():
                for p in params:
                    p.grad = torch.zeros_like(p)
            opt.step()  # creates the optimizer state on zero gradients, at lr 0
            for _ in range(repeats):
                with torch.no_grad():
                    for p in params:
                        if p.grad is None:
                            p.grad = torch.zeros_like(p)
                        else:
                            p.grad.zero_()
                sync()
                t0 = time.perf_counter()
                loss = self.loss_of(rows, length)
                _check_loss(loss, rows, length, "loss_of")
                loss.backward()
                sync()
                t1 = time.perf_counter()
                _check_finite(loss, rows, length, "loss_of")
                del loss
                if self.per_step_loss is not None:
                    extra = self.per_step_loss()
                    _check_loss(extra, rows, length, "per_step_loss")
                    extra.backward()
                    del extra
                opt.step()
                sync()
                t2 = time.perf_counter()
                micro.append(t1 - t0)
                stepped.append(t2 - t1)
        finally:
            opt.zero_grad(set_to_none=True)
            opt.state.clear()
            for g, lr in zip(opt.param_groups, saved_lrs):
                g["lr"] = lr
        return StepTiming(rows, length, median(micro), median(stepped), micro, stepped)


def _zero_like(lr: Any) -> Any:
    """0 of the learning rate's own type: a tensor rate (capturable optimizers) stays a tensor."""
    if hasattr(lr, "detach"):
        return lr.detach().clone().zero_()
    return 0.0


def _synchronizer(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        import torch

        index = int(device.split(":")[1]) if ":" in device else None

        def sync() -> None:
            torch.cuda.synchronize(index)

        return sync
    return lambda: None


def _check_loss(loss: Any, rows: int, length: int, what: str) -> None:
    if not hasattr(loss, "backward") or getattr(loss, "ndim", 1) != 0 or not getattr(loss, "requires_grad", False):
        raise InputError(
            f"TrainingStep's {what} must return a scalar loss tensor that requires grad, got "
            f"{type(loss).__name__} at {rows} rows x {length} tokens; return the loss the run backpropagates"
        )


def _check_finite(loss: Any, rows: int, length: int, what: str) -> None:
    value = float(loss.detach())
    if value != value or value in (float("inf"), float("-inf")):
        raise InputError(f"the loss from {what} is {value} at {rows} rows x {length} tokens in the memory step; check "
                         "those rows and the model's dtype")
