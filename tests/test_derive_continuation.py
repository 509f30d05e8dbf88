"""Measurement that trains: the look-ahead's winning branch is the run's first steps.

derive() (full effort, inside ``keep_run_state``) keeps the best grid rate's run at the last
horizon; ``train_with_plan(..., state=)`` continues from it. On the tiny model the continued run
must equal, bit for bit, a run that took those steps itself (the same rows, the same rate, the same
checks from step 0), and a run that cannot continue says why and starts over."""

from __future__ import annotations

import pytest

from helpers import DATA, make_model, make_tokenizer
from leadline.lookahead.pieces import Corpus, Pieces

T = 32  # a short run: 4 rates from a 16-step horizon, which the budget stops at; the ending's copy is at 24
DATA_FILE = str(DATA / "prompt_completion.jsonl")


def _lora(tok, init_seed: int = 1):
    import torch
    from peft import LoraConfig, get_peft_model

    base = make_model(vocab_size=len(tok))
    torch.manual_seed(init_seed)
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0))


def _trained(model):
    return [p.detach().clone() for p in model.parameters() if p.requires_grad]


@pytest.fixture(scope="module")
def derived(tmp_path_factory):
    """derive() on the rate's pieces alone (the corpus, the first step, the anchor, the look-ahead)
    at one row a step, as ``leadline derive`` builds them."""
    from leadline.hf import prepare, trained_named_weights
    from leadline.lookahead.derive import derive
    from leadline.lookahead.derive.state import keep_run_state, load_run_state
    from leadline.plan import Value

    tok = make_tokenizer()
    model = _lora(tok)
    task, prof = prepare(model, tok, DATA_FILE, seed=0)
    named = trained_named_weights(model)
    model.train()
    where = tmp_path_factory.mktemp("state") / "plan.state"
    with keep_run_state(where) as kept:
        plan = derive(Corpus(data=DATA_FILE, profile=prof, held_out=task.split.as_dict()), Pieces(weights=named, optimizer=task.optimizer, train_step_of=task.train_step_of, held_out_losses=task.held_out_losses()), total_steps=T, effort="full")
        assert not where.exists()  # nothing reaches the path before the commit
        assert kept.commit() == where
    for name in ("micro_batch", "grad_accum"):  # no ramp here: the one row a step the look-ahead ran
        plan.set(name, Value(1, "given", "the test's: one row a step, as the look-ahead ran"))
    return tok, plan, load_run_state(where)


@pytest.mark.parametrize("ending", ["raced", "to_zero"])
def test_the_run_after_derive_is_the_run_that_took_derives_steps_itself(derived, ending):
    import torch

    from leadline.hf import prepare
    from leadline.lookahead.rate import LookaheadSchedule, lookahead_from
    from leadline.train import train_with_plan

    tok, plan, state = derived
    n = state.steps
    assert 0 < n < T and plan.get("lookahead_state_steps") == n
    assert state.lr == plan.lr  # the branch ran at the plan's own rate: only such a branch is kept

    model = _lora(tok)
    res = train_with_plan(model, tok, DATA_FILE, plan, state=state.path, ending=ending)
    assert res["continued"]["from_step"] == n and len(res["curve"]) == T - n
    assert res["curve"][0]["step"] == n

    # the reference: a fresh model takes the branch's n steps itself, then the same schedule on
    ref = _lora(tok)
    task, _ = prepare(ref, tok, DATA_FILE, seq_len=plan.seq_len, seed=0)
    params = [p for p in ref.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=plan.lr, weight_decay=0.0)
    step = task.train_step_of(plan.micro_batch, plan.grad_accum)
    sched = LookaheadSchedule(params, opt, step, task.held_out_losses(), lookahead_from(plan, taken=(n, state.lr), ending=ending), total_steps=T)
    ref.train()
    for t in range(T):
        sched.before(t)
        opt.zero_grad(set_to_none=True)
        step(t)
        opt.step()
    sched.finish()
    got, want = _trained(model), _trained(ref)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert res["schedule"]["checks"] == sched.evidence()["checks"]
    if ending == "to_zero":  # the run's own steps fall from the plan's rate to zero; nothing reran
        rates = [c["lr"] for c in res["curve"]]
        assert rates[0] == pytest.approx(plan.lr) and rates[-1] == pytest.approx(plan.lr / (T - n))
        assert res["ending"]["kept"] == "to_zero" and res["ending"]["from_step"] == n


