"""``leadline corpus``: the profile printed, bad input one sentence and exit 2, nothing written."""

import json
import subprocess
import sys

import pytest

from helpers import DATA, make_tokenizer
from leadline.cli import main


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    make_tokenizer().save_pretrained(d)
    return d


def test_import_corpus_loads_no_torch():
    code = "import sys, leadline, leadline.corpus, leadline.cli.corpus\nprint('HEAVY', [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


def test_lazy_names_resolve():
    import leadline

    for name in ("profile_corpus", "CorpusProfile", "read_rows", "tokenize_rows", "collate", "pack_steps", "split_rows"):
        assert getattr(leadline, name) is getattr(leadline.corpus, name)


def test_cli_prints_the_profile(tok_dir, capsys):
    assert main(["corpus", str(DATA / "messages.jsonl"), "--tokenizer", str(tok_dir)]) == 0
    out = capsys.readouterr().out
    assert "scored tokens" in out and "the longest row" in out and "generation mask" in out


def test_cli_quantile_and_json(tok_dir, capsys):
    assert main(["corpus", str(DATA / "prompt_completion.jsonl"), "--tokenizer", str(tok_dir), "--quantile", "0.5", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["seq_len_rule"] == "quantile" and d["rows"] == 40 and d["truncated_rows"] > 0


def test_cli_fields(tmp_path, tok_dir, capsys):
    p = tmp_path / "d.jsonl"
    p.write_text('{"question": "Section:", "answer": "7", "answer_cot": " games"}\n')
    assert main(["corpus", str(p), "--tokenizer", str(tok_dir), "--field", "prompt=question", "--field", "completion=answer_cot", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["scored_tokens"] == 2 and d["ignored_fields"] == {"answer": 1}


def test_cli_field_alone_names_the_text(tmp_path, tok_dir, capsys):
    p = tmp_path / "d.jsonl"
    p.write_text('{"body": "the cat sat", "id": 1}\n')
    assert main(["corpus", str(p), "--tokenizer", str(tok_dir), "--field", "body", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["formats"] == {"text": 1} and d["ignored_fields"] == {"id": 1}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["bad_line.jsonl"], "bad_line.jsonl line 2 is not JSON"),
        (["missing.jsonl"], "does not exist"),
        (["text.jsonl", "--seq-len", "1"], "seq_len must be an int of at least 2"),
        (["text.jsonl", "--field", "=text"], "is not KEY or ROLE=KEY"),
        (["text.jsonl", "--field", "nonsense=text"], "'nonsense' is not a role leadline reads"),
    ],
)
def test_cli_bad_input_is_one_sentence_exit_2(tmp_path, tok_dir, capsys, args, says):
    before = sorted(tmp_path.iterdir())
    argv = ["corpus", str(DATA / args[0]), "--tokenizer", str(tok_dir), *args[1:]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
    assert sorted(tmp_path.iterdir()) == before


def test_cli_report_mode_counts_all(tmp_path, tok_dir, capsys):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "a"}\n{bad\n{"foo": 1}\n')
    assert main(["corpus", str(p), "--tokenizer", str(tok_dir), "--bad-rows", "report"]) == 2
    assert "leadline corpus: 2 rows of" in capsys.readouterr().err
