"""profile_corpus: known answers on hand-made rows, truncation, the length rules, the values."""

import pytest

from helpers import DATA
from leadline.corpus import lengths as L
from leadline.corpus import profile_corpus, tokenize_rows
from leadline.errors import InputError

# "Section:" + " games" -> 8 prompt tokens, then Ġgames and the EOS: 10 tokens, 2 scored.
# "the quick brown fox" -> 6 pieces + EOS: 7 tokens, 6 scored.
PC = {"prompt": "Section:", "completion": " games"}
TEXT = {"text": "the quick brown fox"}


def test_length_math_known_answers():
    lengths = {10: 3, 20: 1}
    assert L.length_at_quantile(lengths, 0.75) == 10
    assert L.length_at_quantile(lengths, 0.76) == 20
    assert L.length_at_quantile(lengths, 1.0) == 20
    assert L.tokens_kept(lengths, 15) == 3 * 10 + 15
    assert L.count_at_or_above({1: 4, 5: 2, 9: 1}, 5) == 3
    assert L.quantiles({1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1, 9: 1, 10: 1}) == {"min": 1, "p10": 1, "p50": 5, "p90": 9, "max": 10}
    assert L.binned({1: 2, 2: 1, 40: 1}, bins=2) == [{"lo": 1, "hi": 20, "rows": 3}, {"lo": 21, "hi": 40, "rows": 1}]
    with pytest.raises(InputError, match="quantile must be in"):
        L.length_at_quantile(lengths, 0)


def test_profile_of_hand_counted_rows(tokenizer):
    p = profile_corpus([PC, TEXT, PC], tokenizer)
    assert p.rows == 3
    assert p.tokens_read == 10 + 7 + 10
    assert p.scored_tokens == 2 + 6 + 2
    assert p.scored_tokens_per_row == pytest.approx(10 / 3)
    assert p.seq_len == 10 and p.seq_len_rule == "longest"
    assert p.truncated_rows == 0 and p.truncated_scored_tokens == 0
    assert p.formats == {"prompt_completion": 2, "text": 1}
    assert p.scored_per_row == {"min": 2, "p10": 2, "p50": 2, "p90": 6, "max": 6}


def test_a_row_cut_by_truncation(tokenizer):
    # at 9 tokens each prompt/completion row loses its EOS (1 scored token); the text row is whole
    p = profile_corpus([PC, TEXT, PC], tokenizer, seq_len=9)
    assert p.seq_len_rule == "given"
    assert p.tokens_read == 9 + 7 + 9
    assert p.truncated_rows == 2
    assert p.truncated_scored_tokens == 2
    assert p.scored_tokens == 8 and p.scored_tokens_untruncated == 10
    assert p.truncated_scored_share == pytest.approx(0.2)
    # the same count as truncating the rows one by one
    rows = list(tokenize_rows([PC, TEXT, PC], tokenizer))
    assert sum(r.truncated(9).scored_tokens for r in rows) == p.scored_tokens


def test_quantile_length_and_rows_left_with_nothing_to_score(tokenizer):
    # lengths 7, 10, 10, 10: the 0.25 quantile is 7; each prompt/completion row keeps 7 prompt tokens
    p = profile_corpus([TEXT, PC, PC, PC], tokenizer, quantile=0.25)
    assert p.seq_len == 7 and p.seq_len_rule == "quantile"
    assert p.unscored_rows == 3 and p.truncated_rows == 3
    assert p.scored_tokens == 6 and p.truncated_scored_tokens == 6 and p.truncated_scored_share == pytest.approx(0.5)
    assert "3 rows have nothing left to score" in p.describe()


def test_prompt_past_a_given_length_is_a_bad_row_naming_it(tokenizer):
    with pytest.raises(InputError, match=r"rows\[1\] has 8 tokens before its first scored token, so at seq_len 8 nothing is left to score"):
        profile_corpus([TEXT, PC], tokenizer, seq_len=8)
    p = profile_corpus([TEXT, PC], tokenizer, seq_len=8, bad_rows="skip")
    assert p.rows == 1 and p.skipped_rows == 1
    with pytest.raises(InputError, match=r"^2 rows of the rows given cannot be used"):
        profile_corpus([TEXT, PC, PC], tokenizer, seq_len=8, bad_rows="report")


