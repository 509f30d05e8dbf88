"""Reading rows: the formats, the fields mapping, and bad input named by file and line."""

import json

import pytest

from helpers import DATA
from leadline.corpus import read_rows
from leadline.corpus.rows import detect
from leadline.errors import InputError


def write(tmp_path, lines, name="d.jsonl"):
    p = tmp_path / name
    p.write_text("".join(line + "\n" for line in lines))
    return p


def test_every_shipped_format_is_detected():
    kinds = {
        "text": "text",
        "prompt_completion": "prompt_completion",
        "messages": "messages",
        "instruction": "instruction",
        "question_answer": "question_answer",
        "tokenized": "tokenized",
    }
    for name, kind in kinds.items():
        rows = list(read_rows(DATA / f"{name}.jsonl"))
        assert rows and {r.kind for r in rows} == {kind}, name
        assert rows[0].where.endswith(f"{name}.jsonl line 1")


def test_detection_order():
    assert detect({"input_ids": [1], "text": "x"}) == "tokenized"
    assert detect({"prompt": [{"role": "user", "content": "a"}], "completion": [{"role": "assistant", "content": "b"}]}) == "chat_prompt_completion"
    assert detect({"prompt": "a"}) is None


def test_bad_line_names_file_and_line():
    with pytest.raises(InputError) as e:
        list(read_rows(DATA / "bad_line.jsonl"))
    msg = str(e.value)
    assert "bad_line.jsonl line 2 is not JSON" in msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"foo": 1}', "has none of the known fields (it has foo;"),
        ('{"prompt": "a", "completion": ""}', "has an empty completion"),
        ('{"prompt": "a", "completion": "   "}', "has an empty completion"),
        ('{"text": 5}', "has a 'text' that is a number"),
        ("[1, 2]", "is a JSON list, not an object"),
        ('{"messages": [{"role": "user", "content": "a"}]}', "has no assistant turn"),
        ('{"messages": [{"role": "user"}]}', "has messages[0] without a 'role' and a text 'content'"),
        ('{"input_ids": [1, 2], "labels": [-100, -100]}', "has every label after the first at -100 (nothing to score)"),
        ('{"input_ids": [1, 2], "labels": [1]}', "has 'labels' that are not a list of 2 ints"),
        ('{"input_ids": [1, 2], "labels": [1, -1]}', "has 'labels' that are not a list of 2 ints"),
    ],
)
def test_each_kind_of_bad_row_is_one_sentence_with_its_line(tmp_path, line, says):
    p = write(tmp_path, ['{"text": "fine"}', line])
    with pytest.raises(InputError) as e:
        list(read_rows(p))
    assert f"d.jsonl line 2 {says}" in str(e.value)
    assert "\n" not in str(e.value)


def test_report_mode_counts_every_bad_row_without_stopping(tmp_path):
    p = write(tmp_path, ['{"text": "a"}', "{oops", '{"foo": 1}', '{"text": "b"}', '{"prompt": "p", "completion": ""}', "nope"])
    with pytest.raises(InputError) as e:
        list(read_rows(p, bad_rows="report"))
    msg = str(e.value)
    assert msg.startswith("4 rows of ")
    assert "line 2 is not JSON" in msg and "line 3 has none of the known fields" in msg and "and 1 more" in msg


def test_skip_mode_drops_bad_rows(tmp_path):
    p = write(tmp_path, ['{"text": "a"}', "{oops", '{"text": "b"}'])
    assert [r.data["text"] for r in read_rows(p, bad_rows="skip")] == ["a", "b"]


def test_empty_and_missing_files(tmp_path):
    p = write(tmp_path, ["", "  "])
    with pytest.raises(InputError, match="holds no rows"):
        list(read_rows(p))
    with pytest.raises(InputError, match="does not exist"):
        list(read_rows(tmp_path / "missing.jsonl"))
    with pytest.raises(InputError, match="holds no rows"):
        list(read_rows([]))


def test_blank_lines_keep_line_numbers(tmp_path):
    p = write(tmp_path, ['{"text": "a"}', "", '{"bad": 1}'])
    with pytest.raises(InputError, match="line 3 has none"):
        list(read_rows(p))


def test_fields_map_other_keys_and_unused_keys_are_counted(tmp_path):
    from leadline.corpus.rows import RowReader

    rows = [{"question": "q", "answer": "7", "answer_cot": "3 + 4 = 7", "template": 81}]
    reader = RowReader(rows, fields={"completion": "answer_cot", "prompt": "question"})
    (ex,) = list(reader)
    assert ex.kind == "prompt_completion" and ex.data == {"prompt": "q", "completion": "3 + 4 = 7"}
    assert dict(reader.ignored) == {"answer": 1, "template": 1}
    with pytest.raises(InputError, match="a role is one of"):
        RowReader(rows, fields={"nonsense": "answer"})


def test_in_memory_rows_are_named_by_index_and_hashed_like_provenance():
    from leadline.corpus.rows import RowReader
    from leadline.provenance import content_hash

    rows = [{"text": "a"}, {"text": "b"}]
    reader = RowReader(rows)
    assert [e.where for e in reader] == ["rows[0]", "rows[1]"]
    assert reader.sha256 == content_hash(rows)
    with pytest.raises(InputError, match=r"rows\[1\] has an empty text"):
        list(read_rows([{"text": "a"}, {"text": ""}]))


def test_file_hash_is_the_file_bytes(tmp_path):
    from leadline.corpus.rows import RowReader
    from leadline.provenance import content_hash

    p = write(tmp_path, [json.dumps({"text": "a"}), "", json.dumps({"text": "b"})])
    reader = RowReader(p)
    list(reader)
    assert reader.sha256 == content_hash(p)
