"""The fixtures the phases test against work offline and behave like the real thing."""

from helpers import DATA, read_jsonl


def test_tiny_model_trains_a_step(tiny_model, tokenizer):
    import torch

    enc = tokenizer(["the quick brown fox", "science games net sound"], return_tensors="pt", padding=True)
    out = tiny_model(**enc, labels=enc["input_ids"])
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert all(p.grad is not None for p in tiny_model.parameters() if p.requires_grad)


def test_tokenizer_chat_template_marks_assistant_tokens(tokenizer):
    msgs = read_jsonl(DATA / "messages.jsonl")[0]["messages"]
    enc = tokenizer.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    mask = enc["assistant_masks"]
    assert 0 < sum(mask) < len(mask)
    scored = [t for t, m in zip(enc["input_ids"], mask) if m]
    assert tokenizer.decode(scored).endswith("<|im_end|>")


def test_shipped_data_files_parse():
    for name in ("text", "prompt_completion", "messages", "instruction", "question_answer", "tokenized"):
        assert len(read_jsonl(DATA / f"{name}.jsonl")) >= 16
