"""``make``'s installer: ``uv pip install`` where uv is in the virtual environment, else pip.

uv installs a fresh environment several times faster than pip, and must find the same wheels pip
would: the index, the extra indexes, the find-links folders and the constraints pip reads from its
configuration files and its ``PIP_*`` variables. uv takes the best version across every index, as
pip does (``--index-strategy unsafe-best-match``; uv's default stops at the first index that has a
package). ``UV=0`` (make's variable, passed on in the environment) installs with pip regardless.

    .venv/bin/python tools/install.py -e '.[hf]'     # what `make` runs, with the venv's Python
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}
"""pip's option -> uv's (each takes one value; pip's may list several, split on white space)."""


def pip_options(config_list: str, environ: dict[str, str]) -> dict[str, list[str]]:
    """pip's sources: ``pip config list`` lines (``global.find-links='/opt/wheels'``; the ``install.``
    section over ``global.``) and then ``PIP_*`` variables, which override both.

        >>> pip_options("global.find-links='/opt/wheels'\\nglobal.extra-index-url='file:///a file:///b'", {})
        {'extra-index-url': ['file:///a', 'file:///b'], 'find-links': ['/opt/wheels']}
        >>> pip_options("global.index-url='https://x'", {"PIP_INDEX_URL": "https://y"})
        {'index-url': ['https://y']}
    """
    found: dict[str, dict[str, str]] = {}
    for line in config_list.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.strip().partition(".")
        if name in FLAGS and section in ("global", "install", ":env:"):
            found.setdefault(name, {})[section] = value.strip().strip("'\"")
    chosen = {name: by.get(":env:", by.get("install", by.get("global", ""))) for name, by in found.items()}
    for name in FLAGS:
        env = environ.get("PIP_" + name.upper().replace("-", "_"))
        if env is not None:
            chosen[name] = env
    return {name: value.split() for name, value in sorted(chosen.items()) if value.split()}


def uv_args(options: dict[str, list[str]]) -> list[str]:
    """uv's arguments for pip's sources.

        >>> uv_args({"find-links": ["/w"], "extra-index-url": ["file:///a"]})
        ['--index-strategy', 'unsafe-best-match', '--find-links', '/w', '--extra-index-url', 'file:///a']
    """
    out = ["--index-strategy", "unsafe-best-match"]
    for name, values in options.items():
        for v in values:
            out += [FLAGS[name], v]
    return out


def command(args: list[str], environ: dict[str, str]) -> list[str]:
    """The install command for ``args``: uv beside this Python unless ``UV=0``, else pip."""
    uv = Path(sys.executable).with_name("uv")
    if environ.get("UV", "1") == "1" and uv.is_file():
        listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                                text=True).stdout
        options = pip_options(listed, environ)
        if "--index-url" in args:  # the caller's index (make's TORCH_FLAGS) replaces pip's: uv takes one
            options.pop("index-url", None)
        return [str(uv), "pip", "install", "-q", "--python", sys.executable, *uv_args(options), *args]
    # --no-compile: no .pyc for every file of torch and transformers at install (over half pip's
    # time on 2 cores); Python compiles the modules the demo imports as it imports them.
    return [sys.executable, "-m", "pip", "install", "-q", "--no-compile", *args]


def main(argv: list[str] | None = None) -> int:
    """Install; where uv fails, say so in one line and install the same with pip."""
    args = list(sys.argv[1:] if argv is None else argv)
    cmd = command(args, dict(os.environ))
    rc = subprocess.run(cmd).returncode
    if rc != 0 and cmd[1:3] == ["pip", "install"]:
        print(f"uv exited {rc}; installing the same with pip", file=sys.stderr)
        rc = subprocess.run(command(args, {**os.environ, "UV": "0"})).returncode
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
