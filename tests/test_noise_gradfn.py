"""ModelGradFn on the offline tiny Llama: the gradient of the mean loss, the model left as found."""

from dataclasses import dataclass

import pytest
import torch

from leadline.errors import InputError
from leadline.lookahead.noise import ModelGradFn, measure_noise_scale


@dataclass
class MicroBatch:
    """The corpus's MicroBatch shape: tensors plus a host int."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    scored_tokens: int


def batches(vocab, n=8, rows=2, length=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(1, vocab, (rows, length), generator=gen)
        mask = torch.ones_like(ids)
        labels = ids.clone()
        labels[:, : 3 + i % 4] = -100  # a prompt of varying length: unequal scored tokens
        mask[1, length - 2:] = 0
        labels[1, length - 2:] = -100
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_gradient_of_the_mean_loss_and_the_model_left_as_found(tiny_model):
    model = tiny_model
    data = batches(model.config.vocab_size)
    params = [p for p in model.parameters() if p.requires_grad]
    # a half-accumulated step on some tensors, None on the others
    for p in params[::2]:
        p.grad = torch.full_like(p, 0.25)
    before_grads = [None if p.grad is None else p.grad.clone() for p in params]
    before_objs = [p.grad for p in params]
    weights = snapshot(model)

    grads, scored = ModelGradFn(model, lambda i: data[i])(3)

    assert scored == int((data[3]["labels"][..., 1:] != -100).sum())
    for p, g0, obj in zip(params, before_grads, before_objs):
        assert p.grad is obj
        assert (g0 is None and p.grad is None) or torch.equal(p.grad, g0)
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())
    # the same as a plain backward of model(**batch).loss, the mean over scored tokens
    for p in params:
        p.grad = None
    model(**data[3]).loss.backward()
    assert len(grads) == len(params)
    for g, p in zip(grads, params):
        torch.testing.assert_close(g, p.grad)


def test_micro_batch_objects_subsets_and_row_losses(tiny_model):
    model = tiny_model
    raw = batches(model.config.vocab_size, n=2)
    objs = [MicroBatch(**b, scored_tokens=int((b["labels"][..., 1:] != -100).sum())) for b in raw]
    head = [model.model.layers[0].self_attn.q_proj.weight]
    grads, scored = ModelGradFn(model, lambda i: objs[i], params=head)(0)
    assert len(grads) == 1 and scored == objs[0].scored_tokens
    assert all(p.grad is None for p in model.parameters())

    def row_losses(m, b):  # per-row SUM over scored tokens
        logits = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1]
        lab = b["labels"][:, 1:]
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), lab.clamp(min=0), reduction="none")
        return (ce * (lab != -100)).sum(dim=1)

    via_rows, _ = ModelGradFn(model, lambda i: raw[i], params=head, row_losses=row_losses)(0)
    torch.testing.assert_close(via_rows[0], grads[0])


def test_data_running_out_and_empty_micro_batches(tiny_model):
    data = batches(tiny_model.config.vocab_size, n=3)
    fn = ModelGradFn(tiny_model, lambda i: data[i])  # IndexError past the end
    assert fn(3) is None
    assert ModelGradFn(tiny_model, lambda i: None)(0) is None
    empty = dict(data[0], labels=torch.full_like(data[0]["labels"], -100))
    assert ModelGradFn(tiny_model, lambda i: empty)(0) == ([], 0)
    with pytest.raises(InputError, match="dict of model inputs"):
        ModelGradFn(tiny_model, lambda i: [1, 2])(0)
    frozen = [p.requires_grad_(False) for p in tiny_model.parameters()]
    with pytest.raises(InputError, match="no trained tensors"):
        ModelGradFn(tiny_model, lambda i: data[i])
    assert frozen


@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers 5 renames it; 4.x and 5.x both have this one
def test_reentrant_checkpointing_falls_back_and_still_restores_grads(tiny_model):
    model = tiny_model
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.train()
    data = batches(model.config.vocab_size, n=2)
    params = [p for p in model.parameters() if p.requires_grad]
    params[0].grad = torch.ones_like(params[0])
    fn = ModelGradFn(model, lambda i: data[i])
    grads, _ = fn(0)
    assert fn.via_backward  # autograd.grad cannot run through re-entrant checkpoints
    assert torch.equal(params[0].grad, torch.ones_like(params[0]))
    assert all(p.grad is None for p in params[1:])
    model.gradient_checkpointing_disable()
    plain, _ = ModelGradFn(model, lambda i: data[i])(0)
    for a, b in zip(grads, plain):
        torch.testing.assert_close(a, b)


def test_the_probe_runs_on_the_model_and_stops_when_the_data_does(tiny_model):
    data = batches(tiny_model.config.vocab_size, n=10)
    weights = snapshot(tiny_model)
    r = measure_noise_scale(ModelGradFn(tiny_model, lambda i: data[i]))
    assert r.stopped_because in {"data", "settled"} and r.k <= 10
    assert r.micro_tokens == [int((b["labels"][..., 1:] != -100).sum()) for b in data[: r.k]]
    assert r.estimate.s is not None and r.estimate.s > 0
    assert all(torch.equal(p, weights[n]) for n, p in tiny_model.named_parameters())
    assert all(p.grad is None for p in tiny_model.parameters())
