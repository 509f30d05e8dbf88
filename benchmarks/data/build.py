"""Build the scoreboard's extra data sets: man_sections, debian_summary, py_modules, code_trace.

Run from anywhere: ``python3 benchmarks/data/build.py [name ...]`` (no name: all four). It
writes, next to this file,

- ``man_sections_{train,test}.jsonl``: {"text", "label", "name", "package"}; the NAME-line
  description of an English man page installed on this machine, labelled with its section
  ("1" user commands, "2" system calls, "3" library functions, "8" administration commands).
- ``debian_summary_{train,test}.jsonl``: {"prompt", "completion", "package"}; a Debian
  package's long description and, as the completion, its one-line summary, split out of
  ``../shared/data/debian_sections_{train,test}.jsonl`` (same train/test split).
- ``py_modules_{train,test}.jsonl``: {"text", "function", "label", "source", "package"}; the
  docstring of a function or method in Debian's CPython 3.11 standard library
  (/usr/lib/python3.11, read with ``ast``, nothing imported), labelled with the module a user
  imports (18 classes), every word containing a module name masked as ``___``.
- ``code_trace_{train,test}.jsonl``: {"prompt", "completion", "answer"}; a generated Python
  function of two arguments and a call, the completion its evaluation line by line ending
  ``#### <answer>``; each answer checked against what Python returns.

What it reads: /usr/share/man/man{1,2,3,8} (through man-db's ``lexgrog``), /usr/lib/python3.11,
dpkg's file lists (/var/lib/dpkg/info/*.list, what ``dpkg -S`` reads) and apt's bookworm
Packages list (/var/lib/apt/lists, through ``apt-helper cat-file``). Everything is
deterministic: sorted inputs, ``random.Random(0)``. It prints the counts the README quotes, and
a keyword baseline for the classification sets.
"""

from __future__ import annotations

import ast
import collections
import glob
import json
import math
import os
import random
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[2] / "shared" / "data"  # /work/main/benchmarks/data -> /work/shared/data
MAN = Path("/usr/share/man")
SECTIONS = ("1", "2", "3", "8")
PER_CLASS = 500
TEST_SHARE = 0.2
SEED = 0
# Debian Policy 3.4.1: the synopsis line "should be kept brief - certainly under 80 characters".
SYNOPSIS_MAX = 80


