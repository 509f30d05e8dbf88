"""``torchrun --nproc-per-node 2 -m leadline derive``: both ranks derive, rank 0 writes and
prints, the scale-out table comes out once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import DATA, free_port, save_model_dir

# a hang's bound (the job's collectives wait up to 30 minutes), far above the job's minute or two
# on a busy machine
HANG_S = 300


def test_derive_under_torchrun_writes_once_and_prints_the_scale_out(tmp_path):
    model = save_model_dir(tmp_path / "model")
    out = tmp_path / "plan.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "leadline", "derive", "--model", str(model), "--data", str(DATA / "prompt_completion.jsonl"),
           "--steps", "12", "--effort", "full", "--device", "cpu", "--out", str(out), "--scale-out"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S, env=env, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"torchrun -m leadline derive did not finish within {HANG_S} s: a collective hung")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(f"wrote {out}") == 1, "only rank 0 writes and prints"
    assert done.stdout.count("scale-out: B_noise") == 1 and "data parallelism pays up to" in done.stdout
    plan = json.loads(out.read_text())
    assert plan["values"]["world_size"]["value"] == 2
    assert plan["machine"]["world"]["world_size"] == 2
    assert plan["values"]["noise_scale_tokens"]["evidence"]["via"] == "ddp_hook"
    assert not list(tmp_path.glob("*.tmp*")), "nothing half-written"


TRAINER_SCRIPT = '''
import json, os, sys
import torch
from helpers import DATA, make_model, make_tokenizer
from peft import LoraConfig, get_peft_model
from transformers import Trainer, TrainingArguments
from leadline.corpus import collate, tokenize_rows
from leadline.hf import derive_for, training_arguments

out = sys.argv[1]
tok = make_tokenizer()
model = get_peft_model(make_model(vocab_size=len(tok)), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                       lora_dropout=0.0, task_type="CAUSAL_LM"))
plan = derive_for(model, tok, str(DATA / "text.jsonl"), total_steps=3, effort="full")  # joins torchrun's job itself
rank = torch.distributed.get_rank()
args = training_arguments(plan, TrainingArguments(output_dir=os.path.join(out, "run"), use_cpu=True, report_to=[],
                                                  save_strategy="no", ddp_backend="gloo", disable_tqdm=True))
rows = [r.truncated(plan.seq_len) for r in tokenize_rows(str(DATA / "text.jsonl"), tok)]
trainer = Trainer(model=model, args=args, train_dataset=rows,
                  data_collator=lambda batch: collate(batch, tok.pad_token_id).model_inputs())
res = trainer.train()
json.dump({"plan": plan.to_json(), "world": args.world_size, "per_device": args.per_device_train_batch_size,
           "accum": args.gradient_accumulation_steps, "steps": res.global_step},
          open(os.path.join(out, f"rank{rank}.json"), "w"))
# the job ends as a torchrun job should: both ranks done, then the group torn down by hand (left to the
# interpreter's exit, gloo's threads can be destroyed while joinable on a loaded machine: std::terminate)
import torch.distributed as dist
if dist.is_initialized():
    dist.barrier()
    dist.destroy_process_group()
'''


def test_derive_for_then_trainer_under_torchrun(tmp_path):
    """The Hugging Face path: derive_for under torchrun (it joins the job), then Trainer with
    the plan's TrainingArguments, on both ranks."""
    from pathlib import Path

    import helpers

    script = tmp_path / "job.py"
    script.write_text(TRAINER_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           str(script), str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(Path(helpers.__file__).parent), os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S, env=env, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"derive_for + Trainer under torchrun did not finish within {HANG_S} s: a collective hung")
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["plan"] == ranks[1]["plan"]
    plan = json.loads(ranks[0]["plan"])
    assert ranks[0]["world"] == 2 and plan["values"]["world_size"]["value"] == 2
    assert ranks[0]["per_device"] == plan["values"]["micro_batch"]["value"]
    assert ranks[0]["accum"] == plan["values"]["grad_accum"]["value"]
    assert ranks[0]["steps"] == ranks[1]["steps"] == 3
