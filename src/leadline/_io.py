"""Atomic writes: a reader never sees half a file, and a failed write leaves nothing behind.

The file written has the mode a plain ``open(path, "w")`` would give it: the mode of the file it
replaces, or for a new file ``0o666`` under the process's umask (``0644`` under the usual 022).
A path that is a symbolic link is written through: the link's target is replaced atomically and
the link stays a link.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    On any exception the temporary file is removed and ``path`` is untouched. Returns ``path``
    as given (a symbolic link's own path, not its target's).
    """
    given = Path(path)
    target = Path(os.path.realpath(given)) if given.is_symlink() else given
    folder = target.parent if str(target.parent) else Path(".")
    from leadline.errors import InputError

    if not folder.is_dir():
        raise InputError(f"cannot write {given}: the folder {folder} does not exist; create it or choose another path")
    if target.is_dir():
        raise InputError(f"cannot write {given}: it is a folder; pass a file path inside it, e.g. "
                         f"{given / 'plan.json'}")
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        os.chmod(tmp, file_mode(target))
        with os.fdopen(fd, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return given


@contextmanager
def modes_as_open(folder: str | os.PathLike[str]) -> Iterator[Path]:
    """The files written into ``folder`` inside the block left with the mode ``open(path, "w")``
    gives: a file that was there keeps its mode, a new one gets ``0o666`` under the umask. Some
    writers (safetensors) create their files ``0600`` whatever the umask; a saved model then
    reads as private beside its ``0644`` config.

    Examples:
        >>> import stat, tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     with modes_as_open(tmp) as folder:
        ...         fd = os.open(folder / "weights.bin", os.O_CREAT | os.O_WRONLY, 0o600)
        ...         os.close(fd)
        ...     stat.S_IMODE(os.stat(folder / "weights.bin").st_mode) == file_mode(folder / "new")
        True
    """
    folder = Path(folder)
    before = {f.name: file_mode(f) for f in folder.iterdir() if f.is_file()} if folder.is_dir() else {}
    try:
        yield folder
    finally:
        for f in (folder.iterdir() if folder.is_dir() else ()):
            if f.is_file() and not f.is_symlink():
                mode = before.get(f.name, 0o666 & ~_umask())
                if stat.S_IMODE(f.stat().st_mode) != mode:
                    os.chmod(f, mode)


def save_run(model: object, out: str | os.PathLike[str], record: dict) -> Path:
    """A trained model's adapter (PEFT) or weights, saved with ``save_pretrained``, and ``record``
    as ``run.json`` beside them, each file with the mode ``open()`` gives it
    (:func:`modes_as_open`). Returns the folder."""
    import json
    import warnings

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    absolute_base_paths(model)
    with warnings.catch_warnings(), modes_as_open(folder):  # safetensors writes its file 0600 whatever the umask
        # a base read from a .gguf file has no config.json beside it, and PEFT warns that it cannot check the
        # vocabulary: leadline never resizes it, so the warning only alarms
        warnings.filterwarnings("ignore", message="Could not find a config file", category=UserWarning)
        model.save_pretrained(folder)  # type: ignore[attr-defined]
    write_atomic(folder / "run.json", json.dumps(record, indent=1, default=str))
    return folder


def absolute_base_paths(model: object) -> None:
    """A PEFT model's ``base_model_name_or_path`` made absolute where it names a folder or file on
    this machine given by a relative path, so ``AutoPeftModelForCausalLM.from_pretrained(run_dir)``
    finds the base from any working directory (a hub id, which names no local path, is left as it is).

    Examples:
        >>> import types
        >>> cfg = types.SimpleNamespace(base_model_name_or_path=".")
        >>> absolute_base_paths(types.SimpleNamespace(peft_config={"default": cfg}))
        >>> cfg.base_model_name_or_path == os.getcwd()
        True
    """
    for cfg in (getattr(model, "peft_config", None) or {}).values():
        base = getattr(cfg, "base_model_name_or_path", None)
        if isinstance(base, str) and base and not os.path.isabs(base) and os.path.exists(base):
            cfg.base_model_name_or_path = os.path.abspath(base)


def file_mode(path: Path) -> int:
    """The permission bits ``open(path, "w")`` leaves ``path`` with: its own where it exists,
    else ``0o666`` under the umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask (read from /proc where it can be, so no thread sees it changed)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old
