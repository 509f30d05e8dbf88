"""A GGUF file converted once: the Hugging Face folder its conversion wrote, kept in leadline's
cache and read by every later load instead of the GGUF.

Converting a GGUF (the tokenizer rebuilt from its vocabulary, every weight dequantized) costs
tens of seconds on a 135M model; reading the folder it gives costs about a second. The folder
is keyed by the file's size and the sha256 of its whole content (``gguf/<size>-<sha256>``), so
a file changed in place, or the same file under another name, finds its own folder. It is
written into a temporary folder beside it and renamed into place with a completion mark
(``leadline-gguf.json``: the file's size, hash and the folder's files with their sizes) written
last, so a conversion cut short never leaves a folder that looks whole; a folder without its
mark, with another file's mark or with a file missing or of another size is converted again.

The cache is ``$LEADLINE_CACHE``, else ``$XDG_CACHE_HOME/leadline``, else ``~/.cache/leadline``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from leadline.errors import InputError

MARK = "leadline-gguf.json"
PARTIAL = ".partial-"  # a conversion under way (or cut short) in the cache
STALE_SECONDS = 24 * 3600  # a partial folder older than this was left by a conversion that was cut


def cache_root() -> Path:
    """leadline's cache folder: ``$LEADLINE_CACHE``, else ``$XDG_CACHE_HOME/leadline``, else
    ``~/.cache/leadline``.

    Examples:
        >>> import os
        >>> before = os.environ.get("LEADLINE_CACHE")
        >>> os.environ["LEADLINE_CACHE"] = "/scratch/leadline"
        >>> str(cache_root())
        '/scratch/leadline'
        >>> _ = os.environ.pop("LEADLINE_CACHE") if before is None else os.environ.update(LEADLINE_CACHE=before)
    """
    given = os.environ.get("LEADLINE_CACHE")
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "leadline"


@dataclass(frozen=True)
class Converted:
    """A GGUF file's folder in the cache: the file, its size and sha256, the folder, and whether
    this call wrote it (``wrote``: converted now, not found whole)."""

    gguf: Path
    size: int
    sha256: str
    folder: Path
    wrote: bool

    def note(self) -> str:
        """What a command says the first time it writes the folder."""
        return f"converted {self.gguf} once into {self.folder}; later runs load it from there"


def converted_folder(gguf: str | os.PathLike[str], convert: Callable[[Path, Path], None],
                     root: str | os.PathLike[str] | None = None) -> Converted:
    """The cache's folder for ``gguf``, made by ``convert(gguf, into)`` where it is not there whole
    (``convert`` writes a Hugging Face folder into the empty folder ``into``).

    Examples:
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> gguf = Path(tmp.name) / "m.gguf"
        >>> _ = gguf.write_bytes(b"GGUF" + bytes(60))
        >>> calls = []
        >>> def convert(src, into):
        ...     calls.append(src)
        ...     _ = (into / "config.json").write_text("{}")
        >>> first = converted_folder(gguf, convert, root=tmp.name)
        >>> second = converted_folder(gguf, convert, root=tmp.name)
        >>> first.wrote, second.wrote, len(calls), first.folder == second.folder
        (True, False, 1, True)
        >>> first.folder.name == f"64-{first.sha256}", sorted(p.name for p in first.folder.iterdir())
        (True, ['config.json', 'leadline-gguf.json'])
        >>> tmp.cleanup()
    """
    from leadline.provenance import content_hash

    gguf = Path(gguf)
    size = gguf.stat().st_size
    sha256 = content_hash(gguf)
    parent = Path(root) if root is not None else cache_root()
    folder = parent / "gguf" / f"{size}-{sha256}"
    if is_whole(folder, size, sha256):
        return Converted(gguf, size, sha256, folder, wrote=False)
    partial = folder.parent / f"{PARTIAL}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(folder.parent)
        partial.mkdir()  # the umask's mode, as the folders save_pretrained makes
        convert(gguf, partial)
        _write_mark(partial, gguf, size, sha256)
        _put_in_place(partial, folder, size, sha256)
    except OSError as e:  # what convert reads is its own sentence: an OSError here is a write
        raise InputError(f"cannot write the conversion of {gguf} into {parent} ({str(e).splitlines()[0][:160]}); "
                         "free space there, or set LEADLINE_CACHE to a writable folder") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # a failed or interrupted conversion leaves nothing
    return Converted(gguf, size, sha256, folder, wrote=True)


def is_whole(folder: Path, size: int, sha256: str) -> bool:
    """Whether ``folder`` is a conversion of the file of ``size`` bytes and ``sha256`` that ended:
    its mark names that file, and every file the mark lists is there at the size it lists."""
    try:
        mark = json.loads((folder / MARK).read_text(encoding="utf-8"))
        files = mark["files"]
        return (mark["size"] == size and mark["sha256"] == sha256 and bool(files)
                and all((folder / name).stat().st_size == n for name, n in files.items()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _write_mark(folder: Path, gguf: Path, size: int, sha256: str) -> None:
    """The completion mark: the file converted and the folder's files with their sizes."""
    from leadline._io import write_atomic
    from leadline._version import __version__

    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file() and p.name != MARK}
    mark = {"gguf": str(gguf), "size": size, "sha256": sha256, "files": files, "leadline": __version__,
            "transformers": _version_of("transformers")}
    write_atomic(folder / MARK, json.dumps(mark, indent=1))


def _put_in_place(partial: Path, folder: Path, size: int, sha256: str) -> None:
    """``partial`` renamed to ``folder``; a folder already there that is not whole is set aside and
    removed first, one that another process finished meanwhile is kept (and ``partial`` dropped)."""
    if folder.exists() or folder.is_symlink():
        if is_whole(folder, size, sha256):
            return  # another process converted the same file meanwhile
        aside = folder.parent / f"{PARTIAL}old-{secrets.token_hex(4)}"
        os.rename(folder, aside)
        shutil.rmtree(aside, ignore_errors=True)
    try:
        os.rename(partial, folder)
    except OSError:
        if not is_whole(folder, size, sha256):  # not another process's whole folder: a real failure
            raise


def _remove_stale(parent: Path) -> None:
    """Partial folders of conversions cut short more than a day ago."""
    now = time.time()
    for p in parent.glob(f"{PARTIAL}*"):
        try:
            if now - p.stat().st_mtime > STALE_SECONDS:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            continue


def _version_of(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None
