"""The DDP communication hook, in this process (a gloo group of one: no spawn): what it reads
from each bucket is the gradient's own numbers, across DDP's bucket rebuild, and DDP's result
is left as the plain all-reduce leaves it."""

from __future__ import annotations

import pytest


@pytest.fixture()
def group(tmp_path):
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already running in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        import gc

        gc.collect()
        dist.destroy_process_group()


def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _flat_grad(model, x, y):
    import torch

    loss = ((model(x) - y) ** 2).mean()
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(model.parameters()))]).double()


@pytest.mark.parametrize("carry", [True, False])
def test_the_hook_reads_the_gradients_own_numbers(group, carry):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from leadline.lookahead.distributed.hook import NoiseHook

    model = _model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.0005)  # ~500 bytes: several buckets
    hook = NoiseHook(carry_mean=carry)
    ddp.register_comm_hook(None, hook.communicate)
    n = sum(p.numel() for p in model.parameters())
    mean, t_prev = torch.zeros(n, dtype=torch.float64), 0.0
    g = torch.Generator().manual_seed(1)
    for step in range(4):  # DDP rebuilds its buckets after the first step
        rows = 3 + step
        x, y = torch.randn(rows, 6, generator=g), torch.randn(rows, 3, generator=g)
        want = _flat_grad(model, x, y)
        scale = 2.5  # the driver's W t_r / T: the hook must read the gradient of the mean loss
        hook.begin(scale=scale, weight=rows / (t_prev + rows))
        (((ddp(x) - y) ** 2).mean() * scale).backward()
        r, xm, dd = hook.read()
        m = mean if carry else torch.zeros_like(mean)
        assert r == pytest.approx(float((want - m) @ (want - m)), rel=1e-5)
        assert xm == pytest.approx(float((want - m) @ m), rel=1e-5, abs=1e-9)
        # world of one: the all-reduced bucket is scale x the gradient
        assert dd == pytest.approx(float((scale * want - m) @ (scale * want - m)), rel=1e-5)
        got = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()
        assert torch.allclose(got, scale * want, rtol=1e-5, atol=1e-7), "DDP's result must be the plain all-reduce's"
        if carry:
            mean = mean + rows / (t_prev + rows) * (scale * want - mean)
            t_prev += rows
            held = torch.cat([hook._views[id(p)].reshape(-1) for p in model.parameters()]).double()
            assert torch.allclose(held, mean, rtol=1e-5, atol=1e-7), "the running mean in the buckets' layout"
        model.zero_grad(set_to_none=True)
    assert hook.calls > 4, "expected more than one bucket a step after the rebuild"
    assert len(hook._flat) > 1 or not carry, "the running mean is held per bucket (re-laid out at the rebuild)"
    hook.release()
    assert not hook._flat and not hook.active


def test_read_without_a_backward_says_so(group):
    from leadline.errors import InputError
    from leadline.lookahead.distributed.hook import NoiseHook

    hook = NoiseHook()
    hook.begin(scale=1.0, weight=1.0)
    with pytest.raises(InputError, match="no bucket was all-reduced"):
        hook.read()
    with pytest.raises(InputError, match="positive multiplier"):
        hook.begin(scale=0.0, weight=1.0)


def test_worldtask_refuses_an_fsdp_model_with_one_sentence_before_any_collective(group):
    import torch
    from torch.distributed.fsdp import fully_shard

    from leadline.errors import InputError
    from leadline.lookahead.distributed.job import WorldTask, is_sharded

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    assert not is_sharded(model)
    fully_shard(model)
    assert is_sharded(model)

    class Task:  # only what WorldTask reads before it refuses
        pass

    task = Task()
    task.model = model
    with pytest.raises(InputError, match=r"sharded by FSDP.*ShardedWorldTask"):
        WorldTask(task, list(model.parameters()), world=None)


def test_fully_sharded_data_parallel_without_use_orig_params_is_refused_with_one_sentence(group):
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel

    from leadline.errors import InputError
    from leadline.lookahead.distributed.sharded_job import check_supported

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    check_supported(FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=True))
    with pytest.raises(InputError, match=r"without use_orig_params=True.*use_orig_params=True\) or shard it with fully_shard"):
        check_supported(FullyShardedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 4)), device_id=torch.device("cpu")))
