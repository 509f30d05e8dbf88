"""The hooks behind :class:`~leadline.memory.cap.SpillWatch`: a call before every outermost
forward and after every optimizer step, for one slow-path module call per forward.

A global module forward pre-hook makes every module call in the process leave
``Module._call_impl``'s fast path (a Python call per module; ``docs/memory.md``). So the global
hook only discovers: the first call of a module not seen before is an outermost call; it gets a
forward pre-hook of its own, and its submodules are marked inner. The first optimizer step
removes the global hook (every model a training step uses has been called by then); from there
only the outermost modules' own hooks and the step hook run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class _Inert:
    """What a copy of a hooked module gets (``deepcopy``, pickling): a hook that does nothing."""

    def __call__(self, module: Any, args: Any) -> None:
        return None


class _OnOutermost:
    """An outermost module's forward pre-hook: calls back, returns None (the inputs unchanged)."""

    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback

    def __call__(self, module: Any, args: Any) -> None:
        self.callback()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Inert, ())  # a copied or saved model must not hold (or copy) the watch


class OutermostHooks:
    """Calls ``on_forward()`` before every outermost forward and ``on_step()`` after every
    optimizer step, until :meth:`remove`.

    Args:
        on_forward, on_step: the callbacks; they must not raise (a hook's error breaks the
            user's step).
        on_error: called when discovering a module fails (that forward still calls ``on_forward``).

    A module first called after the first optimizer step is not discovered; it is seen only
    through the step hook, or through an outermost module it calls.

    Examples:
        Two forwards of a model of two layers: one call each, none for the inner layers.

        >>> import torch
        >>> calls = []
        >>> hooks = OutermostHooks(lambda: calls.append("forward"), lambda: calls.append("step"), lambda: None)
        >>> hooks.install()
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        >>> _ = model(torch.ones(1, 4)), model(torch.ones(1, 4))
        >>> hooks.remove()
        >>> _ = model(torch.ones(1, 4))
        >>> calls, hooks.installed
        (['forward', 'forward'], False)
    """

    def __init__(self, on_forward: Callable[[], None], on_step: Callable[[], None],
                 on_error: Callable[[], None]) -> None:
        self.on_forward = on_forward
        self.on_step = on_step
        self.on_error = on_error
        self._discovery: Any = None  # the global forward pre-hook's handle, until the first step
        self._step: Any = None
        self._outermost: dict[int, Any] = {}  # id(module) -> the handle of its own pre-hook
        self._seen: set[int] = set()

    @property
    def installed(self) -> bool:
        return self._step is not None

    def install(self) -> None:
        """Register the global step hook and the discovery hook (idempotent; fresh discovery)."""
        if self._step is not None:
            return
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook

        try:
            self._step = register_optimizer_step_post_hook(self._after_step)
            self._discovery = register_module_forward_pre_hook(self._discover)
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        """Remove every hook: global, per-module, step. Safe to call twice."""
        handles = [self._discovery, self._step, *self._outermost.values()]
        self._discovery = self._step = None
        self._outermost = {}
        self._seen = set()
        for h in handles:
            if h is not None:
                h.remove()

    def _discover(self, module: Any, args: Any) -> None:
        if id(module) in self._seen:
            return
        try:
            inner = [id(m) for m in module.modules()]
            for i in inner:  # a model hooked before and now called inside this one is inner now
                handle = self._outermost.pop(i, None)
                if handle is not None:
                    handle.remove()
            self._seen.update(inner)
            self._outermost[id(module)] = module.register_forward_pre_hook(_OnOutermost(self.on_forward))
        except Exception:  # never break the user's forward
            self.on_error()
        self.on_forward()  # its own hook, registered inside this call, first runs on the next one

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._discovery is not None:
            self._discovery.remove()
            self._discovery = None
            self._seen = set()
        self.on_step()
