from helpers import DATA, make_model, make_tokenizer


def test_ramp_loss_at_a_mix_length_shorter_than_the_longest_row():
    """The ramp runs through the corpus's own lengths: rows longer than one are cut to it."""
    import torch

    from leadline.hf import prepare

    tok = make_tokenizer()
    task, prof = prepare(make_model(vocab_size=len(tok)), tok, str(DATA / "text.jsonl"))
    short = min(len(r.input_ids) for r in task.rows) + 2
    assert short < prof.seq_len
    assert torch.isfinite(task.loss_of(3, short))
    assert torch.isfinite(task.loss_of(2, prof.seq_len))
