"""collate, pack_steps, split_rows and row_losses on the tiny Llama (float32, CPU)."""

import pytest

from helpers import DATA
from leadline.corpus import TokenizedRow, collate, pack_steps, row_losses, split_rows, tokenize_rows
from leadline.corpus.collate import block_causal_mask
from leadline.corpus.packing import pack_groups
from leadline.errors import InputError


@pytest.fixture(scope="module")
def rows(tokenizer):
    chats = list(tokenize_rows(DATA / "messages.jsonl", tokenizer))[:3]
    pcs = list(tokenize_rows(DATA / "prompt_completion.jsonl", tokenizer))[:3]
    return [chats[0], pcs[0], chats[1], pcs[1], pcs[2], chats[2]]


# ---- collate ------------------------------------------------------------------------------
def test_collate_pads_right_and_counts_on_the_host():
    a = TokenizedRow.from_labels([5, 6, 7], [-100, 6, 7])
    b = TokenizedRow.from_labels([8, 9], [8, 9])
    mb = collate([a, b], pad_id=0)
    assert isinstance(mb.scored_tokens, int) and mb.scored_tokens == 3  # 2 + 1
    assert mb.tokens == 5 and len(mb) == 2 and mb.length == 3
    assert mb.input_ids.tolist() == [[5, 6, 7], [8, 9, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert mb.labels.tolist() == [[-100, 6, 7], [8, 9, -100]]
    # the host count equals what the loss scores on the tensors, after the shift
    assert int((mb.labels[:, 1:] != -100).sum()) == mb.scored_tokens
    wide = collate([a, b], pad_id=0, pad_to=5)
    assert wide.length == 5 and wide.scored_tokens == 3
    moved = mb.to("cpu")
    assert moved.scored_tokens == 3 and moved.input_ids.device.type == "cpu"


def test_collate_refuses_what_it_cannot_build():
    a = TokenizedRow.from_labels([5, 6, 7], [5, 6, 7])
    with pytest.raises(InputError, match="does not fit pad_to=2"):
        collate([a], pad_id=0, pad_to=2)
    with pytest.raises(InputError, match="needs a pad id"):
        collate([a], pad_id=None)
    with pytest.raises(InputError, match="at least one row"):
        collate([], pad_id=0)


# ---- packing ------------------------------------------------------------------------------
def test_pack_groups_greedy_in_order():
    assert pack_groups([3, 4, 2, 5, 1], 6) == [[0], [1, 2], [3, 4]]
    assert pack_groups([9, 1], 4) == [[0], [1]]  # a row past seq_len is cut to it and fills a pack


def test_block_mask_keeps_rows_apart():
    import torch

    pos = torch.tensor([[0, 1, 2, 0, 1]])
    m = block_causal_mask(pos)[0, 0].int().tolist()
    assert m == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]
    add = block_causal_mask(pos, torch.float32)[0, 0]
    assert add[4, 3] == 0 and add[3, 2] == torch.finfo(torch.float32).min


def test_pack_steps_boundaries_and_counts(rows):
    packing = pack_steps(rows, 160)
    assert packing.attention == "block_mask" and packing.note is None
    assert sorted(i for b in packing for i in b.rows) == list(range(len(rows)))
    assert sum(b.scored_tokens for b in packing) == sum(r.scored_tokens for r in rows)
    for b in packing:
        assert b.length <= 160 and len(b) == 1
        pos = b.position_ids[0].tolist()
        starts = [i for i, p in enumerate(pos) if p == 0]
        assert len(starts) == len(b.rows)
        assert all(b.labels[0, s].item() == -100 for s in starts)  # no row predicted from the one before
        assert int((b.labels[:, 1:] != -100).sum()) == b.scored_tokens
    assert 0 < packing.fill <= 1


def _loss_and_grads(model, batches_and_weights):
    model.zero_grad(set_to_none=True)
    total_scored = sum(w for _, w in batches_and_weights)
    loss = sum(model(**kw).loss * w for kw, w in batches_and_weights) / total_scored
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(("impl", "attention"), [("sdpa", "auto"), ("eager", "auto"), ("sdpa", "varlen")])
def test_packed_loss_and_gradients_equal_rows_alone(tokenizer, rows, impl, attention):
    import torch

    from helpers import make_model

    model = make_model(vocab_size=len(tokenizer))
    model.set_attn_implementation(impl)
    alone = [({"input_ids": torch.tensor([r.input_ids]), "labels": torch.tensor([r.labels])}, r.scored_tokens) for r in rows]
    ref_loss, ref_grads = _loss_and_grads(model, alone)
    packing = pack_steps(rows, 160, model=model, attention=attention)
    assert len(packing) < len(rows)  # it did pack
    if attention == "auto":
        assert packing.attention == "block_mask"
        assert packing.batches[0].mask_dtype == (torch.float32 if impl == "eager" else None)
    packed = [(b.model_inputs(), b.scored_tokens) for b in packing]
    loss, grads = _loss_and_grads(model, packed)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for n, g in grads.items():
        torch.testing.assert_close(g, ref_grads[n], rtol=1e-4, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")
    # without the boundaries the same packs give another loss: the test can fail
    leaky = [({"input_ids": b.input_ids, "labels": b.labels}, b.scored_tokens) for b in packing]
    assert abs(_loss_and_grads(model, leaky)[0] - ref_loss) > 1e-4


def test_pack_steps_falls_back_with_a_note_for_other_attention(tokenizer, rows):
    class Cfg:
        _attn_implementation = "some_kernel"

    class M:
        config = Cfg()

    packing = pack_steps(rows, 160, model=M())
    assert packing.attention == "padded" and len(packing) == len(rows)
    assert "'some_kernel'" in packing.note and "not packed" in packing.note
    assert [b.rows for b in packing] == [(i,) for i in range(len(rows))]


def test_pack_steps_truncates_long_rows_and_checks_arguments(rows):
    packing = pack_steps(rows, 40)
    assert packing.truncated_rows == sum(1 for r in rows if len(r.input_ids) > 40)
    assert all(b.length <= 40 for b in packing)
    with pytest.raises(InputError, match="seq_len an int of at least 2"):
        pack_steps(rows, 1)
    with pytest.raises(InputError, match="attention='bogus'"):
        pack_steps(rows, 40, attention="bogus")


# ---- splits -------------------------------------------------------------------------------
def test_split_rows_is_seeded_disjoint_and_complete():
    s = split_rows(10, held_out=2, test=3, seed=0)
    assert (len(s.train), len(s.held_out), len(s.test)) == (5, 2, 3)
    assert sorted(s.train + s.held_out + s.test) == list(range(10))
    assert s == split_rows(10, held_out=2, test=3, seed=0)
    assert s != split_rows(10, held_out=2, test=3, seed=1)
    f = split_rows(100, held_out=0.1, test=0.25, seed=3)
    assert (len(f.held_out), len(f.test), len(f.train)) == (10, 25, 65)
    assert f.as_dict()["seed"] == 3 and f.as_dict()["test"] == f.test


def test_split_rows_refuses_impossible_sizes():
    with pytest.raises(InputError, match="leave none of the 4 rows to train on"):
        split_rows(4, held_out=2, test=2)
    with pytest.raises(InputError, match="must be below 1"):
        split_rows(10, held_out=1.0)
    with pytest.raises(InputError, match="an int >= 1"):
        split_rows(0)


# ---- per-row losses -----------------------------------------------------------------------
def test_row_losses_are_each_rows_own_mean_and_restore_training(tiny_model, rows):
    import torch

    tiny_model.train()
    got = row_losses(tiny_model, rows, micro_batch=4)
    assert tiny_model.training
    tiny_model.eval()
    with torch.no_grad():
        want = [tiny_model(input_ids=torch.tensor([r.input_ids]), labels=torch.tensor([r.labels])).loss.item() for r in rows]
    assert got == pytest.approx(want, rel=1e-4)
    assert row_losses(tiny_model, rows, micro_batch=1) == pytest.approx(want, rel=1e-5)


def test_row_losses_restore_the_mode_after_an_exception(tiny_model, rows):
    tiny_model.train()
    bad = [*rows[:1], TokenizedRow([1, 2], [1, 2], 1), TokenizedRow.from_labels([1, 999_999], [1, 999_999])]
    with pytest.raises(IndexError):
        row_losses(tiny_model, bad, micro_batch=8)
    assert tiny_model.training
    with pytest.raises(InputError, match="has no scored token"):
        row_losses(tiny_model, [TokenizedRow.from_labels([1, 2], [-100, -100])])


def test_split_reader_reads_the_held_out_rows(tiny_model, rows):
    s = split_rows(len(rows), held_out=2, test=1, seed=0)
    read = s.reader(tiny_model, rows, "held_out", micro_batch=2)
    losses = read()
    assert len(losses) == 2
    assert losses == pytest.approx(row_losses(tiny_model, [rows[i] for i in s.held_out]), rel=1e-6)


def _one_by_one(model, rows):
    import torch

    model.eval()
    with torch.no_grad():
        return [model(input_ids=torch.tensor([r.input_ids]), labels=torch.tensor([r.labels])).loss.item() for r in rows]


def test_row_losses_in_forwards_of_max_tokens_match_row_by_row(tiny_model, rows):
    want = _one_by_one(tiny_model, rows)
    longest = max(len(r.input_ids) for r in rows)
    for budget in (1, longest, 2 * longest, 10**6):  # one row a forward ... every row in one
        assert row_losses(tiny_model, rows, max_tokens=budget) == pytest.approx(want, rel=1e-4)
    with pytest.raises(InputError, match="max_tokens an int >= 1"):
        row_losses(tiny_model, rows, max_tokens=0)


class _NoKeep:
    """The tiny model behind a forward that does not take logits_to_keep (the full-logits path),
    counting its forwards and the rows each held; ``fail_above`` rows raise an OOM."""

    def __init__(self, model, fail_above=None):
        self.model, self.fail_above, self.calls = model, fail_above, []
        self.training = model.training

    def parameters(self):
        return self.model.parameters()

    def eval(self):
        self.training = False
        self.model.eval()

    def train(self, mode=True):
        self.training = mode
        self.model.train(mode)

    def __call__(self, input_ids, attention_mask):
        import torch

        self.calls.append(int(input_ids.shape[0]))
        if self.fail_above is not None and input_ids.shape[0] > self.fail_above:
            raise torch.OutOfMemoryError("CUDA out of memory (a test's)")
        return self.model(input_ids=input_ids, attention_mask=attention_mask)


def test_row_losses_without_logits_to_keep_and_after_an_oom_halve_the_forward(tiny_model, rows):
    want = _one_by_one(tiny_model, rows)
    plain = _NoKeep(tiny_model)
    assert row_losses(plain, rows) == pytest.approx(want, rel=1e-4)
    assert plain.calls == [len(rows)]  # the default budget holds these rows in one forward
    tight = _NoKeep(tiny_model, fail_above=2)
    tight.train()
    assert row_losses(tight, rows) == pytest.approx(want, rel=1e-4)
    assert tight.calls == [6, 3, 1, 2, 3, 1, 2] and tight.training  # 6 -> 3 + 3, each 3 -> 1 + 2
    one = _NoKeep(tiny_model, fail_above=0)  # not even one row fits: the OOM is the caller's
    import torch

    with pytest.raises(torch.OutOfMemoryError):
        row_losses(one, rows)
