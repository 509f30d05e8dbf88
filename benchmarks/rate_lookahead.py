"""GPU validation of the rate and the run, SmolLM2-135M: look-ahead against a sweep, plan on classification.

Model: SmolLM2-135M-Instruct (/root/assets/smol.gguf through leadline.hf.loading, float32
weights, TF32 matmuls). Rows: prompt + completion, tokenized here (the prompt's first
--max-prompt tokens, the completion, EOS; the loss scores the completion and EOS), one
optimizer step = its rows in micro-batches of at most 8, the loss over the step's scored tokens. Every arm starts from the same
weights (LoRA: the same adapter init), the same rows in the same order, torch seed 0, a fresh
AdamW (weight decay 0). The rows the rate phases read ("decision rows", 128 from the training
file, never trained on) are never the rows that judge.

The look-ahead against a sweep (``--experiment sweep``; gsm_symbolic: prompt question, completion answer_cot;
8 rows a step, T = 90 steps). Two modes: a full fine-tune and LoRA r32 (alpha 64, all seven
projections). The sweep: six constant rates, fixed before the run —
    full: 2.5e-5 5e-5 1e-4 2e-4 4e-4 8e-4        LoRA r32: 2.5e-4 5e-4 1e-3 2e-3 4e-3 8e-3
each 90 steps, judged by the mean held-out loss (per-row mean over completion tokens) on 256
rows of gsm_symbolic_test (mean ± SE). The look-ahead: measure_first_step -> alpha1, then
lookahead_lr(total_steps=90) on the decision rows, then 90 steps at its rate
(warmup from alpha1 over 10 steps, then constant), judged on the same 256 rows.
Decision rules (per mode), written before the run:
  R1  the look-ahead's rate is within 2x of the sweep's best rate;
  R2  its 90-step judged loss is no worse than the sweep's second best (means);
  R3  its optimizer steps (lookahead_lr.steps_used) <= 40% of the sweep's (0.4 x 540 = 216).
  A sweep whose best rate sits at an edge of its grid is flagged (R1 is then weaker).
  Beside the rules (no pass/fail; the full mode missed R2 at a rate 1.15x the sweep's best,
  ``rate_lookahead/sweep_gsm_full.json``): the sweep's best rate run again from the same start
  ("replay_best": how far two runs at one rate land apart on this card, TF32 and atomics
  included), the look-ahead's rate constant with no warmup ("lookahead_constant"), and (because the
  look-ahead arm lost 0.018 to "lookahead_constant" at the same rate) the look-ahead arm's
  schedule (warmup from alpha1) from a fresh optimizer and the base weights ("lookahead_warmup_fresh"),
  which separates the warmup from the state the measurement phases leave.

The plan with its schedule on classification (``--experiment schedule``; debian_sections: prompt text +
"\\nSection:", completion " label"; LoRA r16, alpha 32, all seven projections; 16 rows a step, one pass over
3,104 training rows, T = 194).
Arms: (a) untrained; (b) the default recipe: AdamW 2e-4, 3% warmup, linear decay to zero;
(c) the plan alone: alpha1 + the full look-ahead (T = 194), its rate constant after the warmup;
(d) the same plan + LookaheadSchedule(lookahead_from(look-ahead)) with finish(); (e) arm (d) again, whole
(alpha1 and the look-ahead measured again, then the schedule), with the process held to a 6 GB
card (torch.cuda.set_per_process_memory_fraction), unless --cap-gb 0. The batch is the
recipe's 16 rows in every arm, so the arms differ in the rate and the run only.
Judged on all 842 test rows: accuracy, each of the four labels scored by the log-likelihood of
its completion (label + EOS); McNemar (leadline.stats.mcnemar) against the default recipe and
against the untrained model; the share of the most predicted class.
Decision rules, written before the run:
  R1  plan + schedule, uncapped: no class predicted for more than 80% of the test rows;
  R2  plan + schedule, uncapped: beats the untrained model (higher accuracy, McNemar p < 0.05);
  R3, R4  the same for arm (f), under the 6 GB cap.
  Everything else (each arm against the default recipe) is reported with its McNemar p, no
  pass/fail. The peer on this protocol (pichak 0.4.1): untrained 0.822, default recipe 0.956,
  its full plan + schedule collapsed to one class (0.366) on a 6 GB card.

Budget: about 6 minutes on an H200 for both experiments (each arm's seconds are in the JSON);
--max-seconds skips the arms that would start past it (recorded as skipped). The JSON (machine,
versions, command, every arm's numbers, failures with their traceback) is rewritten after every
arm, so a cut-off run keeps what it measured.

Run (cwd = repo root, on the GPU machine, the assets in /root/assets):
    PYTHONPATH=src python3 benchmarks/rate_lookahead.py --out $OUT/rate_lookahead.json
    PYTHONPATH=src python3 benchmarks/rate_lookahead.py --experiment sweep --out $OUT/rate_lookahead/sweep_gsm.json
    PYTHONPATH=src python3 benchmarks/rate_lookahead.py --experiment schedule --out $OUT/rate_lookahead/schedule_debian_all_arms.json
    PYTHONPATH=src python3 benchmarks/rate_lookahead.py --experiment schedule --schedule-arms plan_schedule --cap-gb 0 \\
        --schedule-baselines benchmarks/results/rate_lookahead/schedule_debian_baselines.json --out $OUT/rate_lookahead/schedule_debian_plan.json
CPU smoke run of every code path (a tiny random Llama, a few rows, no pass/fail meaning):
    PYTHONPATH=src .venv/bin/python benchmarks/rate_lookahead.py --smoke --data-dir ../shared/data --out /tmp/rate_smoke.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SWEEP = {"full": [2.5e-5, 5e-5, 1e-4, 2e-4, 4e-4, 8e-4], "lora": [2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3]}
LABELS = ["games", "net", "science", "sound"]
T0 = time.perf_counter()


def log(*a: Any) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s]", *a, flush=True)


# ---- rows, batches, losses ---------------------------------------------------------------
def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def encode(tok: Any, prompt: str, completion: str, max_prompt: int) -> tuple[list[int], list[int]]:
    p = tok(prompt, add_special_tokens=False)["input_ids"][:max_prompt]
    c = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return p + c, [-100] * len(p) + c


def collate(rows: list[tuple[list[int], list[int]]], pad: int, device: Any) -> dict[str, Any]:
    import torch

    n = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), n), pad, dtype=torch.long)
    lab = torch.full((len(rows), n), -100, dtype=torch.long)
    att = torch.zeros((len(rows), n), dtype=torch.long)
    for i, (x, y) in enumerate(rows):
        ids[i, : len(x)] = torch.tensor(x)
        lab[i, : len(y)] = torch.tensor(y)
        att[i, : len(x)] = 1
    return {"input_ids": ids.to(device), "attention_mask": att.to(device), "labels": lab.to(device)}


def token_losses(model: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
    """Per-token CE of the shifted labels and the mask of scored tokens."""
    import torch

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
    labels = batch["labels"][:, 1:]
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels.clamp(min=0), reduction="none")
    mask = (labels != -100).float()
    return ce * mask, mask


def row_losses(model: Any, rows: list, pad: int, device: Any, micro: int = 16) -> list[float]:
    """Mean loss per row over its scored tokens; eval mode and no grad, mode restored."""
    import torch

    was = model.training
    model.eval()
    out: list[float] = []
    try:
        with torch.no_grad():
            for i in range(0, len(rows), micro):
                ce, mask = token_losses(model, collate(rows[i:i + micro], pad, device))
                out += (ce.sum(1) / mask.sum(1).clamp(min=1)).tolist()
    finally:
        model.train(was)
    return out


def make_train_step(model: Any, rows: list, per_step: int, pad: int, device: Any, micro: int = 8) -> Callable[[int], float]:
    """train_step(t): forward+backward of step t's rows (rows t*per_step .., wrapping), the
    loss normalised over the step's scored tokens."""

    def train_step(t: int) -> float:
        start = (t * per_step) % len(rows)
        step_rows = [rows[(start + i) % len(rows)] for i in range(per_step)]
        scored = sum(sum(1 for y in r[1][1:] if y != -100) for r in step_rows)
        total = 0.0
        for i in range(0, per_step, micro):
            ce, _ = token_losses(model, collate(step_rows[i:i + micro], pad, device))
            loss = ce.sum() / scored
            loss.backward()
            total += float(loss.detach())
        return total

    return train_step


