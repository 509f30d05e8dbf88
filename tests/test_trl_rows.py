"""derive_for(trainer) scores the tokens TRL's SFTTrainer scores, for each of TRL's formats."""

from __future__ import annotations

import pytest

from helpers import DATA, make_model, make_tokenizer

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

CASES = [
    ("text", {}),
    ("text", {"packing": True, "max_length": 48}),
    ("prompt_completion", {}),
    ("prompt_completion", {"completion_only_loss": False}),
    ("prompt_completion", {"packing": True, "max_length": 64}),
    ("messages", {}),
    ("messages", {"assistant_only_loss": True}),
    ("messages", {"assistant_only_loss": True, "packing": True, "max_length": 96}),
]


def _trainer(name, tmp_path, **kw):
    from trl import SFTConfig, SFTTrainer

    tok = make_tokenizer()
    ds = datasets.load_dataset("json", data_files=str(DATA / f"{name}.jsonl"), split="train")
    cfg = SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_steps=8, dataset_num_proc=None, **kw)
    return SFTTrainer(model=make_model(vocab_size=len(tok)), args=cfg, train_dataset=ds, processing_class=tok)


def trl_scored_tokens(trainer) -> int:
    """What TRL's loss scores over one pass of its own dataloader: labels after the shift,
    not -100 (its loss is the sum over those positions)."""
    n = 0
    for batch in trainer.get_train_dataloader():
        n += int((batch["labels"][:, 1:] != -100).sum())
    return n


@pytest.mark.parametrize(("name", "kw"), CASES, ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items()) or 'default'}" for n, kw in CASES])
def test_trainer_rows_score_what_trl_scores(name, kw, tmp_path):
    from leadline.corpus import profile_corpus
    from leadline.hf.trainer import trainer_rows

    trainer = _trainer(name, tmp_path, **kw)
    rows = trainer_rows(trainer)
    prof = profile_corpus(rows, trainer.processing_class)
    assert 0.5 * len(trainer.train_dataset) < prof.rows <= len(trainer.train_dataset)
    assert prof.scored_tokens == trl_scored_tokens(trainer) > 0


def test_the_policy_changes_the_count_and_the_plan_follows(tmp_path):
    """messages: TRL's default scores every token, assistant_only_loss the assistant turns —
    which is what leadline reads from the raw rows."""
    from leadline.corpus import profile_corpus
    from leadline.hf.trainer import trainer_rows

    tok = make_tokenizer()
    everything = profile_corpus(trainer_rows(_trainer("messages", tmp_path)), tok).scored_tokens
    assistant = profile_corpus(trainer_rows(_trainer("messages", tmp_path, assistant_only_loss=True)), tok).scored_tokens
    raw = profile_corpus(str(DATA / "messages.jsonl"), tok).scored_tokens
    assert assistant < everything / 2
    assert assistant == raw


def test_derive_for_a_trainer_records_its_policy(tmp_path):
    from leadline.hf import derive_for

    trainer = _trainer("messages", tmp_path, assistant_only_loss=True)
    plan = derive_for(trainer, effort="full")
    assert plan["loss_policy"].kind == "given"
    assert plan["loss_policy"].value["assistant_only_loss"] is True
    assert plan["loss_policy"].value["trainer"] == "SFTTrainer"
    assert plan.scored_tokens == trl_scored_tokens(trainer)
    assert plan["total_steps"].value == 8  # the trainer's max_steps


def test_a_dataset_without_tokens_is_one_sentence(tmp_path):
    from leadline.errors import InputError
    from leadline.hf import derive_for

    trainer = _trainer("text", tmp_path)
    trainer.train_dataset = datasets.Dataset.from_list([{"question": "a", "reply": "b"}] * 8)
    with pytest.raises(InputError, match="no input_ids"):
        derive_for(trainer)


@pytest.mark.parametrize("kw", [{}, {"completion_only_loss": False}, {"packing": True, "max_length": 96}],
                         ids=["default", "completion_only_loss=False", "packing"])
def test_conversational_prompt_completion_scores_what_trl_scores(kw, tmp_path):
    """TRL's conversational prompt/completion rows (lists of messages on each side, built here
    from the chat rows: the last assistant turn is the completion)."""
    import json

    from trl import SFTConfig, SFTTrainer

    from leadline.corpus import profile_corpus
    from leadline.hf.trainer import trainer_rows

    tok = make_tokenizer()
    rows = []
    for line in (DATA / "messages.jsonl").read_text().splitlines():
        msgs = json.loads(line)["messages"]
        rows.append({"prompt": msgs[:-1], "completion": msgs[-1:]})
    assert all(r["completion"][0]["role"] == "assistant" for r in rows)
    cfg = SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_steps=8, dataset_num_proc=None, **kw)
    trainer = SFTTrainer(model=make_model(vocab_size=len(tok)), args=cfg, train_dataset=datasets.Dataset.from_list(rows),
                         processing_class=tok)
    prof = profile_corpus(trainer_rows(trainer), tok)
    assert prof.scored_tokens == trl_scored_tokens(trainer) > 0


@pytest.mark.parametrize(("name", "kw"), [("prompt_completion", {}), ("messages", {"assistant_only_loss": True})])
def test_the_default_plan_states_the_tokens_trl_scores(name, kw, tmp_path):
    """`leadline run` and `leadline derive` (the race) state the scored tokens, what the loss scores,
    as derive's corpus profile does: TRL's count over one pass of the same rows."""
    pytest.importorskip("schedulefree")
    from leadline.run import race_only

    tok = make_tokenizer()
    plan = race_only(make_model(vocab_size=len(tok)), tok, str(DATA / f"{name}.jsonl"))
    assert plan["scored_tokens"].kind == "measured" and plan["scored_tokens"].unit == "tokens"
    assert plan.scored_tokens == trl_scored_tokens(_trainer(name, tmp_path, **kw)) > 0
