"""What a plan was trained on: the data, as a plain dict (:func:`describe_data`), and its content
hash (:func:`content_hash`). No torch.

The machine a measurement ran on is :func:`leadline.measure.machine.describe_machine`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any


def content_hash(path_or_rows: str | os.PathLike[str] | Iterable[Mapping[str, object]]) -> str:
    """sha256 of a file's bytes, or of the rows as canonical JSON (sorted keys, one per line).

    Examples:
        >>> import hashlib, os, tempfile
        >>> content_hash([]) == hashlib.sha256(b"").hexdigest()
        True
        >>> content_hash([{"b": 2, "a": 1}]) == hashlib.sha256(b'{"a": 1, "b": 2}\\n').hexdigest()
        True
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     path = os.path.join(folder, "rows.txt")
        ...     with open(path, "wb") as f:
        ...         _ = f.write(b"abc")
        ...     content_hash(path)
        'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad'
    """
    h = hashlib.sha256()
    if isinstance(path_or_rows, (str, os.PathLike)):
        with open(path_or_rows, "rb") as f:
            for chunk in iter(lambda: f.read(8 << 20), b""):  # 8 MiB at a time
                h.update(chunk)
    else:
        for row in path_or_rows:
            h.update(json.dumps(row, sort_keys=True, default=str).encode())
            h.update(b"\n")
    return h.hexdigest()


def describe_data(path_or_rows: str | os.PathLike[str] | Iterable[Mapping[str, object]],
                  rows: int | None = None) -> dict[str, Any]:
    """The data's path (None: it came in memory), its row count and its :func:`content_hash`.

    A path's row count is ``rows`` as given (the file is hashed, not parsed); rows in memory
    are counted unless ``rows`` says otherwise.

    Examples:
        >>> d = describe_data([{"text": "hi"}, {"text": "yo"}])
        >>> d["path"], d["rows"], d["sha256"][:12]
        (None, 2, '408c2de512d3')
    """
    if isinstance(path_or_rows, (str, os.PathLike)):
        return {"path": str(path_or_rows), "rows": rows, "sha256": content_hash(path_or_rows)}
    rows_list = list(path_or_rows)
    return {"path": None, "rows": len(rows_list) if rows is None else rows, "sha256": content_hash(rows_list)}