def train(opt: Any, train_step: Callable[[int], float], steps: int, lr_at: Callable[[int], float]) -> None:
    for t in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(t)
        opt.zero_grad(set_to_none=True)
        train_step(t)
        opt.step()


def mean_se(xs: list[float]) -> dict[str, float]:
    from leadline.stats import mean_se as ms

    m, se = ms(xs)
    return {"mean": m, "se": se}


# ---- the model and its trained tensors -----------------------------------------------------
class Setup:
    """The model, its tokenizer, the base weights, and a way back to any arm's start."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
        if args.smoke:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
            from helpers import make_model, make_tokenizer

            self.tok = make_tokenizer()
            self.model = make_model(vocab_size=len(self.tok)).to(self.device)
        else:
            from leadline.hf.loading import load_model, load_tokenizer

            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            self.tok = load_tokenizer(args.model)
            self.model = load_model(args.model, dtype=torch.float32, device=self.device)
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id
        self.base = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}  # off the card
        self.lora_init: dict[str, Any] = {}

    def full(self) -> list[Any]:
        """Full fine-tune: back to the base weights, every parameter trained."""
        import torch

        with torch.no_grad():
            for k, v in self.model.state_dict().items():
                v.copy_(self.base[k])
        for p in self.model.parameters():
            p.requires_grad_(True)
        return [p for p in self.model.parameters() if p.requires_grad]

    def lora(self, r: int, alpha: int) -> list[Any]:
        """LoRA r on the base weights (wrapped once per rank); back to the same adapter init."""
        import peft
        import torch

        if getattr(self, "lora_rank", None) != r:
            if hasattr(self.model, "unload"):
                self.model = self.model.unload()
            self.full()
            torch.manual_seed(1234)
            cfg = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
            self.model = peft.get_peft_model(self.model, cfg)
            self.lora_rank = r
            self.lora_init = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                if n in self.lora_init:
                    p.copy_(self.lora_init[n])
        return [p for n, p in self.model.named_parameters() if n in self.lora_init]

    def opt(self, params: list[Any]) -> Any:
        import torch

        torch.manual_seed(0)
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)


# ---- the look-ahead against a sweep ----------------------------------------------------------
def sweep(s: Setup, args: argparse.Namespace, result: dict[str, Any], save: Callable[[], None]) -> None:
    steps, per_step = (24, 2) if args.smoke else (90, 8)
    raw = read_jsonl(Path(args.data_dir) / "gsm_symbolic_train.jsonl")
    random.Random(0).shuffle(raw)
    n_dec, n_judge = (16, 16) if args.smoke else (128, 256)
    enc = lambda r: encode(s.tok, r["question"] + "\n", r["answer_cot"], args.max_prompt)  # noqa: E731
    rows = {
        "train": [enc(r) for r in raw[: steps * per_step]],
        "decision": [enc(r) for r in raw[steps * per_step: steps * per_step + n_dec]],
        "judge": [enc(r) for r in read_jsonl(Path(args.data_dir) / "gsm_symbolic_test.jsonl")[:n_judge]],
    }
    out = result.setdefault("sweep", {"steps": steps, "rows_per_step": per_step, "decision_rows": n_dec, "judge_rows": n_judge})
    for mode in args.modes.split(","):
        if time.perf_counter() - T0 > args.max_seconds:
            out[mode] = {"skipped": "past --max-seconds"}
            continue
        m: dict[str, Any] = {"sweep": []}
        out[mode] = m
        try:
            sweep_mode(s, mode, rows, steps, per_step, m, save, tuple(a for a in args.sweep_extra.split(",") if a))
        except Exception as e:  # a failed arm is a result too
            m["failure"] = f"{type(e).__name__}: {e}"
            m["traceback"] = traceback.format_exc()
            log(f"sweep {mode} FAILED: {e}")
        for a in m.get("sweep", []):
            a.pop("rows", None)
        save()


def sweep_mode(s: Setup, mode: str, rows: dict[str, list], steps: int, per_step: int, m: dict[str, Any],
            save: Callable[[], None], extra_arms: tuple[str, ...] = ("replay_best", "lookahead_constant", "lookahead_warmup_fresh")) -> None:
    """One mode of the sweep experiment: the six-rate sweep, then alpha1 + the look-ahead + a run at its rate."""
    from leadline.lookahead.rate import lookahead_lr, measure_first_step
    from leadline.lookahead.rate.warmup import warmup_lr
    from leadline.stats import paired_difference

    def fresh() -> list[Any]:
        return s.full() if mode == "full" else s.lora(32, 64)

    def judged() -> list[float]:
        return row_losses(s.model, rows["judge"], s.pad, s.device)

    def held() -> list[float]:
        return row_losses(s.model, rows["decision"], s.pad, s.device)

    fresh()
    ts = make_train_step(s.model, rows["train"], per_step, s.pad, s.device)
    for lr in SWEEP[mode]:
        t1 = time.perf_counter()
        opt = s.opt(fresh())
        train(opt, ts, steps, lambda t, lr=lr: lr)
        losses = judged()
        m["sweep"].append({"lr": lr, "loss": mean_se(losses), "rows": losses, "seconds": time.perf_counter() - t1})
        log(f"sweep {mode} sweep lr={lr:g} loss={m['sweep'][-1]['loss']['mean']:.4f}")
        save()
    t1 = time.perf_counter()
    params = fresh()
    start = [p.detach().clone() for p in params]
    opt = s.opt(params)
    fs = measure_first_step(params, opt, ts, held)
    la = lookahead_lr(params, opt, ts, held, fs, total_steps=steps,
                      on_progress=lambda h: log(f"sweep {mode} horizon {h['steps']}: best {h.get('best_lr')}"))
    t2 = time.perf_counter()
    import torch

    m["state_after_phases"] = {  # what the run below starts from: the phases must leave no trace
        "weights_equal_start": all(torch.equal(p, q) for p, q in zip(params, start)),
        "optimizer_state_entries": len(opt.state), "grads_none": all(p.grad is None for p in params),
        "param_group": {k: v for k, v in opt.param_groups[0].items() if k != "params"},
        "model_training_mode": bool(s.model.training),
    }
    del start
    w = la.warmup_steps
    train(opt, ts, steps, lambda t: warmup_lr(t, la.lr, fs.alpha1, w))
    losses = judged()
    ranked = sorted(m["sweep"], key=lambda a: a["loss"]["mean"])
    best, second = ranked[0], ranked[1]
    m["lookahead"] = {
        "alpha1": fs.alpha1, "lr": la.lr, "steps_used": la.steps_used, "stopped_because": la.stopped_because,
        "horizon_steps": la.horizon_steps, "warmup_steps": w, "warmup_race": getattr(la, "warmup_race", None),
        "loss": mean_se(losses), "derive_seconds": t2 - t1,
        "first_step": fs.evidence(), "evidence": la.evidence(),
        "versus_best": paired_difference(losses, best["rows"]).as_dict(),
        "versus_second": paired_difference(losses, second["rows"]).as_dict(),
    }
    m["rules"] = {
        "R1 within 2x of the sweep's best": best["lr"] / 2 <= la.lr <= best["lr"] * 2,
        "R2 no worse than the sweep's second best": m["lookahead"]["loss"]["mean"] <= second["loss"]["mean"],
        "R3 steps <= 40% of the sweep's": la.steps_used <= 0.4 * steps * len(SWEEP[mode]),
        "sweep_best_lr": best["lr"], "sweep_second_lr": second["lr"],
        "sweep_best_at_edge": best["lr"] in (SWEEP[mode][0], SWEEP[mode][-1]),
    }
    log(f"sweep {mode}: alpha1={fs.alpha1} look-ahead lr={la.lr:.3g} ({la.stopped_because}) loss={m['lookahead']['loss']['mean']:.4f}; {m['rules']}")
    save()
    extra = (("replay_best", best["lr"], lambda t: best["lr"]), ("lookahead_constant", la.lr, lambda t: la.lr),
             ("lookahead_warmup_fresh", la.lr, lambda t: warmup_lr(t, la.lr, fs.alpha1, 10)))
    for name, lr, lr_at in (a for a in extra if a[0] in extra_arms):
        t1 = time.perf_counter()
        opt = s.opt(fresh())
        train(opt, ts, steps, lr_at)
        again = judged()
        m[name] = {"lr": lr, "loss": mean_se(again), "seconds": time.perf_counter() - t1,
                   "versus_best": paired_difference(again, best["rows"]).as_dict(),
                   "versus_lookahead": paired_difference(again, losses).as_dict()}
        log(f"sweep {mode} {name} lr={lr:.3g} loss={m[name]['loss']['mean']:.4f} (best {best['loss']['mean']:.4f}, look-ahead {m['lookahead']['loss']['mean']:.4f})")
        save()


# ---- the plan with its schedule on classification -------------------------------------------
def label_predictions(s: Setup, rows: list[dict[str, Any]], max_prompt: int) -> list[str]:
    """Each test row's label: the one whose completion (label + EOS) has the highest log-likelihood."""
    import torch

    seqs = [encode(s.tok, r["text"] + "\nSection:", " " + lab, max_prompt) for r in rows for lab in LABELS]
    was = s.model.training
    s.model.eval()
    scores: list[float] = []
    try:
        with torch.no_grad():
            for i in range(0, len(seqs), 16):
                ce, _ = token_losses(s.model, collate(seqs[i:i + 16], s.pad, s.device))
                scores += (-ce.sum(1)).tolist()
    finally:
        s.model.train(was)
    return [LABELS[max(range(4), key=lambda k: scores[4 * i + k])] for i in range(len(rows))]


