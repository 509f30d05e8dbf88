"""The product speaks of itself, not of how it was made.

No experiment IDs (E8, seed E9), session or development-round numbers, rule-number lists
(R1-R6) or issue numbers in README.md, CHANGELOG.md, docs/, benchmarks/README.md and the
docstrings, comments and strings of src/leadline/; none of those in benchmarks/*.py either
(where a script's own rules may keep the local labels its docstring defines); and no result
file named by a round, session or experiment (``_s6``, ``_r4``, ``rate_e11``, ``round``,
``*_before.json``) under benchmarks/, docs/ or src/. A result file is named by what it measured.

ALLOWED lists, per file, patterns a file may keep (none today).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

TEXT_PATTERNS = {
    "experiment id": re.compile(r"\bE\d{1,2}[a-z]?\b"),
    "seed": re.compile(r"\bseed E\d|\bthe seed's\b"),
    "session": re.compile(r"\b[Ss]essions? \d+"),
    "round": re.compile(r"(?<![-\w])[Rr]ound \d+\b"),
    "rule list": re.compile(r"\bR\d+-R\d+\b"),
    "issue": re.compile(r"\bissue \d+\b"),
    "round suffix": re.compile(r"(?<=\w)(?<!lora)_[sr]\d+(?:paired)?(?![A-Za-z0-9])"),
}
# benchmarks/*.py define their own rules (R1, R2, ...) in their docstrings and may list them
BENCHMARK_SCRIPT_EXEMPT = {"rule list"}

NAME_PATTERN = re.compile(
    r"(?<!lora)_[sr]\d+(?=[._/-]|$)"  # a round or session suffix: _s6, _r4, _s3_run1
    r"|(?:^|[/_])(?!e2e)[eE]\d{1,2}[a-z]?(?=[._/-]|$)"  # an experiment ID: e8_warmup, rate_e11
    r"|round|session|_before\.|logs_s\d"
)

ALLOWED: dict[str, set[str]] = {}


def _text_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md"]
    files += sorted((ROOT / "docs").glob("*.md"))
    files += sorted((ROOT / "src" / "leadline").rglob("*.py"))
    files += sorted((ROOT / "benchmarks").glob("*.py"))
    return [f for f in files if f.exists()]


@pytest.mark.parametrize("path", _text_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_lab_lore_in_text(path: Path):
    rel = str(path.relative_to(ROOT))
    allowed = ALLOWED.get(rel, set())
    if rel.startswith("benchmarks/") and rel.endswith(".py"):
        allowed = allowed | BENCHMARK_SCRIPT_EXEMPT
    hits = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for name, pattern in TEXT_PATTERNS.items():
            m = pattern.search(line)
            if m and name not in allowed:
                hits.append(f"{rel}:{i}: {name} {m.group(0)!r}: {line.strip()[:100]}")
    assert not hits, "development history in the product (say what it is, not how it was made):\n" + "\n".join(hits)


def test_result_files_are_named_by_what_they_measured():
    bad = []
    for top in ("benchmarks", "docs", "src"):
        for p in (ROOT / top).rglob("*"):
            rel = p.relative_to(ROOT).as_posix()
            if "__pycache__" in rel or ".egg-info" in rel:
                continue
            if NAME_PATTERN.search(p.name):
                bad.append(rel)
    assert not bad, "files named by a round, session or experiment: " + ", ".join(sorted(bad))


def test_the_patterns_catch_what_they_are_for():
    assert TEXT_PATTERNS["experiment id"].search("as E8 showed")
    assert TEXT_PATTERNS["seed"].search("seed E9/E9b")
    assert TEXT_PATTERNS["session"].search("session 7's recipe")
    assert TEXT_PATTERNS["round"].search("in round 2 of the work")
    assert not TEXT_PATTERNS["round"].search("leadline disk --rounds 3")
    assert TEXT_PATTERNS["rule list"].search("rules R1-R6")
    assert TEXT_PATTERNS["round suffix"].search("noise_gsm_s7.json")
    assert TEXT_PATTERNS["round suffix"].search("e2e_debian_h200_s3_run1.json")
    assert not TEXT_PATTERNS["round suffix"].search("seed_lora_r32_warmup")
    assert not TEXT_PATTERNS["experiment id"].search("lr 2e-4, 1E-5, noqa: E501")
    for name in ("rate_e11_race.json", "e8_warmup_fp32.json", "noise_gsm_s7.json", "logs_s9",
                 "mem_full_24gb_seq2048_r4.log", "monitor_micro_cpu_before.json", "e11c.log",
                 "e2e_debian_h200_s3_run1.json"):
        assert NAME_PATTERN.search(name), name
    for name in ("e2e_debian_h200_full.json", "lora16_6gb_seq512.json", "gsm_full_rate_x0.99.json",
                 "schedule_debian_race.json", "seq2048_truth_repeat.json", "lora_r16_adapter.json"):
        assert not NAME_PATTERN.search(name), name
