"""What the loss scores, per format, against counts made by hand from the tiny tokenizer.

Token pieces of the tiny byte-level BPE (tests/helpers.py), read off once by hand:
"the quick brown fox" -> the|Ġqu|ick|Ġbrow|n|Ġfox (6); "Section:" -> S|e|c|t|i|o|n|: (8);
"Section: games" -> the 8 + Ġgames (9); "5" -> 5; "12" -> 1|2; EOS = <|endoftext|> (id 0).
"""

import pytest

from helpers import CHAT_TEMPLATE, DATA, make_tokenizer
from leadline.corpus import TokenizedRow, tokenize_rows
from leadline.corpus.chat import token_mask
from leadline.corpus.tokenize import count_scored
from leadline.errors import InputError

TWO_TURNS = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "more"},
    {"role": "assistant", "content": "12"},
]


def one(rows, tok, **kw):
    out = list(tokenize_rows(rows, tok, **kw))
    assert len(out) == 1
    return out[0]


def scored_text(tok, row):
    return tok.decode([t for p, t in enumerate(row.labels) if p >= 1 and t != -100])


def test_scored_tokens_follow_the_causal_shift():
    # labels[0] is never predicted: it does not count even when it is not -100
    assert count_scored([5, 6, 7]) == 2
    assert count_scored([-100, -100, 7, -100, 9]) == 2
    assert count_scored([5]) == 0
    assert TokenizedRow.from_labels([1, 2, 3], [1, -100, 3]).scored_tokens == 1


def test_text_row_scores_every_token_and_the_eos(tokenizer):
    r = one([{"text": "the quick brown fox"}], tokenizer)
    assert len(r.input_ids) == 7 and r.input_ids[-1] == tokenizer.eos_token_id
    assert r.labels == r.input_ids
    assert r.scored_tokens == 6  # 6 pieces + EOS - the first, which nothing predicts


def test_text_row_already_ending_with_eos_gets_no_second_one(tokenizer):
    r = one([{"text": "the quick brown fox<|endoftext|>"}], tokenizer)
    assert len(r.input_ids) == 7 and r.scored_tokens == 6


def test_prompt_completion_scores_the_completion_and_eos_only(tokenizer):
    r = one([{"prompt": "Section:", "completion": " games"}], tokenizer)
    assert len(r.input_ids) == 10
    assert r.labels[:8] == [-100] * 8
    assert r.scored_tokens == 2
    assert scored_text(tokenizer, r) == " games<|endoftext|>"


def test_chat_with_two_assistant_turns_scores_both_and_nothing_else(tokenizer):
    r = one([{"messages": TWO_TURNS}], tokenizer)
    # "5<|im_end|>" (2) + "12<|im_end|>" (3); the role headers and the user turns are not scored
    assert r.scored_tokens == 5
    assert scored_text(tokenizer, r) == "5<|im_end|>12<|im_end|>"
    assert len(r.input_ids) == 43


def test_chat_fallback_by_prefix_difference_when_the_template_has_no_generation_markers():
    tok = make_tokenizer()
    tok.chat_template = CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    r = one([{"messages": TWO_TURNS}], tok)
    # the same tokens, plus the newline ChatML writes after each assistant turn: 5 + 2
    assert r.scored_tokens == 7
    assert scored_text(tok, r) == "5<|im_end|>\n12<|im_end|>\n"
    with_markers = one([{"messages": TWO_TURNS}], make_tokenizer())
    assert r.input_ids == with_markers.input_ids


def test_chat_template_that_rewrites_earlier_turns_is_a_bad_row_naming_it():
    tok = make_tokenizer()
    # renders only the last message's content in full: not prefix-stable
    tok.chat_template = "{% for m in messages %}{% if loop.last %}{{ m['content'] }}{% else %}x{% endif %}{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    with pytest.raises(InputError, match=r"rows\[0\] renders turn 1 differently"):
        list(tokenize_rows([{"messages": TWO_TURNS}], tok))


