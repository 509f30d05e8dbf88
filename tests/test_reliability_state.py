"""What a run leaves behind: files with the mode open() would give them, symbolic links written
through, the caller's RNG as it was, a resume file that belongs to its seed, and a length
bounded by the model's positions."""

from __future__ import annotations

import json
import os
import random
import shutil
import stat

import pytest

from helpers import DATA, FakeClock, install_clock, make_model, make_tokenizer
from leadline import InputError, Plan, Value
from leadline._io import write_atomic


@pytest.fixture()
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_file_gets_0644_under_umask_022_like_open(tmp_path, umask_022):
    path = write_atomic(tmp_path / "p.json", "{}")
    with open(tmp_path / "by_open.json", "w") as f:
        f.write("{}")
    assert _mode(path) == 0o644 == _mode(tmp_path / "by_open.json")
    os.umask(0o077)
    assert _mode(write_atomic(tmp_path / "private.json", "{}")) == 0o600


def test_a_replaced_file_keeps_its_mode(tmp_path, umask_022):
    path = tmp_path / "plan.json"
    path.write_text("old")
    os.chmod(path, 0o640)
    Plan().to_json(path)
    assert _mode(path) == 0o640 and json.loads(path.read_text())["leadline_plan"]
    os.chmod(path, 0o664)
    write_atomic(path, b"bytes")
    assert _mode(path) == 0o664 and path.read_bytes() == b"bytes"


def test_a_symlinked_out_writes_its_target_and_stays_a_link(tmp_path, umask_022):
    target = tmp_path / "real" / "plan.json"
    target.parent.mkdir()
    target.write_text("old")
    os.chmod(target, 0o600)
    link = tmp_path / "plan.json"
    link.symlink_to(target)
    assert write_atomic(link, "new") == link
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new" and _mode(target) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["plan.json"]  # no temporary left beside it
    dangling = tmp_path / "later.json"
    dangling.symlink_to(tmp_path / "real" / "later.json")
    write_atomic(dangling, "made")
    assert dangling.is_symlink() and (tmp_path / "real" / "later.json").read_text() == "made"


def test_a_folder_is_refused_and_nothing_is_left(tmp_path):
    (tmp_path / "adir").mkdir()
    with pytest.raises(InputError, match="is a folder"):
        write_atomic(tmp_path / "adir", "x")
    with pytest.raises(InputError, match="does not exist"):
        write_atomic(tmp_path / "nodir" / "p.json", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"] and not any((tmp_path / "adir").iterdir())


def _lora(model, r: int = 4):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", lora_dropout=0.0,
                                            task_type="CAUSAL_LM"))


def test_derive_for_with_fit_rank_leaves_the_global_rng_as_it_found_it():
    pytest.importorskip("peft")
    import numpy as np
    import torch

    from leadline.hf import DeriveOptions, derive_for

    tok = make_tokenizer()
    model = _lora(make_model(vocab_size=len(tok)))
    torch.manual_seed(1234)
    random.seed(5)
    np.random.seed(6)
    before = (torch.get_rng_state().clone(), random.getstate(), np.random.get_state()[1].copy())
    plan = derive_for(model, tok, str(DATA / "prompt_completion.jsonl"), total_steps=6, effort="full",
                      options=DeriveOptions(fit_rank=True))
    assert "lora_rank_fit" in plan  # the probe adapters were made (their init draws from torch's generator)
    assert torch.equal(torch.get_rng_state(), before[0])
    assert random.getstate() == before[1] and (np.random.get_state()[1] == before[2]).all()


def test_a_resume_file_from_another_seed_is_refused(tmp_path):
    pytest.importorskip("peft")
    from leadline.hf import DeriveOptions, derive_for

    tok = make_tokenizer()
    data, resume, kept = str(DATA / "prompt_completion.jsonl"), tmp_path / "derive.json", tmp_path / "cut.json"

    def keep(ev):  # the resume file as a cut-off derive would leave it, after its first phase
        if ev.get("status") == "done" and resume.exists() and not kept.exists():
            shutil.copy(resume, kept)

    plan = derive_for(_lora(make_model(vocab_size=len(tok))), tok, data, total_steps=6, effort="full", seed=0,
                      options=DeriveOptions(resume=resume, on_progress=keep))
    assert kept.exists() and plan.held_out["seed"] == 0
    with pytest.raises(InputError, match=r"different run \(.*seed.*differ"):
        derive_for(_lora(make_model(vocab_size=len(tok))), tok, data, total_steps=6, effort="full", seed=1,
                   options=DeriveOptions(resume=kept))


def _enormous(tmp_path, words: int = 20000):
    rows = [json.loads(line) for line in (DATA / "prompt_completion.jsonl").read_text().splitlines()]
    rows.append({"prompt": "play level " * words, "completion": " games"})
    path = tmp_path / "enormous.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_length_is_cut_to_the_models_positions_with_the_share_it_costs(tmp_path, tokenizer):
    from leadline.corpus import profile_corpus

    path = _enormous(tmp_path)
    prof = profile_corpus(path, tokenizer, positions=512)
    assert prof.longest > 10_000 and prof.seq_len == 512 and prof.seq_len_rule == "positions"
    assert prof.truncated_rows == 1 and 0 < prof.truncated_scored_share < 0.1
    seq = prof.as_values()["seq_len"]
    assert seq.kind == "derived" and "max_position_embeddings 512" in seq.source
    assert f"{prof.truncated_scored_share:.2%} of the scored tokens" in seq.source
    assert profile_corpus(path, tokenizer, quantile=0.5, positions=512).seq_len < 512  # a shorter rule stands
    with pytest.raises(InputError, match="longer than the model's positions"):
        profile_corpus(path, tokenizer, seq_len=4096, positions=512)


