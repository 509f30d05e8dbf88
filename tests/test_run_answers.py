"""How good, in the user's terms: a classifier's accuracy and answers before and after the run
(leadline.run.answers), the adapter's README (leadline.run.card), and the LoRA adapter's values
and --lora-alpha (leadline.run.lora)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from helpers import DATA, make_model, make_tokenizer, save_model_dir, section_rows

pytest.importorskip("schedulefree")


def _task(golds: list[int], answers: list[tuple[int, ...]], held: int):
    """A task of rows ``prompt + answers[gold]``: the first ``held`` rows held out, the rest train."""
    from leadline.corpus import TokenizedRow

    rows = [TokenizedRow.from_labels([7, 8, *answers[g]], [-100, -100, *answers[g]]) for g in golds]
    split = SimpleNamespace(train=list(range(held, len(rows))), held_out=list(range(held)), test=[])
    return SimpleNamespace(rows=rows, split=split, model=None, device="cpu", pad_id=0)


def test_accuracy_and_spread_are_read_from_the_choices_against_each_rows_own_answer(monkeypatch):
    """A known answer: the choices the model makes are given, so the accuracy and the shares are counted."""
    import leadline.run.answers as reading
    from leadline.run.answers import AnswerReader

    answers = [(11,), (12,), (13, 14)]
    task = _task([0, 1, 2, 0, 0, 1, 2, 0], answers, held=4)  # held out: 0, 1, 2, 0; the answers in training order
    chosen = iter([[0, 0, 0, 0], [0, 1, 2, 1]])  # before: one answer for every row; after: three right of four
    monkeypatch.setattr(reading, "answers_chosen", lambda *a, **k: next(chosen))
    reader = AnswerReader.of(task, lambda ids: {11: "games", 12: "net", 13: "sound"}[ids[0]])
    reader.before()
    got = reader.after()
    assert got.names == ["games", "net", "sound"] and got.test is None and got.reads == 2
    h = got.held_out
    assert (h.rows, h.before.accuracy, h.after.accuracy) == (4, 0.5, 0.75)
    assert h.before.chosen == {"games": 1.0, "net": 0.0, "sound": 0.0}
    assert h.after.chosen == {"games": 0.25, "net": 0.5, "sound": 0.25}
    assert h.own == {"games": 0.5, "net": 0.25, "sound": 0.25}
    lines = got.lines()
    assert lines[0] == "held-out answers: accuracy 50% before, 75% after on 4 rows"
    assert lines[1:] == ["  chosen before -> after (the rows' own): games 100% -> 25% (50%), net 0% -> 50% (25%),",
                         "    sound 0% -> 25% (25%)"]


def test_free_text_and_rows_without_a_prompt_have_no_answers():
    from leadline.corpus import TokenizedRow
    from leadline.run.answers import AnswerReader

    free = _task(list(range(40)), [(100 + i,) for i in range(40)], held=4)
    assert AnswerReader.of(free, str) is None  # more than 32 distinct completions
    text = _task([0, 1] * 5, [(11,), (12,)], held=2)
    text.rows = [TokenizedRow.from_labels([5, 6], [5, 6]) for _ in range(10)]  # every token scored: no prompt
    assert AnswerReader.of(text, str) is None


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory):
    """leadline run on four-class rows, a test share read too, alpha given."""
    from leadline.cli import main

    d = tmp_path_factory.mktemp("answers")
    model_dir = save_model_dir(d / "tiny")
    data = section_rows(d / "train.jsonl", 96)
    argv = ["run", "--model", str(model_dir), "--data", str(data), "--steps", "20", "--device", "cpu",
            "--test-share", "0.2", "--lora-alpha", "8", "--out", str(d / "run"), "--html"]
    return main(argv), d / "run"


def test_the_run_reads_a_classifiers_answers_before_and_after_and_counts_the_reads(classifier_run, capsys):
    from leadline.plan import Plan

    rc, out = classifier_run
    assert rc in (0, 3)
    run = json.loads((out / "run.json").read_text())
    a = run["answers"]
    assert sorted(a["answers"]) == ["games", "net", "science", "sound"] and a["test_source"] == "test share"
    assert a["reads"] == 4  # the held-out and the test rows, before and after
    for part in ("held_out", "test"):
        check = a[part]
        assert check["rows"] > 0 and 0 <= check["before"]["accuracy"] <= 1 and 0 <= check["after"]["accuracy"] <= 1
        assert sum(check["after"]["chosen"].values()) == pytest.approx(1.0)
        assert sum(check["own"].values()) == pytest.approx(1.0)
    assert a["held_out"]["rows"] == run["held_out_after"]["rows"]
    guard = next(p for p in Plan.from_json(out / "plan.json").phases if p.phase == "guard")
    assert guard.reads == run["cost"]["check_reads"] + 4  # the answers are the verdict's reads
    page = (out / "report.html").read_text()
    assert "<h2>Answers</h2>" in page and "Held-out rows: accuracy" in page and "Test share: accuracy" in page


def test_the_terminal_says_the_accuracy_beside_the_loss(tmp_path):
    from leadline.run import RunOptions, run_in_one

    tok = make_tokenizer()
    plan, res = run_in_one(make_model(vocab_size=len(tok)), tok, str(section_rows(tmp_path / "t.jsonl", 64)),
                           RunOptions(total_steps=5))
    lines = res.lines(plan)
    loss = next(i for i, line in enumerate(lines) if line.startswith("held-out loss"))
    assert lines[loss + 1].startswith("held-out answers: accuracy ") and " after on " in lines[loss + 1]
    assert lines[loss + 2].startswith("  chosen before -> after (the rows' own): ")
    free, res = run_in_one(make_model(vocab_size=len(tok)), tok, str(DATA / "text.jsonl"), RunOptions(total_steps=2))
    assert res.answers is None and res.as_dict()["answers"] is None
    assert not any("answers" in line for line in res.lines(free))


def test_the_adapters_readme_states_the_base_the_data_the_values_and_the_readings(classifier_run):
    from leadline.plan import Plan

    _, out = classifier_run
    card = (out / "README.md").read_text()
    plan = Plan.from_json(out / "plan.json")
    run = json.loads((out / "run.json").read_text())
    if run["outcome"] == "no_better_than_start":
        pytest.skip("no adapter written")
    assert card.startswith("---\nbase_model: ") and "library_name: peft" in card
    assert f"- **Base model:** `{out.parent / 'tiny'}`" in card
    assert plan.data["sha256"] in card and f"{run['train_rows']} training rows" in card
    for name in ("lr", "total_steps", "seq_len", "scored_tokens", "lora_rank", "lora_alpha", "lora_targets"):
        assert f"| {name} | {plan[name].text()} | {plan[name].kind} |" in card
    assert "- **Held-out loss:** " in card and "- **Held-out accuracy:** " in card
    assert "- **Test share accuracy:** " in card and "Model Card for Model ID" not in card  # PEFT's template
    assert f'AutoPeftModelForCausalLM.from_pretrained("{out}")' in card


def test_lora_alpha_is_given_and_the_plan_states_the_adapter(classifier_run):
    from leadline.plan import Plan

    _, out = classifier_run
    plan = Plan.from_json(out / "plan.json")
    assert (plan.lora_rank, plan["lora_rank"].kind) == (16, "constant")
    assert (plan.lora_alpha, plan["lora_alpha"].kind) == (8, "given")
    assert plan.lora_targets == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    assert (plan.lora_dropout, plan["lora_dropout"].kind) == (0.0, "constant")
    if (out / "adapter_config.json").exists():
        assert json.loads((out / "adapter_config.json").read_text())["lora_alpha"] == 8


def test_the_default_alpha_stays_twice_the_rank_and_a_given_one_is_the_adapter_peft_makes(tmp_path):
    """--lora-alpha sets each LoRA layer's scale after the adapter is made: the same scales, and
    the same forward once the adapter has moved, as PEFT's adapter made with that alpha."""
    import torch
    from peft import LoraConfig, get_peft_model

    from leadline.cli import build_parser
    from leadline.cli._common import load_for_training, lora_values_of
    from leadline.run.lora import Lora

    model_dir = save_model_dir(tmp_path / "tiny")
    parse = build_parser().parse_args
    base = ["run", "--model", str(model_dir), "--data", "x.jsonl", "--out", "o", "--device", "cpu"]
    default, _ = load_for_training(parse(base))
    assert Lora.of(default).alpha == 32 and Lora.of(default).rank == 16
    values = lora_values_of(parse(base), default)
    assert (values["lora_alpha"].value, values["lora_alpha"].kind) == (32, "derived")
    args = parse([*base, "--lora-rank", "4", "--lora-alpha", "6"])
    ours, _ = load_for_training(args)
    assert lora_values_of(args, ours)["lora_rank"].kind == "given"
    torch.manual_seed(0)
    theirs = get_peft_model(make_model(vocab_size=len(make_tokenizer())),
                            LoraConfig(r=4, lora_alpha=6, target_modules="all-linear", lora_dropout=0.0))
    def scales(model):
        return {n: m.scaling["default"] for n, m in model.named_modules() if isinstance(getattr(m, "scaling", 0), dict)}

    assert scales(ours) and set(scales(ours).values()) == {1.5}
    assert scales(ours) == scales(theirs)
    with torch.no_grad():
        for (n, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
            q.copy_(p + 0.01 if "lora_B" in n else p)
            p.copy_(q)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.allclose(ours(input_ids=ids).logits, theirs(input_ids=ids).logits, atol=1e-6)


def test_a_bad_lora_alpha_is_one_sentence_before_the_model_loads(tmp_path, capsys):
    from leadline.cli import main

    for extra, said in ((["--lora-alpha", "0"], "--lora-alpha 0 must be a number above 0"),
                        (["--lora-alpha", "16", "--full"], "--lora-alpha 16 scales a LoRA adapter's update, and --full")):
        capsys.readouterr()
        rc = main(["run", "--model", "/nonexistent/model", "--data", str(DATA / "prompt_completion.jsonl"),
                   "--device", "cpu", "--out", str(tmp_path / "o"), *extra])
        err = capsys.readouterr().err
        assert rc == 2 and said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
