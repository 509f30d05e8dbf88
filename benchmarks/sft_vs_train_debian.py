"""The plan through TRL's SFTTrainer against the plan through `leadline train`, on
SmolLM2-135M-Instruct with LoRA r16 over a bf16 base, on debian_sections.

Rows as benchmarks/e2e_debian.py makes them: prompt = the package description + "\\nSection:",
completion = " " + the label; accuracy on every row of debian_sections_test, each of the four
labels scored by the log-likelihood of its completion under the trained adapter (e2e_debian's
``predictions``). Both arms derive at the full effort for one epoch; bf16 base.

Arms:
  train    leadline derive --dtype bfloat16 --gradient-checkpointing --effort full --epochs 1, then
           leadline train --plan (checkpointing on, as SFTConfig's default has it)
  sft      docs/hf.md's SFTTrainer snippet: SFTTrainer(model in bf16, SFTConfig(bf16=True,
           num_train_epochs=1), peft_config=LoRA r16); derive_for(probe); a second SFTTrainer with
           training_arguments(plan, config) and LeadlineCallback.for_plan(plan, probe)

Decision rules, written before the run:
  R1 the SFTTrainer arm loses nothing to `leadline train`: its accuracy is not lower with
     McNemar p < 0.05 on all test rows (paired by row).
  R2 neither arm predicts one class for more than 80% of the test rows.

On the H200 (the model and data where e2e_debian.py reads them):

    PYTHONPATH=src python3 benchmarks/sft_vs_train_debian.py --model /root/assets/smol.gguf \\
        --data-dir /root/assets/data --out $OUT/sft_vs_train_debian.json

CPU smoke (the tiny test model saved as a folder, 48 synthetic rows of the same four labels):

    python3 benchmarks/sft_vs_train_debian.py --smoke --out /tmp/sft_vs_train_smoke.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))
from e2e_debian import LABELS, cli, judge, log, predictions, to_pc  # noqa: E402


def smoke_data(folder: Path) -> Path:
    """debian_sections-shaped rows ({"text", "label"}) of a few words each, 48 train and 16 test."""
    rng = random.Random(0)
    words = {"games": "play level score player board", "net": "network packet socket server proxy",
             "science": "physics chemistry data model molecule", "sound": "audio mixer volume music codec"}
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", 48), ("test", 16)):
        rows = []
        for i in range(n):
            label = LABELS[i % 4]
            text = "a program for " + " ".join(rng.choice(words[label].split()) for _ in range(6))
            rows.append({"text": text, "label": label})
        (folder / f"debian_sections_{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def sft_arm(model_path: str, train: Path, out: Path, smoke: bool) -> dict[str, Any]:
    """docs/hf.md's SFTTrainer path on a bf16 base; returns the plan, the callback's evidence and
    the trained PEFT model."""
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from leadline.hf import LeadlineCallback, derive_for, load_model, load_tokenizer, training_arguments

    tok = load_tokenizer(model_path)
    model = load_model(model_path, dtype=torch.bfloat16)
    data = load_dataset("json", data_files=str(train), split="train")
    config = SFTConfig(output_dir=str(out), num_train_epochs=1, bf16=not smoke, use_cpu=smoke, report_to=[],
                       save_strategy="no", logging_steps=10, dataset_num_proc=None, seed=0)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM")
    t = time.perf_counter()
    probe = SFTTrainer(model=model, args=config, train_dataset=data, processing_class=tok, peft_config=lora)
    plan = derive_for(probe, effort="full", progress=False)  # the run this benchmark measured
    derive_s = time.perf_counter() - t
    callback = LeadlineCallback.for_plan(plan, probe)
    trainer = SFTTrainer(model=probe.model, args=training_arguments(plan, config), train_dataset=data,
                         processing_class=tok, callbacks=[callback])
    t = time.perf_counter()
    with callback:
        trainer.train()
    plan.to_json(out / "plan.json")
    return {"derive_seconds": derive_s, "train_seconds": time.perf_counter() - t,
            "steps": trainer.state.global_step, "plan": {n: plan.get(n) for n in (
                "micro_batch", "grad_accum", "lr", "total_steps", "seq_len", "scored_tokens")},
            "loss_policy": plan.get("loss_policy"), "callback": callback.evidence(),
            "model": trainer.model, "tokenizer": tok}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="/root/assets/smol.gguf")
    ap.add_argument("--data-dir", default="/root/assets/data")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/sft_vs_train_debian")
    ap.add_argument("--max-chars", type=int, default=600)
    ap.add_argument("--arms", default="train,sft")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--smoke", action="store_true", help="the tiny test model and synthetic rows, on the CPU")
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from helpers import save_model_dir

        args.model = str(save_model_dir(work / "tiny_model"))
        args.data_dir = str(smoke_data(work / "data"))
    import torch

    from leadline import stats
    from leadline._io import write_atomic

    out = Path(args.out)
    result: dict[str, Any] = {"benchmark": "sft_vs_train_debian", "command": sys.argv, "args": vars(args),
                              "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                              "arms": {}, "failures": []}

    def save() -> None:
        write_atomic(out, json.dumps(result, indent=1, default=str))

    train = work / "train.jsonl"
    to_pc(Path(args.data_dir) / "debian_sections_train.jsonl", train, args.max_chars)
    test_rows = [json.loads(line) for line in (Path(args.data_dir) / "debian_sections_test.jsonl").read_text()
                 .splitlines() if line.strip()]
    gold = [r["label"] for r in test_rows]
    preds: dict[str, list[str]] = {}
    arms = args.arms.split(",")
    # checkpointing on as SFTConfig's default has it: the same forward, the same measured memory
    common = ["--model", args.model, "--data", str(train), "--lora-rank", "16", "--dtype", "bfloat16",
              "--gradient-checkpointing"]
    if args.smoke:
        common += ["--device", "cpu"]
    if "train" in arms:
        plan = work / "train_plan.json"
        r = cli(["derive", *common, "--effort", "full", "--epochs", "1", "--out", str(plan)], work / "derive.log",
                args.timeout)
        result["arms"]["derive"] = r
        if r["rc"] == 0:
            run_dir = work / "run_train"
            result["arms"]["train"] = cli(["train", *common, "--plan", str(plan), "--out", str(run_dir)],
                                          work / "train.log", args.timeout)
            if (run_dir / "run.json").exists():
                from peft import PeftModel

                from leadline.hf import load_model, load_tokenizer

                tok = load_tokenizer(args.model)
                m = PeftModel.from_pretrained(load_model(args.model, dtype=torch.bfloat16), str(run_dir))
                preds["train"] = predictions(m, tok, test_rows, args.max_chars)
        save()
    if "sft" in arms:
        try:
            r = sft_arm(args.model, train, work / "run_sft", args.smoke)
            model, tok = r.pop("model"), r.pop("tokenizer")
            result["arms"]["sft"] = r
            preds["sft"] = predictions(model, tok, test_rows, args.max_chars)
            log("sft", f"{r['steps']} steps", f"derive {r['derive_seconds']:.1f} s", f"train {r['train_seconds']:.1f} s")
        except Exception:  # recorded, never hidden
            result["failures"].append(traceback.format_exc())
        save()
    verdict: dict[str, Any] = {}
    for name, p in preds.items():
        verdict[name] = {**judge(p, gold), "predictions": p}
        log(name, f"accuracy {verdict[name]['accuracy']:.4f}", f"top class {verdict[name]['top_class_share']:.2f}")
    rules: dict[str, Any] = {}
    if "sft" in preds and "train" in preds:
        right = {k: [a == g for a, g in zip(preds[k], gold)] for k in ("sft", "train")}
        test = stats.mcnemar(right["sft"], right["train"]).as_dict()
        verdict["sft_vs_train"] = test
        rules["R1"] = "FAIL" if verdict["sft"]["accuracy"] < verdict["train"]["accuracy"] and \
            test["p_value"] < 0.05 else "PASS"
    if preds:
        rules["R2"] = "PASS" if all(verdict[k]["top_class_share"] <= 0.8 for k in preds) else "FAIL"
    result["verdict"], result["rules_outcome"] = verdict, rules
    save()
    log("wrote", out, rules)
    return 0 if not result["failures"] and "FAIL" not in rules.values() else 1


if __name__ == "__main__":
    raise SystemExit(main())