def test_one_enormous_row_ends_in_a_plan_within_max_seconds(tmp_path, monkeypatch):
    pytest.importorskip("peft")
    from leadline.hf import DeriveOptions, derive_for

    clock = install_clock(monkeypatch, FakeClock(tick=1e-4))  # every reading 0.1 ms: the same cut on every machine
    tok = make_tokenizer()
    model = _lora(make_model(vocab_size=len(tok), positions=128))  # the other rows' longest is 113 tokens
    t0 = clock()
    plan = derive_for(model, tok, str(_enormous(tmp_path)), total_steps=6, effort="full",
                      options=DeriveOptions(max_seconds=60))
    assert clock() - t0 <= 60
    assert plan.seq_len == 128 and plan["seq_len"].evidence["rule"] == "positions"


def test_mixed_formats_are_said_in_the_profile_and_the_plan(tmp_path, tokenizer):
    from leadline.corpus import profile_corpus

    rows = [json.loads(line) for line in (DATA / "prompt_completion.jsonl").read_text().splitlines()]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r if i % 2 else {"text": r["prompt"] + r["completion"]}) + "\n"
                            for i, r in enumerate(rows)))
    prof = profile_corpus(path, tokenizer)
    assert prof.mixed_formats and "mix formats (text 20, prompt/completion 20)" in prof.mixed_formats
    assert prof.mixed_formats in prof.describe() and prof.mixed_formats in prof.as_values()["rows"].source
    assert profile_corpus(DATA / "prompt_completion.jsonl", tokenizer).mixed_formats is None


def test_a_plan_value_of_the_wrong_type_is_refused_by_the_cli_reader(tmp_path):
    from leadline.cli._common import read_plan

    p = Plan()
    p.set("micro_batch", Value(2, "measured", "the ramp kept 2 rows"))
    d = p.to_dict()
    d["values"]["micro_batch"]["value"] = True
    (tmp_path / "p.json").write_text(json.dumps(d))
    with pytest.raises(InputError, match="micro_batch is True"):
        read_plan("--plan", str(tmp_path / "p.json"))


def test_the_ram_bound_turns_an_allocation_past_the_ram_into_an_error_and_is_lifted_after():
    import subprocess
    import sys

    code = (
        "import resource, torch\n"
        "from leadline.cli._common import ram_bound\n"
        "from leadline.memory_readings import host_memory_bytes, is_oom\n"
        "before = resource.getrlimit(resource.RLIMIT_DATA)\n"
        "available = host_memory_bytes()[0]\n"
        "with ram_bound('cpu', share=0.05) as bound:\n"
        "    try:\n"
        "        torch.empty(2 * available, dtype=torch.uint8)\n"
        "        print('ALLOCATED')\n"
        "    except BaseException as e:\n"
        "        print('REFUSED', is_oom(e))\n"
        "    small = torch.ones(1_000_000)\n"
        "print('BOUND', bound is not None, 'RESTORED', resource.getrlimit(resource.RLIMIT_DATA) == before)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "REFUSED True" in out.stdout and "BOUND True RESTORED True" in out.stdout, out.stdout + out.stderr


def test_the_systems_enomem_is_an_out_of_memory_sentence_and_another_os_error_is_not(tmp_path, monkeypatch, capsys):
    """Under the RAM bound Python itself can be refused (an import's directory listing: OSError
    ENOMEM, not MemoryError): the same sentence and exit 2; a missing file stays what it is."""
    import errno

    import leadline.cli._common as common
    from helpers import save_model_dir
    from leadline.cli import main
    from leadline.memory_readings import is_oom

    assert is_oom(OSError(errno.ENOMEM, "Cannot allocate memory")) and not is_oom(OSError(errno.ENOENT, "gone"))
    model = save_model_dir(tmp_path / "tiny")
    argv = ["derive", "--model", str(model), "--device", "cpu", "--steps", "4", "--data",
            str(DATA / "prompt_completion.jsonl"), "--out", str(tmp_path / "p.json")]

    def refused(args):
        raise OSError(errno.ENOMEM, "Cannot allocate memory", "/site-packages/transformers")

    monkeypatch.setattr(common, "load_for_training", refused)
    assert main(argv) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("leadline")]
    assert len(said) == 1 and "ran out of memory" in said[0] and "Cannot allocate memory" in said[0], said
    assert not (tmp_path / "p.json").exists()

    def gone(args):
        raise FileNotFoundError(errno.ENOENT, "No such file", "weights.safetensors")

    monkeypatch.setattr(common, "load_for_training", gone)
    with pytest.raises(FileNotFoundError):
        main(argv)


def test_derive_out_of_ram_is_one_sentence_exit_2_and_no_plan(tmp_path):
    import subprocess
    import sys

    from helpers import save_model_dir

    model = save_model_dir(tmp_path / "tiny")
    out = tmp_path / "p.json"
    code = (
        "import sys, leadline.cli._common as c\n"
        "c.RAM_SHARE = 0.0  # no room at all: the first allocation past what the process holds fails\n"
        "from leadline.cli import main\n"
        f"sys.exit(main(['derive', '--model', {str(model)!r}, '--device', 'cpu', '--steps', '4', "
        f"'--data', {str(DATA / 'prompt_completion.jsonl')!r}, '--out', {str(out)!r}]))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    said = [line for line in r.stderr.splitlines() if line.startswith("leadline")]
    assert r.returncode == 2 and len(said) == 1 and "ran out of memory" in said[0] and "--seq-len" in said[0], r.stderr
    assert "Traceback" not in r.stderr and not out.exists()