def apt_packages() -> dict[str, str]:
    """Package -> short description, from apt's bookworm main Packages list ({} if absent)."""
    lists = sorted(glob.glob("/var/lib/apt/lists/*bookworm_main_binary-*_Packages*"))
    if not lists:
        return {}
    text = subprocess.run(
        ["/usr/lib/apt/apt-helper", "cat-file", lists[0]],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    short, pkg = {}, None
    for line in text.splitlines():
        if line.startswith("Package: "):
            pkg = line[9:].strip()
        elif line.startswith("Description: ") and pkg is not None:
            short[pkg] = line[13:]
    return short


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


# --------------------------------------------------------------------------- man_sections


def file_owners(prefix: str = "/usr/share/man/man") -> dict[str, str]:
    """Path under ``prefix`` -> binary package, from dpkg's file lists (the data ``dpkg -S`` reads)."""
    owner: dict[str, str] = {}
    for lst in sorted(glob.glob("/var/lib/dpkg/info/*.list")):
        pkg = os.path.basename(lst)[: -len(".list")].split(":")[0]
        with open(lst, encoding="utf-8", errors="replace") as f:
            for line in f:
                p = line.rstrip("\n")
                if p.startswith(prefix):
                    owner.setdefault(p, pkg)
    return owner


LEX = re.compile(r'^(?P<path>.*?): "(?P<line>.*)"$')
NAMELIST = re.compile(r"^[\w.:+@-]+(?:\s*,\s*[\w.:+@-]+)*\s+\\?[-\u2013\u2014]\s+")


def lexgrog(paths: list[str]) -> dict[str, list[str]]:
    """Path -> its NAME lines ("name - description"), by man-db's lexgrog; unparsed pages absent."""
    out: dict[str, list[str]] = collections.defaultdict(list)
    for i in range(0, len(paths), 400):
        res = subprocess.run(["lexgrog", *paths[i : i + 400]], capture_output=True, text=True)
        for line in res.stdout.splitlines():
            m = LEX.match(line)
            if m:
                out[m["path"]].append(m["line"])
    return out


def norm(s: str) -> str:
    return " ".join(s.split()).casefold()


def describe(stem: str, lines: list[str]) -> str:
    """The description of a page from its NAME lines, without any leading list of names."""
    names = {stem.casefold()}
    desc = ""
    for line in lines:
        name, sep, rest = line.partition(" - ")
        names.add(name.strip().casefold())
        if sep and not desc:
            desc = rest
    desc = " ".join(desc.split())
    # "zstd - zstd, zstdmt, unzstd, zstdcat - Compress ...": drop the repeated names.
    while (m := NAMELIST.match(desc)) and any(
        t.strip().casefold() in names for t in m.group(0).rstrip(" -\\\u2013\u2014").split(",")
    ):
        desc = desc[m.end() :]
    if desc.rstrip(".").casefold() in names:
        return ""
    return desc


def group_key(row: dict, big: set[str]) -> str:
    """Pages of one package stay on one side; a package that fills much of a class (manpages-dev
    is all of section 2) is grouped by the name's first token instead (pthread_*, Dpkg::*)."""
    if row["package"] not in big:
        return row["package"]
    first = re.split(r"[_:.\-]", row["name"], maxsplit=1)[0].casefold() or row["name"]
    return f"{row['package']}/{first}"


def man_sections(debian: dict[str, str]) -> tuple[list[dict], list[dict], dict]:
    owner = file_owners()
    stats: dict = collections.defaultdict(collections.Counter)
    pool: dict[str, list[dict]] = {}
    for sec in SECTIONS:
        paths = []
        for p in sorted(glob.glob(str(MAN / f"man{sec}" / "*"))):
            if os.path.islink(p):
                stats["symlink (alias of another page)"][sec] += 1
                continue
            pkg = owner.get(p)
            if pkg is None or (debian and pkg not in debian):
                stats[f"not from a Debian package ({pkg})"][sec] += 1
                continue
            paths.append(p)
        lines = lexgrog(paths)
        rows = []
        for p in paths:
            stem = os.path.basename(p).removesuffix(".gz")
            if p not in lines:
                stats["lexgrog: parse failed"][sec] += 1
                continue
            desc = describe(stem.rsplit(".", 1)[0], lines[p])
            if not desc:
                stats["description empty or just the name"][sec] += 1
                continue
            rows.append({"text": desc, "label": sec, "name": stem, "package": owner[p]})
        pool[sec] = rows
    # Duplicate descriptions: one kept within a section; dropped everywhere if in several.
    pool = {sec: sorted(rows, key=lambda r: r["name"]) for sec, rows in pool.items()}
    chosen = {sec: kept[:PER_CLASS] for sec, kept in
              distinct_per_label(pool, stats, "description", "section").items()}
    rows = [r for sec in SECTIONS for r in chosen[sec]]
    per_class = collections.Counter(r["label"] for r in rows)
    by_pkg = collections.Counter((r["label"], r["package"]) for r in rows)
    big = {p for (sec, p), n in by_pkg.items() if n > TEST_SHARE * per_class[sec]}
    train, test = grouped_split(rows, lambda r: group_key(r, big))
    train.sort(key=lambda r: (r["label"], r["name"]))
    test.sort(key=lambda r: (r["label"], r["name"]))
    stats["grouped by first name token"] = collections.Counter({p: 1 for p in big})
    return train, test, stats


def distinct_per_label(pool: dict[str, list[dict]], stats: dict, text: str, label: str) -> dict[str, list[dict]]:
    """Each label's rows in the order given with duplicate texts dropped: a text under several
    labels is dropped everywhere, a text twice under one label kept once; then shuffled by SEED.
    ``stats`` counts the drops and the rows left (``text`` and ``label`` name them)."""
    labels_of = collections.defaultdict(set)
    for lab, rows in pool.items():
        for r in rows:
            labels_of[norm(r["text"])].add(lab)
    out: dict[str, list[dict]] = {}
    for lab, rows in pool.items():
        seen, kept = set(), []
        for r in rows:
            k = norm(r["text"])
            if len(labels_of[k]) > 1:
                stats[f"{text} also in another {label}"][lab] += 1
            elif k in seen:
                stats[f"duplicate {text}"][lab] += 1
            else:
                seen.add(k)
                kept.append(r)
        stats["eligible"][lab] = len(kept)
        random.Random(SEED).shuffle(kept)
        out[lab] = kept
    return out


def grouped_split(rows: list[dict], key: Callable[[dict], str]) -> tuple[list[dict], list[dict]]:
    """(train, test): whole groups of rows, no group on both sides, each label at most
    ``TEST_SHARE`` of its rows in test. Groups are shuffled with ``SEED``; each goes to test
    if every label stays under its cap there, else to train."""
    per_class = collections.Counter(r["label"] for r in rows)
    groups: dict[str, list[dict]] = collections.defaultdict(list)
    for r in rows:
        groups[key(r)].append(r)
    order = sorted(groups)
    random.Random(SEED).shuffle(order)
    cap = {label: math.ceil(TEST_SHARE * n) for label, n in per_class.items()}
    in_test: collections.Counter = collections.Counter()
    train, test = [], []
    for g in order:
        need = collections.Counter(r["label"] for r in groups[g])
        if all(in_test[s] + n <= cap[s] for s, n in need.items()):
            in_test.update(need)
            test += groups[g]
        else:
            train += groups[g]
    return train, test


# --------------------------------------------------------------------------- baseline


def tokens(s: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", s.casefold())


def keyword_baselines(train: list[dict], test: list[dict]) -> dict[str, float]:
    """Bag-of-words nearest class centroid (tf-idf, cosine) and multinomial naive Bayes."""
    labels = sorted({r["label"] for r in train})
    df = collections.Counter(t for r in train for t in set(tokens(r["text"])))
    idf = {t: math.log(len(train) / n) + 1 for t, n in df.items()}

    def vec(s: str) -> dict[str, float]:
        tf = collections.Counter(t for t in tokens(s) if t in idf)
        v = {t: n * idf[t] for t, n in tf.items()}
        z = math.sqrt(sum(x * x for x in v.values())) or 1.0
        return {t: x / z for t, x in v.items()}

    cent = {c: collections.Counter() for c in labels}
    for r in train:
        cent[r["label"]].update(vec(r["text"]))
    for c in labels:
        z = math.sqrt(sum(x * x for x in cent[c].values())) or 1.0
        cent[c] = {t: x / z for t, x in cent[c].items()}
    counts = {c: collections.Counter() for c in labels}
    for r in train:
        counts[r["label"]].update(tokens(r["text"]))
    prior = collections.Counter(r["label"] for r in train)
    denom = {c: sum(counts[c].values()) + len(df) for c in labels}

    def nb_score(c: str, toks: list[str]) -> float:
        lp = math.log(prior[c] / len(train))
        return lp + sum(math.log((counts[c][t] + 1) / denom[c]) for t in toks if t in df)

    def centroid_score(c: str, v: dict[str, float]) -> float:
        return sum(x * cent[c].get(t, 0.0) for t, x in v.items())

    hit_c = hit_nb = 0
    for r in test:
        v, toks = vec(r["text"]), tokens(r["text"])
        hit_c += max(labels, key=lambda c: centroid_score(c, v)) == r["label"]
        hit_nb += max(labels, key=lambda c: nb_score(c, toks)) == r["label"]
    return {"centroid_tfidf": hit_c / len(test), "naive_bayes": hit_nb / len(test)}


# --------------------------------------------------------------------------- debian_summary

# A ". " after one of these is not the end of the synopsis: dotted acronyms (B.A.T.M.A.N.,
# a.k.a.) and common abbreviations.
NOT_END = re.compile(
    r"(?:\b(?:[A-Za-z]\.)+[A-Za-z]|\b(?:vs|etc|e\.g|i\.e|cf|approx|incl|ca|Dr|Mr|Mrs|Ms|St|Jr|Sr"
    r"|Inc|Ltd|Co|No|no|vol|ver))$"
)
# A ". " after a lone letter may end the synopsis ("client for X") or be an initial ("D. Fanning").
LONE_LETTER = re.compile(r"(?:^|[\s(/])[A-Za-z]$")


def split_summary(text: str) -> tuple[str, str] | str:
    """(summary, body) from "summary. body", or the reason the split is ambiguous.

    The summary ends at the first ". " that is not after an abbreviation. Ambiguous: that ". "
    follows a lone letter, or the text up to the next ". " would still fit in a synopsis
    (<= 80 characters: "Tool for dynamic flowsheet simulation. GUI. Dynamic ..."), or no ". ".
    """
    cuts = [m.start() for m in re.finditer(r"\. ", text) if not NOT_END.search(text[: m.start()])]
    if not cuts:
        return "no '. ' in the text"
    if LONE_LETTER.search(text[: cuts[0]]):
        return "first '. ' follows a lone letter (initial or 'for X')"
    if len(cuts) > 1 and cuts[1] <= SYNOPSIS_MAX:
        return "the next sentence would still fit in an 80-character synopsis"
    summary, body = text[: cuts[0]], text[cuts[0] + 2 :].strip()
    if not summary.strip() or not body:
        return "empty summary or body"
    return summary, body


def debian_summary(debian: dict[str, str]) -> tuple[dict[str, list[dict]], dict]:
    stats: dict = collections.defaultdict(collections.Counter)
    out = {}
    for split in ("train", "test"):
        rows = []
        with (SHARED / f"debian_sections_{split}.jsonl").open(encoding="utf-8") as f:
            src = [json.loads(line) for line in f]
        stats["source rows"][split] = len(src)
        for r in src:
            res = split_summary(r["text"])
            if isinstance(res, str):
                stats[res][split] += 1
                continue
            summary, body = res
            if debian:  # check against apt's own Description line, where this machine has it
                truth = debian.get(r["package"])
                if truth is None:
                    stats["package not in the apt list (kept, unchecked)"][split] += 1
                elif truth != summary:
                    stats["split disagrees with apt's Description (dropped)"][split] += 1
                    continue
                else:
                    stats["split equals apt's Description"][split] += 1
            rows.append({"prompt": body, "completion": summary, "package": r["package"]})
        stats["kept"][split] = len(rows)
        out[split] = rows
    shared = {r["prompt"] for r in out["train"]} & {r["prompt"] for r in out["test"]}
    stats["prompts in both train and test"]["test"] = len(shared)
    return out, stats


# --------------------------------------------------------------------------- py_modules

PY_LIB = Path("/usr/lib/python3.11")
# Each label is the module a user imports; decimal's pure-Python implementation is _pydecimal.
PY_MODULES = {
    **{m: m for m in (
        "asyncio", "datetime", "distutils", "email", "http", "importlib", "inspect", "lib2to3", "logging",
        "mailbox", "multiprocessing", "pydoc", "tarfile", "turtle", "unittest", "urllib", "xml",
    )},
    "_pydecimal": "decimal",
}
PY_PER_CLASS = 200
DOC_CHARS = 300
MIN_WORDS = 3
# Any word that contains a label (or 2to3, lib2to3's tool) is masked in every row, whatever its label:
# "Return a Decimal instance" -> "Return a ___ instance", "TarFile.open" -> "___.open".
MASK = re.compile(r"\w*(?:" + "|".join(sorted({*PY_MODULES.values(), "2to3"})) + r")\w*", re.IGNORECASE)


def py_functions(path: Path) -> list[tuple[str, str, str]]:
    """(qualified name, top-level name, docstring) of every function and method with a docstring."""
    out: list[tuple[str, str, str]] = []

    def visit(node: ast.AST, qual: str, top: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{qual}.{child.name}" if qual else child.name
                if not isinstance(child, ast.ClassDef) and (doc := ast.get_docstring(child)):
                    out.append((name, top or child.name, doc))
                visit(child, name, top or child.name)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), "", "")
    return out


def clip(text: str, chars: int) -> str:
    """``text`` cut at the last space before ``chars`` characters, with " ..." where it was cut."""
    if len(text) <= chars:
        return text
    return text[: text.rfind(" ", 0, chars)] + " ..."


def py_modules() -> tuple[list[dict], list[dict], dict]:
    owner = file_owners(str(PY_LIB) + "/")
    stats: dict = collections.defaultdict(collections.Counter)
    pool: dict[str, list[dict]] = collections.defaultdict(list)
    for path in sorted(PY_LIB.rglob("*.py")):
        rel = path.relative_to(PY_LIB)
        label = PY_MODULES.get(rel.parts[0].removesuffix(".py"))
        if label is None or any(p == "__pycache__" or p.startswith(("test", "idle_test")) for p in rel.parts):
            continue
        for qual, top, doc in py_functions(path):
            text = clip(MASK.sub("___", " ".join(doc.split())), DOC_CHARS)
            if len(text.split()) < MIN_WORDS:
                stats[f"docstring under {MIN_WORDS} words"][label] += 1
                continue
            pool[label].append({
                "text": text, "function": MASK.sub("___", qual.rsplit(".", 1)[-1]), "label": label,
                "source": f"{rel}:{qual}", "package": owner.get(str(path), "?"), "group": f"{rel}:{top}",
            })
    kept = distinct_per_label({label: pool[label] for label in sorted(pool)}, stats, "docstring", "module")
    rows = [r for label in kept for r in kept[label][:PY_PER_CLASS]]  # each label's in file and source order
    train, test = grouped_split(rows, lambda r: r["group"])
    for r in (*train, *test):
        del r["group"]
    train.sort(key=lambda r: (r["label"], r["source"]))
    test.sort(key=lambda r: (r["label"], r["source"]))
    stats["owning package (rows)"] = collections.Counter(r["package"] for r in rows)
    return train, test, stats


# --------------------------------------------------------------------------- code_trace

TRACE_TRAIN, TRACE_TEST = 2000, 500
TRACE_MAX = 999  # every value the function computes stays within -999..999
TRACE_MAX_TOKENS = 60


def rough_tokens(text: str) -> int:
    """An upper-bound stand-in for SmolLM2's token count: a digit, a word or a symbol each."""
    return len(re.findall(r"\d|[A-Za-z]+|\S|\n", text))


def show_value(v: int) -> str:
    return f"({v})" if v < 0 else str(v)


def trace_expr(rng: random.Random, names: list[str], must: str | None) -> tuple[str, list[object]]:
    """A random expression over ``names`` and constants 1..9, and its parts for the worked line:
    ``[x, op, y]``, ``[x, op, y, op, z]`` or ``["max", x, y]``; ``must`` is among its names."""

    def operand() -> str:
        return rng.choice(names) if rng.random() < 0.7 else str(rng.randint(1, 9))

    form = rng.choices(("one", "two", "minmax"), weights=(5, 3, 1))[0]
    if form == "minmax":
        parts: list[object] = [rng.choice(("max", "min")), operand(), operand()]
    elif form == "one":
        parts = [operand(), rng.choice("+-*"), operand()]
    else:
        parts = [operand(), rng.choice("+-*"), operand(), rng.choice("+-*"), operand()]
    slots = [i for i, p in enumerate(parts) if p not in ("max", "min", "+", "-", "*")]
    if must is not None and must not in parts:
        parts[rng.choice(slots)] = must
    if not any(parts[i] in names for i in slots):
        parts[rng.choice(slots)] = rng.choice(names)
    if parts[0] in ("max", "min"):
        return f"{parts[0]}({parts[1]}, {parts[2]})", parts
    return " ".join(str(p) for p in parts), parts


def trace_line(parts: list[object], env: dict[str, int]) -> tuple[str, int]:
    """The worked evaluation of an expression, "3 + 7 * 2 = 3 + 14 = 17", and its value."""

    def val(p: object) -> int:
        return env[p] if p in env else int(p)  # type: ignore[arg-type]

    def apply(x: int, op: object, y: int) -> int:
        return x + y if op == "+" else x - y if op == "-" else x * y

    if parts[0] in ("max", "min"):
        x, y = val(parts[1]), val(parts[2])
        v = max(x, y) if parts[0] == "max" else min(x, y)
        return f"{parts[0]}({x}, {y}) = {v}", v
    nums = [val(p) for p in parts[::2]]
    ops = parts[1::2]
    shown = " ".join(show_value(nums[i // 2]) if i % 2 == 0 else str(p) for i, p in enumerate(parts))
    if len(nums) == 2:
        v = apply(nums[0], ops[0], nums[1])
        return f"{shown} = {v}", v
    if ops[1] == "*" and ops[0] != "*":  # the product first, as Python does
        mid = apply(nums[1], "*", nums[2])
        step, v = f"{show_value(nums[0])} {ops[0]} {show_value(mid)}", apply(nums[0], ops[0], mid)
    else:
        mid = apply(nums[0], ops[0], nums[1])
        step, v = f"{show_value(mid)} {ops[1]} {show_value(nums[2])}", apply(mid, ops[1], nums[2])
    return f"{shown} = {step} = {v}", v


def trace_row(rng: random.Random) -> dict | None:
    """One function of two arguments, two or three assignments and a return, called on small
    arguments; None when a value leaves -999..999 or the worked solution is too long."""
    a, b = rng.randint(1, 12), rng.randint(1, 12)
    env, names, body, work = {"a": a, "b": b}, ["a", "b"], [], [f"a = {a}, b = {b}"]
    for var in ("c", "d", "e")[: rng.randint(2, 3)]:
        code, parts = trace_expr(rng, names, names[-1] if len(names) > 2 else None)
        line, env[var] = trace_line(parts, env)
        body.append(f"    {var} = {code}")
        work.append(f"{var} = {line}")
        names.append(var)
    code, parts = trace_expr(rng, names, names[-1])
    line, answer = trace_line(parts, env)
    body.append(f"    return {code}")
    work.append(f"return {line}")
    if any(abs(v) > TRACE_MAX for v in (*env.values(), answer)):
        return None
    program = "def f(a, b):\n" + "\n".join(body) + "\n"
    completion = "\n".join(work) + f"\n#### {answer}"
    if rough_tokens(completion) > TRACE_MAX_TOKENS:
        return None
    scope: dict = {}
    exec(program, scope)  # the program is ours: the worked answer must be what Python returns
    assert scope["f"](a, b) == answer, program
    return {"prompt": f"{program}\nWhat does f({a}, {b}) return?\n", "completion": completion, "answer": answer,
            "program": program}


def code_trace() -> tuple[list[dict], list[dict], dict]:
    rng = random.Random(SEED)
    stats: dict = collections.defaultdict(collections.Counter)
    rows, programs = [], set()
    while len(rows) < TRACE_TRAIN + TRACE_TEST:
        r = trace_row(rng)
        if r is None:
            stats["drawn"]["out of range or too long"] += 1
        elif r["program"] in programs:
            stats["drawn"]["program drawn before"] += 1
        else:
            stats["drawn"]["kept"] += 1
            programs.add(r.pop("program"))
            rows.append(r)
    return rows[:TRACE_TRAIN], rows[TRACE_TRAIN:], stats


# --------------------------------------------------------------------------- main


def show(title: str, stats: dict) -> None:
    print(f"== {title}")
    for k, c in stats.items():
        print(f"  {k}: {dict(sorted(c.items()))}")


def show_classes(train: list[dict], test: list[dict]) -> None:
    for name, rows in (("train", train), ("test", test)):
        c = collections.Counter(r["label"] for r in rows)
        print(
            f"  {name}: {len(rows)} rows {dict(sorted(c.items()))}"
            f" majority share {max(c.values()) / len(rows):.3f}"
        )
    for k, v in keyword_baselines(train, test).items():
        print(f"  keyword baseline {k}: test accuracy {v:.3f}")


def build_man_sections(debian: dict[str, str]) -> None:
    train, test, stats = man_sections(debian)
    write_jsonl(HERE / "man_sections_train.jsonl", train)
    write_jsonl(HERE / "man_sections_test.jsonl", test)
    show("man_sections", stats)
    show_classes(train, test)
    straddle = {r["package"] for r in train} & {r["package"] for r in test}
    print(f"  packages on both sides (only the first-token-grouped ones may): {sorted(straddle)}")


def build_debian_summary(debian: dict[str, str]) -> None:
    out, stats = debian_summary(debian)
    for split, rows in out.items():
        write_jsonl(HERE / f"debian_summary_{split}.jsonl", rows)
    show("debian_summary", stats)


def build_py_modules(debian: dict[str, str]) -> None:
    train, test, stats = py_modules()
    write_jsonl(HERE / "py_modules_train.jsonl", train)
    write_jsonl(HERE / "py_modules_test.jsonl", test)
    show("py_modules", stats)
    show_classes(train, test)
    words = [len(r["text"].split()) for r in (*train, *test)]
    print(f"  docstring words: median {sorted(words)[len(words) // 2]}, at most {max(words)}")


def build_code_trace(debian: dict[str, str]) -> None:
    train, test, stats = code_trace()
    write_jsonl(HERE / "code_trace_train.jsonl", train)
    write_jsonl(HERE / "code_trace_test.jsonl", test)
    show("code_trace", stats)
    rows = (*train, *test)
    print(f"  rough tokens: prompt at most {max(rough_tokens(r['prompt']) for r in rows)},"
          f" completion at most {max(rough_tokens(r['completion']) for r in rows)}")
    top, n = collections.Counter(r["answer"] for r in test).most_common(1)[0]
    print(f"  test: most common answer {top} in {n / len(test):.3f} of rows")


BUILDERS = {
    "man_sections": build_man_sections,
    "debian_summary": build_debian_summary,
    "py_modules": build_py_modules,
    "code_trace": build_code_trace,
}


def main(argv: list[str]) -> int:
    names = argv or list(BUILDERS)
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        print(f"build.py: {', '.join(unknown)} is not a data set; pass any of {', '.join(BUILDERS)}, "
              "or nothing for all", file=sys.stderr)
        return 2
    debian = apt_packages()
    if not debian:
        print("warning: no apt Packages list; nothing is checked against apt", file=sys.stderr)
    for name in names:
        BUILDERS[name](debian)
    for p in sorted(HERE.glob("*.jsonl")):
        print(f"  {p.name}: {p.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
