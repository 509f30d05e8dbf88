"""Models the size users train: derive_for on Llama-shaped 1B and 8B models built from a config
(random weights: memory and time depend on the shapes, not the values), LoRA r16 over a bf16
base or a bitsandbytes 4-bit nf4 base (QLoRA), gradient checkpointing on as users run it, on a
card held to 24 GB by a second process and on the whole card.

Each case is (shape in {1b, 8b}, base in {bf16, 4bit}, card in {24, whole}). Rows are tokenized
``{"input_ids", "labels"}`` rows of random ids, lengths log-normal around seq/4 clipped to
[16, seq], one row at seq (so the plan's length is seq). Per case:
  derive   derive_for(model, tokenizer, rows, total_steps=--run-steps, effort=full): its wall
           time per phase (plan.phases), the memory phase's share, rows_fit (with and without
           checkpointing), micro_batch, grad_accum, lr, precision.
  ramp     derive's ramp alone without the step's upper limit (max_rows=--max-rows): the kept
           micro-batch b at seq tokens, through the length mix.
  truth    (CUDA) the largest b (up to --max-rows) that runs --truth-steps real AdamW steps of the
           run's own length mix (each micro-batch padded to the longest of b rows drawn, as in
           ``run``) without an OOM and without the allocator's retry counter growing, galloping up
           from the ramp's b and bisecting. ``--truth-lengths seq`` measures it at seq tokens
           every step instead (no length changes, so no allocator retries from them: a looser
           truth than the run meets), ``both`` records the two and judges R1 by the mix.
  run      --run-steps real AdamW steps (lr 1e-5) at the ramp's b, each micro-batch padded to
           the longest of b rows drawn from the mix.

On the 8B shapes ``benchmarks/on_gpu.sh`` caps the ramp and the truth at 16 rows (a truth at the
cap is not judged), takes 5 truth steps, stops the run at ``--deadline 540`` and passes
``--resume``: the same command again keeps the stages the file records and continues the run's
300 steps, so a case spreads over 10-minute calls. R2 is judged once all 300 ran.

``--effort race`` (the default run's): derive_for's race instead of the full derive, and its
micro-batch (the most of the step's 16 rows, halved on each out-of-memory error to a divisor of
16) stands for the ramp's b: no ramp runs.

Decision rules, written before the run:
  R1 truth - 1 <= ramp b <= truth (equal, or one rung below); above the truth FAILS. For
     ``--effort race``: b is the largest divisor of the step's rows at or under the truth (the
     halving can keep nothing between two divisors); anything else FAILS.
  R2 the run: 0 OOMs and 0 allocator retries over its --run-steps steps.
  R3 (recorded, not judged) derive's wall time per phase and the memory phase's share of it.

On the H200 (bitsandbytes carried as a wheel; one case per command keeps each under 10 min):

    pip install --no-deps bitsandbytes-*.whl
    PYTHONPATH=src python3 benchmarks/hf_models_memory.py --shapes 1b --bases bf16,4bit --cards 24,0 \\
        --out $OUT/hf_models_memory_1b.json
    PYTHONPATH=src python3 benchmarks/hf_models_memory.py --shapes 8b --bases 4bit --cards 24 --out $OUT/8b_4bit_24.json
    PYTHONPATH=src python3 benchmarks/hf_models_memory.py --shapes 8b --bases bf16 --cards 0 --out $OUT/8b_bf16_0.json
    PYTHONPATH=src python3 benchmarks/hf_models_memory.py --shapes 8b --bases 4bit --cards 24 --effort race \
        --max-rows 16 --truth-steps 5 --deadline 540 --out $OUT/8b_4bit_24gb_race.json

The memory promise at a user's scale (``leadline run``'s micro-batch: ``--effort race``), one case a
command, 8B in 4-bit on a card held to 24 GB and 1B in bf16 on 8 GB, at 512 and 2,048 tokens:

    for c in "8b 4bit 24 512" "8b 4bit 24 2048" "1b bf16 8 512" "1b bf16 8 2048"; do set -- $c
      PYTHONPATH=src python3 benchmarks/hf_models_memory.py --shapes $1 --bases $2 --cards $3 --effort race \
          --seq $4 --run-steps 20 --max-rows 16 --truth-steps 5 \
          --out benchmarks/results/hf_models_memory/${1}_${2}_${3}gb_race_seq$4.json; done

CPU smoke (a tiny config, a few steps; the 4-bit base is refused off CUDA in one sentence):

    python3 benchmarks/hf_models_memory.py --smoke --out /tmp/hf_models_memory_smoke.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # helpers.make_tokenizer: an offline tokenizer (the rows are ids)

GB = 10**9
LLAMA = {"rope_theta": 500000.0, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}
SHAPES: dict[str, dict[str, Any]] = {  # Llama-3.2-1B's and Llama-3.1-8B's shapes
    "1b": {**LLAMA, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
           "tie_word_embeddings": True},
    "8b": {**LLAMA, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "tie_word_embeddings": False},
    "tiny": {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True},
}
HOLDER = r"""
import sys, torch
free, total = torch.cuda.mem_get_info()
keep = int(float(sys.argv[1]))
block = torch.empty(max(0, free - keep), dtype=torch.uint8, device="cuda")
print(f"held {block.numel() / 1e9:.2f} GB; {(free - block.numel()) / 1e9:.2f} GB left free", flush=True)
sys.stdin.read()
"""
T0 = time.perf_counter()


def log(*a: Any) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s]", *a, flush=True)


def rows_of(seq: int, n: int, vocab: int, seed: int = 0) -> list[dict[str, list[int]]]:
    """Tokenized rows of random ids, lengths log-normal around seq/4 in [16, seq], the first at seq."""
    rng = random.Random(seed)
    lengths = [seq] + [max(16, min(seq, int(rng.lognormvariate(math.log(seq / 4), 0.7)))) for _ in range(n - 1)]
    out = []
    for n_tok in lengths:
        ids = [rng.randrange(3, vocab) for _ in range(n_tok)]
        out.append({"input_ids": ids, "labels": list(ids)})
    return out


def build(shape: str, base: str, seq: int, device: str, work: Path, checkpointing: bool) -> Any:
    """The model as users train it: LoRA r16 on every linear layer over a bf16 or 4-bit base."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=max(seq, 2048), pad_token_id=0, eos_token_id=0)
    if base == "4bit":
        if not device.startswith("cuda"):  # what leadline says of a 4-bit base off CUDA, recorded as the case
            from leadline.run.precision import check_trainable

            model = LlamaForCausalLM(cfg)
            model.config.quantization_config = _bnb()
            check_trainable(_lora(model, get_peft_model, LoraConfig))
        folder = work / f"llama_{shape}"
        if not (folder / "config.json").exists():
            _init(LlamaForCausalLM, cfg, device).save_pretrained(folder)
            torch.cuda.empty_cache()
        from peft import prepare_model_for_kbit_training

        model = LlamaForCausalLM.from_pretrained(folder, quantization_config=_bnb(), device_map={"": device},
                                                 dtype=torch.bfloat16)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing,
                                                gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model = _init(LlamaForCausalLM, cfg, device)
        if checkpointing:
            enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5
            if enable is not None:
                enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
    return _lora(model, get_peft_model, LoraConfig)


