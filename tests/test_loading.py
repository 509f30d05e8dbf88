import pytest

from helpers import save_model_dir
from leadline.errors import InputError
from leadline.hf.loading import load_model, load_tokenizer


def test_load_folder_written_by_save_pretrained(tmp_path):
    import torch

    d = save_model_dir(tmp_path / "m")
    tok = load_tokenizer(d)
    model = load_model(d, device="cpu")
    assert tok.pad_token is not None
    assert next(model.parameters()).dtype == torch.float32
    enc = tok(["science games"], return_tensors="pt")
    assert torch.isfinite(model(**enc, labels=enc["input_ids"]).loss)


def test_missing_or_wrong_paths_are_one_sentence(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(InputError, match="does not exist"):
        load_tokenizer(tmp_path / "nope.gguf")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"no config\.json"):
        load_tokenizer(tmp_path / "empty")