def test_a_longer_raced_ending_that_the_branch_reaches_starts_over_and_says_why(derived):
    """--ending-share moves the ending's copy to T - share x T: a branch whose steps reach it cannot be
    the run's first steps (the ending reruns from before them), so the run starts over."""
    from leadline.train import train_with_plan

    tok, plan, state = derived
    res = train_with_plan(_lora(tok), tok, DATA_FILE, plan, state=state.path, ending_share=0.75)
    copy_at = T - round(0.75 * T)
    assert state.steps >= copy_at and res["continued"]["from_step"] == 0
    assert res["continued"]["why"] == (f"the branch's {state.steps} steps reach the raced ending, whose copy is taken "
                                       f"at step {copy_at}")
    assert res["ending"]["from_step"] == copy_at and len(res["curve"]) == T


def test_a_run_that_cannot_continue_starts_over_and_says_why(derived):
    from leadline.plan import Plan, Value
    from leadline.train import train_with_plan

    tok, plan, state = derived
    other = train_with_plan(_lora(tok, init_seed=7), tok, DATA_FILE, plan, state=state.path, total_steps=4)
    assert other["continued"]["from_step"] == 0 and "at step 0 differ" in other["continued"]["why"]
    assert len(other["curve"]) == 4  # started over: every step run here
    short = train_with_plan(_lora(tok), tok, DATA_FILE, plan, state=state.path, total_steps=state.steps)
    assert short["continued"]["from_step"] == 0 and "not fewer than the run's" in short["continued"]["why"]
    moved = Plan.from_dict(plan.to_dict())
    moved.set("lr", Value(0.77 * state.lr, "given", "the test's: a rate refined between the grid's, within half a "
                          "grid step of the branch's"))
    near = train_with_plan(_lora(tok), tok, DATA_FILE, moved, state=state.path, total_steps=4)
    assert near["continued"]["from_step"] == 0 and "is not the branch's" in near["continued"]["why"]


def test_derive_keeps_no_branch_that_ran_at_another_rate_than_the_plans():
    from types import SimpleNamespace

    from leadline.lookahead.derive.phases import keep_branch
    from leadline.plan import Plan

    plan = Plan()
    la = SimpleNamespace(branch=SimpleNamespace(lr=2.76e-3, steps=20))
    kept = keep_branch(SimpleNamespace(path=None), la, [], plan, 2.13e-3, 28)
    assert kept.value == 0 and "is not the branch's 0.00276" in kept.evidence["why"]


def test_a_state_that_is_not_one_is_one_sentence(tmp_path):
    from leadline.errors import InputError
    from leadline.lookahead.derive.state import load_run_state

    (tmp_path / "junk").mkdir()
    with pytest.raises(InputError, match="is not a state leadline derive wrote"):
        load_run_state(tmp_path / "junk")


def test_an_uncommitted_state_leaves_nothing_on_disk(tmp_path):
    from types import SimpleNamespace

    import torch

    from leadline.lookahead.derive.state import keep_run_state, save_branch
    from leadline.rate.state import Snapshot

    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([w])
    branch = SimpleNamespace(lr=1e-3, steps=2, snapshot=Snapshot.take([w], opt), warmup_steps=0, alpha1=1e-2)
    with pytest.raises(RuntimeError), keep_run_state(tmp_path / "plan.state") as kept:
        save_branch(kept, branch, [w], {"seed": 0})
        assert kept.tmp is not None and kept.tmp.exists()
        raise RuntimeError("derive failed after the rate phase")
    assert list(tmp_path.iterdir()) == []


def test_a_plan_of_the_removed_quick_effort_is_refused_before_any_work(derived):
    """A plan with ``race_rates`` and no look-ahead horizon is of the removed quick effort: refused
    in one sentence naming the fix, the model untouched."""
    from leadline.errors import InputError
    from leadline.plan import Value
    from leadline.train import train_with_plan

    tok, plan, _ = derived
    quick = type(plan).from_json(plan.to_json())
    del quick.values["lookahead_horizon_steps"]
    quick.set("race_rates", Value([1e-3, 2e-3], "derived", "the quick effort's grid"))
    model = _lora(tok)
    before = _trained(model)
    with pytest.raises(InputError, match=r"^the plan is of the quick effort, which was removed; derive it again"):
        train_with_plan(model, tok, DATA_FILE, quick)
    assert all(a.equal(b) for a, b in zip(_trained(model), before))
