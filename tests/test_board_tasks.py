"""The scoreboard's py_modules and code_trace tasks (benchmarks/data/build.py), loaded from the
committed files as every arm sees them: enough classes, no dominant class, no test prompt in
training, and every worked answer readable by the exact-match judge."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sb():
    return load_benchmark("scoreboard")


def _load(sb, name: str) -> dict:
    return sb.load_task(name, ROOT / "nowhere", train_rows=0, test_rows=0)  # 0: every row


def test_py_modules_has_ten_classes_or_more_and_none_dominant(sb):
    t = _load(sb, "py_modules")
    assert t["kind"] == "classify" and not t["em"]
    assert len(t["labels"]) >= 10
    assert all(len(lab.split()) == 1 for lab in t["labels"])
    for rows in (t["train"], t["test"]):
        assert 400 <= len(rows) <= 2500
        shares = Counter(r["completion"].strip() for r in rows)
        assert set(shares) == set(t["labels"])
        assert max(shares.values()) / len(rows) < 0.4
    assert {r["label"] for r in t["test"]} == set(t["labels"])
    assert all(r["completion"] == " " + r["label"] for r in t["test"])


def test_py_modules_prompts_do_not_name_their_module(sb):
    t = _load(sb, "py_modules")
    for r in t["train"] + t["test"]:
        assert r["prompt"].endswith("\nModule:")
        assert r["completion"].strip().casefold() not in r["prompt"].casefold()


def test_code_trace_answers_end_the_completion_and_are_read_by_the_judge(sb):
    t = _load(sb, "code_trace")
    assert t["kind"] == "generate" and t["em"] and t["labels"] is None
    assert len(t["train"]) == 2000 and len(t["test"]) == 500
    for r in t["train"] + t["test"]:
        assert isinstance(r["answer"], int)
        assert r["completion"].endswith(f"#### {r['answer']}")
        assert sb._final_number(r["completion"]) == str(r["answer"])


def test_code_trace_answers_are_what_python_returns(sb):
    t = _load(sb, "code_trace")
    for r in t["test"]:
        program, call = r["prompt"].split("\nWhat does ")
        scope: dict = {}
        exec(program, scope)
        args = call.removesuffix(" return?\n")
        assert eval(args, scope) == r["answer"], r["prompt"]


@pytest.mark.parametrize("name", ["py_modules", "code_trace"])
def test_no_test_prompt_is_a_training_prompt(sb, name):
    t = _load(sb, name)
    seen = {r["prompt"] for r in t["train"]}
    assert not [r["prompt"] for r in t["test"] if r["prompt"] in seen]
    assert len({r["prompt"] for r in t["test"]}) == len(t["test"])


@pytest.mark.parametrize("name", ["py_modules", "code_trace"])
def test_the_tasks_keep_their_prompts_short(sb, name):
    t = _load(sb, name)
    # about 4 characters a token for English and code; 800 characters stays under ~200 tokens
    assert max(len(r["prompt"]) for r in t["train"] + t["test"]) < 800


def test_exact_match_follows_the_task_flag(sb):
    judge = sb.Judge.__new__(sb.Judge)
    judge.em_rows = 200
    judge.task = {"name": "code_trace", "em": True}
    assert judge.has_em
    judge.task = {"name": "debian_summary", "em": False}
    assert not judge.has_em
    judge.em_rows = 0
    judge.task = {"name": "code_trace", "em": True}
    assert not judge.has_em