def _init(cls: Any, cfg: Any, device: str) -> Any:
    """The model built on ``device`` in bf16 from the start (an 8B model in float32 first would
    take 32 GB, and the allocator's cache would keep it)."""
    import torch

    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            return cls(cfg)
    finally:
        torch.set_default_dtype(prev)


def _bnb() -> Any:
    import torch
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
                              bnb_4bit_use_double_quant=True)


def _lora(model: Any, get_peft_model: Any, lora_config: Any) -> Any:
    return get_peft_model(model, lora_config(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0,
                                             task_type="CAUSAL_LM"))


def hold(card_gb: float) -> tuple[subprocess.Popen | None, str]:
    """A second process holding the card down to ``card_gb`` for this process: the free memory
    left is card_gb less what this process holds already."""
    import torch

    if card_gb <= 0 or not torch.cuda.is_available():
        return None, "whole card" if card_gb <= 0 else "no CUDA: not held"
    torch.cuda.empty_cache()  # what the allocator caches is this process's to reuse, not held
    free, total = torch.cuda.mem_get_info()
    keep = int(card_gb * GB - (total - free))
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(max(0, keep))], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    return child, (child.stdout.readline().strip() if child.stdout else "")


def release(child: subprocess.Popen | None) -> None:
    if child is not None and child.poll() is None:
        child.stdin.close()
        child.wait(timeout=60)


def retries() -> int:
    import torch

    return int(torch.cuda.memory_stats().get("num_alloc_retries", 0)) if torch.cuda.is_available() else 0