def test_conversational_prompt_completion(tokenizer):
    row = {"prompt": TWO_TURNS[:1], "completion": [TWO_TURNS[1]]}
    r = one([row], tokenizer)
    # after "<|im_start|>assistant\n": "5<|im_end|>\n" (3 tokens), as TRL's prompt-prefix rule gives
    assert r.scored_tokens == 3
    assert scored_text(tokenizer, r) == "5<|im_end|>\n"


def test_instruction_and_question_answer_read_as_a_chat(tokenizer):
    a = one([{"instruction": "hi", "input": "", "output": "12"}], tokenizer)
    b = one([{"question": "hi", "answer": "12"}], tokenizer)
    assert a.scored_tokens == b.scored_tokens == 3  # "12<|im_end|>"
    assert a.input_ids == b.input_ids
    c = one([{"instruction": "hi", "input": "more", "output": "12"}], tokenizer)
    assert tokenizer.decode(c.input_ids).count("hi\n\nmore") == 1


def test_instruction_without_chat_template_is_prompt_newline_completion():
    tok = make_tokenizer()
    tok.chat_template = None
    r = one([{"question": "Section:", "answer": " games"}], tok)
    assert tok.decode(r.input_ids) == "Section:\n games<|endoftext|>"
    assert r.scored_tokens == 2


def test_tokenized_rows_keep_their_labels(tokenizer):
    rows = list(tokenize_rows(DATA / "tokenized.jsonl", tokenizer))
    assert rows[0].scored_tokens == 8  # 12 ids, the first 4 labels -100
    assert rows[1].scored_tokens == 2
    r = one([{"input_ids": [5, 6, 7, 8], "labels": [5, -100, 7, 8]}], None)  # no tokenizer needed
    assert r.scored_tokens == 2
    r = one([{"input_ids": [5, 6, 7]}], None)  # no labels: every token after the first
    assert r.labels == [5, 6, 7] and r.scored_tokens == 2


def test_tokenized_row_outside_the_vocabulary_is_named(tokenizer):
    with pytest.raises(InputError, match=r"rows\[1\] has token id 999, outside the tokenizer's vocabulary of 384"):
        list(tokenize_rows([{"input_ids": [1, 2]}, {"input_ids": [1, 999]}], tokenizer))


def test_truncation_cuts_scored_tokens_from_the_end(tokenizer):
    r = one([{"prompt": "Section:", "completion": " games"}], tokenizer)
    assert r.truncated(9).scored_tokens == 1  # the EOS cut
    assert r.truncated(8).scored_tokens == 0  # the prompt alone: nothing left
    assert r.truncated(100) is r


def test_batched_equals_row_by_row(tokenizer):
    rows = list(tokenize_rows(DATA / "messages.jsonl", tokenizer, batch_size=1000))
    alone = list(tokenize_rows(DATA / "messages.jsonl", tokenizer, batch_size=1))
    assert rows == alone and len(rows) >= 16


def test_chat_rows_without_template_or_tokenizer_say_what_is_missing():
    tok = make_tokenizer()
    tok.chat_template = None
    with pytest.raises(InputError, match="no chat template"):
        list(tokenize_rows([{"messages": TWO_TURNS}], tok))
    with pytest.raises(InputError, match="need a tokenizer"):
        list(tokenize_rows([{"text": "a b"}], None))


def test_token_mask_by_overlap():
    assert token_mask([(0, 2), (2, 4), (4, 6)], [(3, 6)]) == [False, True, True]
    assert token_mask([(0, 1), (1, 1), (1, 3)], [(1, 3)]) == [False, True, True]


def test_a_row_the_template_rejects_is_named_and_the_others_keep_the_generation_mask():
    tok = make_tokenizer()
    tok.chat_template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('must start with user') }}{% endif %}" + CHAT_TEMPLATE
    bad = [{"role": "assistant", "content": "5"}]
    with pytest.raises(InputError, match=r"rows\[1\] cannot be rendered by the tokenizer's chat template \(.*must start with user"):
        list(tokenize_rows([{"messages": TWO_TURNS}, {"messages": bad}], tok))
    kept = list(tokenize_rows([{"messages": TWO_TURNS}, {"messages": bad}], tok, bad_rows="skip"))
    assert len(kept) == 1 and kept[0].scored_tokens == 5  # still the generation mask, not the fallback's 7
