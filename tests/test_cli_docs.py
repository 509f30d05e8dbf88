"""What the README and docs/cli.md say about the commands' flags is what the parsers hold: every
flag written beside a command exists in that command, and every default a help text states is
the parser's default."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from leadline.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = {"README.md": ROOT / "README.md", "docs/cli.md": ROOT / "docs" / "cli.md"}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
COMMAND = "|".join(COMMANDS)


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _flags(p: argparse.ArgumentParser) -> set[str]:
    return set(p._option_string_actions)


def _fenced(text: str) -> list[str]:
    """The fenced blocks without a language (the shell's), each as its text."""
    blocks, inside, lang, lines = [], False, "", []
    for line in text.splitlines():
        if line.startswith("```"):
            if inside and not lang:
                blocks.append("\n".join(lines) + "\n")
            inside, lang, lines = not inside, line[3:].strip(), []
        elif inside:
            lines.append(line)
    return blocks


def _mentions(text: str) -> list[tuple[str, str, str]]:
    """(command, flag, the text it was read from) for each flag written beside a command: in a
    shell line (``leadline CMD ...``, backslash lines joined, comments dropped) or in a code span
    (`` `CMD --flag` ``, `` `leadline CMD --flag` ``)."""
    found = []
    for block in _fenced(text):
        for line in block.replace("\\\n", " ").splitlines():
            shell = line.split("#")[0]
            for part in re.split(r"\||;|&&", shell):  # `leadline gpu | leadline disk ...`
                m = re.search(rf"\bleadline\s+({COMMAND})\b(.*)", part)
                if m:
                    found += [(m.group(1), f, line.strip()) for f in FLAG.findall(m.group(2))]
    for span in re.findall(r"`([^`\n]+)`", text):
        m = re.match(rf"\s*(?:leadline\s+)?({COMMAND})\b(.*)", span)
        if m:
            found += [(m.group(1), f, span) for f in FLAG.findall(m.group(2))]
    return found


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_every_flag_written_beside_a_command_is_that_commands(doc):
    parsers = _subparsers()
    mentions = _mentions(DOCS[doc].read_text())
    assert len(mentions) > 10  # the reader found the commands' lines
    wrong = [(cmd, flag, where) for cmd, flag, where in mentions if flag not in _flags(parsers[cmd])]
    assert not wrong, f"{doc} names flags their command does not have: {wrong}"


def test_the_one_meaning_table_names_flags_its_commands_have():
    """docs/cli.md's table: each row's flags exist in a command its last column names, and each
    command named has one of the row's flags (a row may map its flags to its commands one by one)."""
    parsers = _subparsers()
    text = DOCS["docs/cli.md"].read_text()
    table = text.split("## One meaning a flag", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in table.splitlines() if r.startswith("| `")]
    assert len(rows) >= 5
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        flags = FLAG.findall(cells[0])
        commands = [c for c in re.findall(r"`(\w+)(?: [^`]*)?`", cells[-1]) if c in parsers]
        assert commands, row
        for flag in flags:
            assert any(flag in _flags(parsers[c]) for c in commands), (flag, row)
        for cmd in commands:
            assert any(f in _flags(parsers[cmd]) for f in flags) or f"`{cmd} " in cells[0], (cmd, row)


def _stated_defaults(p: argparse.ArgumentParser) -> list[tuple[str, str, object]]:
    out = []
    for a in p._actions:
        if not a.help or a.help == argparse.SUPPRESS or not a.option_strings:
            continue
        text = a.help % {"default": a.default} if "%(default)" in a.help else a.help
        for stated in re.findall(r"\(default:? ([-+0-9.e]+)[;)]", text):
            out.append((a.option_strings[0], stated, a.default))
    return out


def test_every_default_a_help_text_states_is_the_parsers():
    checked = 0
    for command, p in _subparsers().items():
        for flag, stated, default in _stated_defaults(p):
            if default is None:  # a default applied later (e.g. only with --recipe), said in the help
                continue
            assert float(stated) == pytest.approx(float(default)), (command, flag, stated, default)
            checked += 1
    assert checked >= 5


def test_defaults_quoted_in_the_docs_match_the_parsers():
    """`--flag N` quoted with "default" beside it in README or docs/cli.md is the parser's default."""
    parsers = _subparsers()
    checked = 0
    for doc, path in DOCS.items():
        for cmd, flag, value in re.findall(rf"`(?:leadline )?({COMMAND})[^`]*?(--[a-z-]+) ([0-9.e-]+)` by default",
                                          path.read_text()):
            action = parsers[cmd]._option_string_actions[flag]
            assert float(value) == pytest.approx(float(action.default)), (doc, cmd, flag, value)
            checked += 1
    shell = {"--lora-rank": 16, "--decide-share": 0.2}  # the README's shell lines show these as the defaults
    for flag, value in shell.items():
        assert f"{flag} {value:g}" in DOCS["README.md"].read_text()
        assert parsers["run"]._option_string_actions[flag].default == pytest.approx(value)
        checked += 1
    assert checked >= 2


def test_fit_help_shows_micro_batch_required():
    usage = _subparsers()["fit"].format_usage()
    assert "--micro-batch M" in usage and "[--micro-batch M]" not in usage