def schedule(s: Setup, args: argparse.Namespace, result: dict[str, Any], save: Callable[[], None]) -> None:
    import torch

    from leadline.lookahead.rate import (
        LookaheadSchedule,
        lookahead_from,
        lookahead_lr,
        measure_first_step,
    )
    from leadline.lookahead.rate.warmup import warmup_lr
    from leadline.stats import mcnemar

    per_step = 4 if args.smoke else 16
    raw = read_jsonl(Path(args.data_dir) / "debian_sections_train.jsonl")
    random.Random(0).shuffle(raw)
    n_train = 96 if args.smoke else 3104
    n_dec = 16 if args.smoke else 128
    steps = n_train // per_step
    enc = lambda r: encode(s.tok, r["text"] + "\nSection:", " " + r["label"], args.max_prompt)  # noqa: E731
    train_rows = [enc(r) for r in raw[:n_train]]
    decision = [enc(r) for r in raw[n_train: n_train + n_dec]]
    test = read_jsonl(Path(args.data_dir) / "debian_sections_test.jsonl")[: (32 if args.smoke else None)]
    truth = [r["label"] for r in test]
    out = result.setdefault("schedule", {"steps": steps, "rows_per_step": per_step, "train_rows": n_train,
                                    "decision_rows": n_dec, "test_rows": len(test), "arms": {}})
    arms = out["arms"]
    held = lambda: row_losses(s.model, decision, s.pad, s.device)  # noqa: E731

    def judge(name: str, extra: dict[str, Any], t1: float) -> None:
        pred = label_predictions(s, test, args.max_prompt)
        correct = [p == t for p, t in zip(pred, truth)]
        shares = {lab: pred.count(lab) / len(pred) for lab in LABELS}
        arms[name] = {"accuracy": sum(correct) / len(correct), "class_shares": shares,
                      "max_class_share": max(shares.values()), "correct": correct, "seconds": time.perf_counter() - t1, **extra}
        log(f"schedule {name}: accuracy {arms[name]['accuracy']:.4f} max share {arms[name]['max_class_share']:.2f}")

    def derive_rate(tag: str) -> tuple[Any, Any, Any, Any, float]:
        """alpha1 and the full look-ahead from the adapter's init: the plan's rate."""
        t1 = time.perf_counter()
        params = s.lora(16, 32)
        opt = s.opt(params)
        ts = make_train_step(s.model, train_rows, per_step, s.pad, s.device)
        fs = measure_first_step(params, opt, ts, held)
        la = lookahead_lr(params, opt, ts, held, fs, total_steps=steps,
                          on_progress=lambda h: log(f"schedule {tag} horizon {h['steps']}: best {h.get('best_lr')} estimate {h.get('estimate')}"))
        log(f"schedule {tag}: alpha1 {fs.alpha1:.3g}, look-ahead {la.lr:.3g} ({la.stopped_because}, {la.steps_used} steps)")
        return params, opt, ts, (fs, la), time.perf_counter() - t1

    def plan_info(fs: Any, la: Any, seconds: float) -> dict[str, Any]:
        return {"alpha1": fs.alpha1, "lr": la.lr, "lookahead_stopped_because": la.stopped_because,
                "lookahead_steps": la.steps_used, "derive_seconds": seconds,
                "lookahead": la.evidence(), "first_step": fs.evidence()}

    measured: dict[str, Any] = {}

    def plan_alone() -> dict[str, Any]:
        _params, opt, ts, (fs, la), secs = derive_rate("plan")
        measured.update(fs=fs, la=la, secs=secs)
        train(opt, ts, steps, lambda t: warmup_lr(t, la.lr, fs.alpha1, la.warmup_steps))
        return {**plan_info(fs, la, secs), "schedule": f"warmup from alpha1 over {la.warmup_steps} steps, then constant"}

    def scheduled(tag: str, derive_again: bool) -> dict[str, Any]:
        if derive_again or "la" not in measured:
            params, opt, ts, (fs, la), secs = derive_rate(tag)
        else:  # the same plan as the plan-alone arm (measured once)
            params = s.lora(16, 32)
            opt = s.opt(params)
            ts = make_train_step(s.model, train_rows, per_step, s.pad, s.device)
            fs, la, secs = measured["fs"], measured["la"], measured["secs"]
        sched = LookaheadSchedule(params, opt, ts, held, lookahead_from(la), total_steps=steps,
                                  on_check=lambda c: log(f"schedule {tag} check {c['step']}: {c['loss']:.4f} {c['action']} lr={c['lr']:.3g}"))
        for t in range(steps):
            sched.before(t)
            opt.zero_grad(set_to_none=True)
            ts(t)
            opt.step()
        ending = sched.finish()
        return {**plan_info(fs, la, secs), "rollbacks": sched.rollbacks, "final_rate": sched.rate,
                "ending": ending["kept"], "schedule": sched.evidence(), "plan_measured_again": derive_again}

    def recipe() -> dict[str, Any]:
        params = s.lora(16, 32)
        opt = s.opt(params)
        ts = make_train_step(s.model, train_rows, per_step, s.pad, s.device)
        warm = math.ceil(0.03 * steps)
        train(opt, ts, steps, lambda t: 2e-4 * min((t + 1) / warm, (steps - t) / (steps - warm)))
        return {"lr": 2e-4, "warmup_steps": warm, "schedule": "linear warmup 3%, linear decay to 0"}

    def untrained() -> dict[str, Any]:
        s.lora(16, 32)
        return {}

    plan = [("untrained", untrained), ("default_recipe", recipe), ("plan_alone", plan_alone),
            ("plan_schedule", lambda: scheduled("schedule", False))]
    if args.cap_gb > 0 and s.device.type == "cuda":
        plan.append((f"plan_schedule_cap{args.cap_gb:g}gb", lambda: capped(lambda: scheduled("capped", True))))

    def capped(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        dev = s.device if s.device.index is not None else torch.device("cuda", torch.cuda.current_device())
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gb * 2**30 / total), dev)
        torch.cuda.reset_peak_memory_stats(dev)
        try:
            res = fn()
            res["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
            res["cap_bytes"] = int(args.cap_gb * 2**30)
            return res
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, dev)

    if args.schedule_arms:  # a subset, by name prefix (the others measured in an earlier run)
        want = [a.strip() for a in args.schedule_arms.split(",") if a.strip()]
        plan = [(n, f) for n, f in plan if any(n.startswith(w) for w in want)]
    for name, fn in plan:
        if time.perf_counter() - T0 > args.max_seconds:
            arms[name] = {"skipped": "past --max-seconds"}
            continue
        t1 = time.perf_counter()
        try:
            judge(name, fn(), t1)
        except Exception as e:
            arms[name] = {"failure": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            log(f"schedule {name} FAILED: {e}")
        save()
    for f in (x for x in args.schedule_baselines.split(",") if x):  # arms measured in an earlier call, with their rows
        for name, a in json.loads(Path(f).read_text())["schedule"]["arms"].items():
            if name not in arms and "correct" in a:
                arms[name] = {**a, "from": f}
    base, untr = arms.get("default_recipe", {}), arms.get("untrained", {})
    for a in arms.values():
        if "correct" in a and "correct" in base:
            a["mcnemar_vs_default_recipe"] = mcnemar(a["correct"], base["correct"]).as_dict()
        if "correct" in a and "correct" in untr:
            a["mcnemar_vs_untrained"] = mcnemar(a["correct"], untr["correct"]).as_dict()
    rules: dict[str, Any] = {}
    for tag, name in (("uncapped", "plan_schedule"), ("capped", f"plan_schedule_cap{args.cap_gb:g}gb")):
        a = arms.get(name, {})
        if "accuracy" in a and "accuracy" in untr:
            m = a["mcnemar_vs_untrained"]
            rules[f"{tag}: no class > 80%"] = a["max_class_share"] <= 0.8
            rules[f"{tag}: beats untrained (McNemar p < 0.05)"] = a["accuracy"] > untr["accuracy"] and m["p_value"] < 0.05
    out["rules"] = rules
    log(f"schedule rules: {rules}")
    save()


# ---- main ----------------------------------------------------------------------------------
def versions() -> dict[str, Any]:
    from importlib import metadata

    from leadline._version import __version__

    out: dict[str, Any] = {"python": platform.python_version(), "leadline": __version__}
    for dist in ("torch", "transformers", "peft", "gguf"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", choices=("sweep", "schedule", "all"), default="all",
                    help="sweep: the look-ahead against a six-rate sweep; schedule: the plan with its schedule on "
                         "classification; all: both")
    ap.add_argument("--modes", default="full,lora", help="the sweep's modes, in order (full, lora)")
    ap.add_argument("--model", default="/root/assets/smol.gguf")
    ap.add_argument("--data-dir", default="/root/assets/data")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-prompt", type=int, default=256, help="prompt tokens kept (the start of the prompt)")
    ap.add_argument("--cap-gb", type=float, default=6.0,
                    help="schedule arm (e): the plan + schedule under this cap; 0 skips it")
    ap.add_argument("--schedule-arms", default="",
                    help="schedule: only these arms, by name prefix (untrained, default_recipe, plan_alone, "
                         "plan_schedule, plan_schedule_cap); default all")
    ap.add_argument("--sweep-extra", default="replay_best,lookahead_constant,lookahead_warmup_fresh",
                    help="the sweep's arms beside the rules, by name (comma-separated; empty: none)")
    ap.add_argument("--schedule-baselines", default="",
                    help="schedule: JSON files of earlier runs whose arms (with their per-row results) "
                         "this run's arms are paired with")
    ap.add_argument("--max-seconds", type=float, default=480.0, help="arms that would start past this are skipped")
    ap.add_argument("--smoke", action="store_true", help="CPU smoke run: tiny random Llama, a few rows")
    args = ap.parse_args(argv)
    if args.smoke:
        args.max_prompt = min(args.max_prompt, 48)
    import torch  # noqa: F401  (so describe_machine reads the device)

    from leadline._io import write_atomic
    from leadline.measure.machine import describe_machine

    result: dict[str, Any] = {"benchmark": "rate_lookahead", "command": " ".join(sys.argv), "smoke": args.smoke,
                              "versions": versions(), "machine": describe_machine(), "started": time.time()}
    save = lambda: write_atomic(args.out, json.dumps(result, indent=1, default=str) + "\n")  # noqa: E731
    s = Setup(args)
    result["load_seconds"] = time.perf_counter() - T0
    log(f"model loaded on {s.device}")
    if args.experiment in ("sweep", "all"):
        sweep(s, args, result, save)
    if args.experiment in ("schedule", "all"):
        schedule(s, args, result, save)
    result["seconds"] = time.perf_counter() - T0
    save()
    log(f"done in {result['seconds']:.0f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
