"""``make``'s installer (tools/install.py): uv finds the wheels pip would, from pip's own
configuration; pip where uv is not in the venv or ``UV=0``; every install in the Makefile goes
through it."""

from __future__ import annotations

import doctest
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def install():
    spec = importlib.util.spec_from_file_location("install_tool", ROOT / "tools" / "install.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_examples_run(install):
    result = doctest.testmod(install)
    assert result.attempted >= 3 and result.failed == 0


def test_pips_sources_become_uvs_with_the_install_section_and_the_environment_winning(install):
    listed = ("global.index-url='https://a/simple'\ninstall.index-url='https://b/simple'\n"
              "global.constraint='/etc/c.txt'\nglobal.cert='/etc/ssl/x.pem'\n:env:.find-links='/w1 /w2'")
    opts = install.pip_options(listed, {"PIP_EXTRA_INDEX_URL": "file:///e"})
    assert opts == {"constraint": ["/etc/c.txt"], "extra-index-url": ["file:///e"], "find-links": ["/w1", "/w2"],
                    "index-url": ["https://b/simple"]}
    args = install.uv_args(opts)
    assert args[:2] == ["--index-strategy", "unsafe-best-match"]
    assert args.count("--find-links") == 2 and "--cert" not in args


def test_uv_installs_only_where_it_is_beside_the_python_and_not_switched_off(install, tmp_path, monkeypatch):
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setattr(install.subprocess, "run", lambda *a, **k: type("Done", (), {"stdout": ""})())
    assert install.command(["x"], {})[:3] == [str(python), "-m", "pip"]  # no uv in the venv: pip
    (python.parent / "uv").write_text("")
    assert install.command(["x"], {})[:3] == [str(python.parent / "uv"), "pip", "install"]
    assert install.command(["x"], {"UV": "0"})[:3] == [str(python), "-m", "pip"]
    assert install.command(["-e", ".[hf]"], {"UV": "0"})[-2:] == ["-e", ".[hf]"]
    given = install.command(["--index-url", "https://t/cpu", "torch"], {"PIP_INDEX_URL": "https://pip/simple"})
    assert given.count("--index-url") == 1 and "https://pip/simple" not in given  # the caller's index alone


def test_every_install_in_the_makefile_goes_through_the_installer():
    recipe_lines = [line.strip() for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("\t")]
    installs = [line for line in recipe_lines if "$(INSTALL)" in line]
    assert len(installs) >= 4
    assert not [line for line in recipe_lines if re.search(r"pip install (?!-q uv)", line)]


def test_where_uv_fails_the_same_install_runs_with_pip(install, tmp_path, monkeypatch, capsys):
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    (python.parent / "uv").write_text("")
    monkeypatch.setattr(sys, "executable", str(python))
    ran = []

    def run(cmd, **kw):
        ran.append(cmd)
        return type("Done", (), {"stdout": "", "returncode": 2 if cmd[0].endswith("uv") else 0})()

    monkeypatch.setattr(install.subprocess, "run", run)
    assert install.main(["-e", ".[hf]"]) == 0
    installs = [c for c in ran if "install" in c]
    assert [c[0] for c in installs] == [str(python.parent / "uv"), str(python)]
    assert installs[1][1:4] == ["-m", "pip", "install"] and installs[1][-2:] == ["-e", ".[hf]"]
    assert "uv exited 2; installing the same with pip" in capsys.readouterr().err