def test_no_scored_token_is_refused(tokenizer):
    # derive refuses such a corpus: profile_corpus raises instead of returning zero scored tokens
    with pytest.raises(InputError, match="has no usable row"):
        profile_corpus([{"input_ids": [1, 2], "labels": [-100, -100]}], None, bad_rows="skip")
    with pytest.raises(InputError, match=r"has no usable row \(1 row of the rows given cannot be used \(rows\[0\] has 8 tokens"):
        profile_corpus([PC], tokenizer, seq_len=8, bad_rows="skip")


def test_arguments_are_checked(tokenizer):
    with pytest.raises(InputError, match="not both"):
        profile_corpus([TEXT], tokenizer, seq_len=10, quantile=0.5)
    with pytest.raises(InputError, match="seq_len must be an int"):
        profile_corpus([TEXT], tokenizer, seq_len=1)
    with pytest.raises(InputError, match="quantile must be in"):
        profile_corpus([TEXT], tokenizer, quantile=1.5)


def test_values_carry_kind_source_and_evidence(tokenizer):
    p = profile_corpus(DATA / "prompt_completion.jsonl", tokenizer, quantile=0.5)
    v = p.as_values()
    assert set(v) == {"rows", "tokens_read", "scored_tokens", "scored_tokens_per_row", "seq_len"}
    assert v["seq_len"].kind == "derived" and v["seq_len"].evidence["quantile"] == 0.5
    assert v["seq_len"].evidence["truncated_scored_share"] == p.truncated_scored_share
    assert v["scored_tokens"].kind == "measured" and "prompt/completion" in v["scored_tokens"].evidence["loss_policy"][0]
    assert v["scored_tokens_per_row"].value == pytest.approx(p.scored_tokens / p.rows)
    assert profile_corpus([TEXT], tokenizer).as_values()["seq_len"].kind == "measured"
    assert profile_corpus([TEXT], tokenizer, seq_len=64).as_values()["seq_len"].kind == "given"
    assert p.data["rows"] == p.rows and len(p.data["sha256"]) == 64


def test_profile_matches_tokenize_rows_on_every_shipped_file(tokenizer):
    for name in ("text", "prompt_completion", "messages", "instruction", "question_answer", "tokenized"):
        rows = list(tokenize_rows(DATA / f"{name}.jsonl", tokenizer))
        p = profile_corpus(DATA / f"{name}.jsonl", tokenizer, batch_size=7)
        assert p.rows == len(rows)
        assert p.scored_tokens == sum(r.scored_tokens for r in rows), name
        assert p.tokens_read == sum(len(r.input_ids) for r in rows)
        assert p.seq_len == max(len(r.input_ids) for r in rows)
        assert p.describe().count("\n") >= 8


def test_ignored_fields_are_reported(tmp_path, tokenizer):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "a b", "label": "games"}\n{"text": "c d", "label": "net"}\n')
    prof = profile_corpus(p, tokenizer)
    assert prof.ignored_fields == {"label": 2}
    assert "label (2 rows)" in prof.describe()
    mapped = profile_corpus(p, tokenizer, fields={"prompt": "text", "completion": "label"})
    assert mapped.formats == {"prompt_completion": 2} and mapped.ignored_fields == {}


def test_profile_streams_memory_does_not_grow_with_rows():
    import tracemalloc

    def rows(n):
        for i in range(n):
            k = 8 + i % 24
            yield {"input_ids": list(range(1, k + 1)), "labels": [-100] * 4 + list(range(5, k + 1))}

    def peak(make_rows):
        tracemalloc.start()
        try:
            p = profile_corpus(make_rows(), None, batch_size=50)
            return tracemalloc.get_traced_memory()[1], p
        finally:
            tracemalloc.stop()

    profile_corpus(rows(10), None)  # imports (numpy) outside the measurement
    small, _ = peak(lambda: rows(250))
    big, p = peak(lambda: rows(2_000))
    assert p.rows == 2_000
    assert big < 1.5 * small, (small, big)
    # the same rows held in a list take several times that: the measurement can tell
    held, _ = peak(lambda: list(rows(2_000)))
    assert held > 3 * small, (small, held)