def steps(task: Any, b: int, lengths: list[int], n: int, until: float | None = None) -> dict[str, Any]:
    """``n`` real AdamW steps of ``b`` rows at the given padded lengths (cycled); ``until`` (a
    ``time.perf_counter()``) stops them early, ``steps_done`` saying how far they got."""
    import torch

    from leadline.memory_readings import is_oom

    params = [p for p in task.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5)
    cuda = task.device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    r0, done, error, t = retries(), 0, None, time.perf_counter()
    try:
        for s in range(n):
            if until is not None and time.perf_counter() >= until:
                break
            task.loss_of(b, lengths[s % len(lengths)]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            done += 1
    except Exception as e:
        if not is_oom(e):
            raise
        error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    finally:
        opt.zero_grad(set_to_none=True)
        del opt
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return {"b": b, "steps_done": done, "steps": n, "error": error, "retries": retries() - r0,
            "peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
            "seconds": time.perf_counter() - t}


def mix_of(task: Any, b: int, n: int = 64) -> list[int]:
    """The padded lengths of ``n`` micro-batches of ``b`` rows drawn from the task's rows (seeded):
    the lengths the run trains at."""
    return [max(len(task.rows[i].input_ids) for i in random.Random(s).sample(task.order, min(b, len(task.order))))
            for s in range(n)]


def truth(task: Any, b_ramp: int, lengths_of: Any, n: int, max_rows: int) -> dict[str, Any]:
    """The largest b that runs ``n`` steps at ``lengths_of(b)`` without an OOM or a retry."""
    tried: dict[int, dict[str, Any]] = {}

    def ok(b: int) -> bool:
        if b < 1:
            return True
        if b not in tried:
            tried[b] = steps(task, b, lengths_of(b), n)
        return tried[b]["error"] is None and tried[b]["retries"] == 0

    lo, hi = (b_ramp, None) if ok(b_ramp) else (0, b_ramp)
    step = 1
    while hi is None:
        if lo >= max_rows:
            hi = lo + 1
        elif ok(min(lo + step, max_rows)):
            lo, step = min(lo + step, max_rows), step * 2
        else:
            hi = min(lo + step, max_rows)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return {"b_true": lo, "at_max_rows": lo >= max_rows, "tried": [tried[k] for k in sorted(tried)]}


def run_case(shape: str, base: str, card_gb: float, args: argparse.Namespace, tok: Any, case: dict[str, Any],
             save: Any) -> dict[str, Any]:
    """One case, filled into ``case`` stage by stage, ``save()`` after each: a call cut by its time
    limit keeps the stages it finished."""
    import torch

    from leadline.hf import prepare

    for stale in ("error", "traceback"):  # an earlier call's failure is not this call's
        case.pop(stale, None)
    case.update({"shape": shape, "base": base, "card_gb": card_gb or "whole", "seq": args.seq})
    t0 = time.perf_counter()
    log(shape, base, card_gb, "building the model")
    model = build(shape, base, args.seq, args.device, Path(args.work), not args.no_checkpointing)
    case["load_seconds"] = time.perf_counter() - t0
    log(shape, base, card_gb, "built", f"{case['load_seconds']:.1f} s; deriving")
    rows = rows_of(args.seq, args.rows, min(len(tok), SHAPES[shape]["vocab_size"]))
    child, case["holder"] = hold(card_gb)
    try:
        if "derive" in case and "ramp" in case:
            log(shape, base, card_gb, "derive and ramp recorded by an earlier call: resumed")
            b = case["ramp"]["micro_batch"]
            task, _ = prepare(model, tok, rows, seq_len=args.seq)
        else:
            task, b = derive_and_ramp(model, tok, rows, shape, base, card_gb, args, case, save)
        later_stages(task, b, shape, base, card_gb, args, case, save)
    finally:
        release(child)
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    case["seconds"] = case.get("seconds", 0.0) + time.perf_counter() - t0
    return case


def derive_and_ramp(model: Any, tok: Any, rows: Any, shape: str, base: str, card_gb: float,
                    args: argparse.Namespace, case: dict[str, Any], save: Any) -> tuple[Any, int]:
    """derive_for bounded by --derive-seconds, then derive's ramp alone up to --max-rows."""
    from leadline.hf import DeriveOptions, derive_for, prepare
    from leadline.lookahead.memory import ramp
    from leadline.memory import TrainingStep

    t = time.perf_counter()
    if args.effort == "race":
        return race_micro_batch(model, tok, rows, shape, base, card_gb, args, case, save)
    plan = derive_for(model, tok, rows, total_steps=args.run_steps, effort="full", seq_len=args.seq,
                      progress=False, options=DeriveOptions(max_seconds=args.derive_seconds))
    case["derive"] = {
        "wall_seconds": time.perf_counter() - t, "derive_seconds": plan.derive_seconds,
        "phases": [{"phase": p.phase, "seconds": p.seconds, "status": p.status} for p in plan.phases],
        **{n: plan.get(n) for n in ("rows_fit", "rows_fit_without_checkpointing", "micro_batch", "grad_accum",
                                    "tokens_per_step", "lr", "seq_len")},
        "precision": plan.get("precision"), "notes": plan.notes,
    }
    memory_s = sum(p.seconds for p in plan.phases if p.phase == "memory")
    case["derive"]["memory_share"] = memory_s / plan.derive_seconds if plan.derive_seconds else None
    log(shape, base, card_gb, "derive", f"{plan.derive_seconds:.1f} s", f"rows_fit {plan.get('rows_fit')}")
    save()
    task, _ = prepare(model, tok, rows, seq_len=args.seq)
    res = ramp(TrainingStep(task.loss_of, task.optimizer), args.seq,
               lengths=[len(task.rows[i].input_ids) for i in task.order[:64]], max_rows=args.max_rows)
    b = res.micro_batch
    case["ramp"] = {"micro_batch": b, "seconds": res.seconds, "rungs": [r.as_dict() for r in res.rungs],
                    "stopped_because": res.stopped_because}
    log(shape, base, card_gb, "ramp", f"b={b}")
    save()
    return task, b


def race_micro_batch(model: Any, tok: Any, rows: Any, shape: str, base: str, card_gb: float,
                     args: argparse.Namespace, case: dict[str, Any], save: Any) -> tuple[Any, int]:
    """derive_for's race (the default run's plan): its micro-batch, found by halving the step's
    rows on each out-of-memory error, is the b the truth judges."""
    from leadline.hf import derive_for, prepare

    t = time.perf_counter()
    plan = derive_for(model, tok, rows, total_steps=args.run_steps, seq_len=args.seq)
    b = int(plan.micro_batch)
    case["derive"] = {"effort": "race", "wall_seconds": time.perf_counter() - t, "derive_seconds": plan.derive_seconds,
                      "phases": [{"phase": p.phase, "seconds": p.seconds, "steps": p.steps} for p in plan.phases],
                      **{n: plan.get(n) for n in ("micro_batch", "grad_accum", "rows_per_step", "lr", "seq_len")},
                      "precision": plan.get("precision"), "notes": plan.notes}
    case["ramp"] = {"micro_batch": b, "from": "the race's halving", "tried": plan["micro_batch"].evidence,
                    "rows_per_step": int(plan.get("rows_per_step"))}
    log(shape, base, card_gb, "race", f"{plan.derive_seconds:.1f} s", f"micro_batch {b}")
    save()
    task, _ = prepare(model, tok, rows, seq_len=args.seq)
    return task, b


def r1(b: int, truth_b: int, rows_per_step: int | None) -> str:
    """The rule R1: the full derive's ramp b within one rung under the truth; the race's b the largest
    divisor of the step's rows at or under it.

    Examples:
        >>> r1(4, 5, None), r1(3, 5, None), r1(4, 5, 16), r1(4, 7, 16), r1(8, 7, 16)
        ('PASS', 'FAIL', 'PASS', 'PASS', 'FAIL')
    """
    if rows_per_step is None:
        return "PASS" if truth_b - 1 <= b <= truth_b else "FAIL"
    best = max((d for d in range(1, rows_per_step + 1) if rows_per_step % d == 0 and d <= truth_b), default=0)
    return "PASS" if b == best else "FAIL"


def later_stages(task: Any, b: int, shape: str, base: str, card_gb: float, args: argparse.Namespace,
                 case: dict[str, Any], save: Any) -> None:
    """The truth (R1) and the run (R2), each skipped when an earlier call recorded it; a run cut by
    --deadline is continued for the steps it has left."""
    if "R1" not in case:
        if task.device.type == "cuda":
            if args.truth_lengths in ("seq", "both"):
                case["truth_at_seq"] = truth(task, b, lambda _b: [args.seq], args.truth_steps, args.max_rows)
                save()
            if args.truth_lengths in ("mix", "both"):
                case["truth"] = truth(task, b, lambda rows: mix_of(task, rows), args.truth_steps, args.max_rows)
            else:
                case["truth"] = case["truth_at_seq"]
            case["truth"]["lengths"] = "seq" if args.truth_lengths == "seq" else "mix"
            bt = case["truth"]["b_true"]
            case["R1"] = r1(b, bt, case["ramp"].get("rows_per_step")) if not case["truth"]["at_max_rows"] else (
                f"not judged: the truth reached --max-rows {args.max_rows} (the card fits more)")
            log(shape, base, card_gb, "truth", f"b_true={bt}", case["R1"])
            save()
        else:
            case["R1"] = "not judged off CUDA (the CPU ramp reads throughput, not memory)"
        save()
    before = case.get("run") or {"b": b, "steps_done": 0, "steps": args.run_steps, "error": None, "retries": 0,
                                 "peak_allocated_bytes": None, "seconds": 0.0, "calls": 0}
    left = args.run_steps - before["steps_done"]
    if before["error"] is None and left > 0:
        until = None if args.deadline is None else T0 + args.deadline
        more = steps(task, b, mix_of(task, b), left, until=until)
        peaks = [p for p in (before["peak_allocated_bytes"], more["peak_allocated_bytes"]) if p is not None]
        case["run"] = {"b": b, "steps_done": before["steps_done"] + more["steps_done"], "steps": args.run_steps,
                       "error": more["error"], "retries": before["retries"] + more["retries"],
                       "peak_allocated_bytes": max(peaks) if peaks else None,
                       "seconds": before["seconds"] + more["seconds"], "calls": before.get("calls", 0) + 1}
    run = case["run"]
    if run["error"] is not None or run["retries"] > 0:
        case["R2"] = "FAIL"
    elif run["steps_done"] >= run["steps"]:
        case["R2"] = "PASS"
    else:
        case["R2"] = f"not judged yet: {run['steps_done']} of {run['steps']} steps (--resume continues them)"
    log(shape, base, card_gb, "run", run["steps_done"], "steps", case["R2"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1b,8b")
    ap.add_argument("--bases", default="bf16,4bit")
    ap.add_argument("--cards", default="24,0", help="GB the card is held to (0: the whole card)")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--max-rows", type=int, default=256, help="the ramp's and the truth's upper limit")
    ap.add_argument("--truth-steps", type=int, default=20)
    ap.add_argument("--truth-lengths", choices=["mix", "seq", "both"], default="mix",
                    help="the truth's lengths: the run's mix (R1 is judged by it), seq tokens every step, or both")
    ap.add_argument("--run-steps", type=int, default=300)
    ap.add_argument("--no-checkpointing", action="store_true")
    ap.add_argument("--derive-seconds", type=float, default=None, help="derive's max_seconds (default: unbounded)")
    ap.add_argument("--effort", choices=["full", "race"], default="full",
                    help="full: derive_for's full derive and the ramp; race: the default run's micro-batch")
    ap.add_argument("--device", default=None)
    ap.add_argument("--work", default="/tmp/hf_models_memory")
    ap.add_argument("--smoke", action="store_true", help="a tiny config on the CPU, a few steps: the script runs")
    ap.add_argument("--resume", action="store_true",
                    help="keep the stages --out already records for each case (derive and ramp, the truth, the "
                         "run's steps so far) and run only the rest")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds after the start at which the run stage stops, recorded as far as it got")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import torch

    from helpers import make_tokenizer
    from leadline._io import write_atomic

    if args.smoke:
        args.shapes, args.cards, args.seq, args.rows = "tiny", "0", 64, 64
        args.max_rows, args.truth_steps, args.run_steps, args.derive_seconds = 8, 2, 5, 60.0
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"benchmark": "hf_models_memory", "command": sys.argv, "args": vars(args),
                              "machine": {"platform": platform.platform(), "torch": torch.__version__,
                                          "device": torch.cuda.get_device_name(0) if torch.cuda.is_available()
                                          else "cpu"},
                              "cases": []}
    earlier = json.loads(out.read_text())["cases"] if args.resume and out.exists() else []
    tok = make_tokenizer()
    for shape in args.shapes.split(","):
        for base in args.bases.split(","):
            for card in (float(c) for c in args.cards.split(",")):
                case: dict[str, Any] = next((c for c in earlier if (c.get("shape"), c.get("base"), c.get("card_gb"))
                                             == (shape, base, card or "whole")), {})
                report["cases"].append(case)

                def save() -> None:
                    write_atomic(out, json.dumps(report, indent=1, default=str))

                try:
                    run_case(shape, base, card, args, tok, case, save)
                except Exception as e:  # recorded, never hidden: an InputError is leadline's one sentence
                    case.update({"shape": shape, "base": base, "card_gb": card or "whole",
                                 "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]})
                    log(shape, base, card, "ERROR", case["error"])
                save()
    verdicts = [c.get(k) for c in report["cases"] for k in ("R1", "R2") if c.get(k) in ("PASS", "FAIL")]
    report["summary"] = {"pass": verdicts.count("PASS"), "fail": verdicts.count("FAIL"),
                         "errors": sum(1 for c in report["cases"] if "error" in c)}
    write_atomic(out, json.dumps(report, indent=1, default=str))
    log("wrote", out, report["summary"])
    return 0 if report["summary"]["fail"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
