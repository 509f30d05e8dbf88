"""The ``README.md`` beside a run's adapter (or weights): what it was trained from, with what, and
how good it is, read off the plan and the run's record (``run.json``).

It replaces PEFT's model card template, whose fields are left for the user to fill: here every
line is a fact the run measured or was given. The front matter is the Hugging Face Hub's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import os

    import torch

    from leadline.plan import Plan

MAIN_VALUES = ("lr", "optimizer", "total_steps", "rows_per_step", "micro_batch", "grad_accum", "warmup_steps",
               "weight_decay", "seq_len", "scored_tokens", "lora_rank", "lora_alpha", "lora_targets", "lora_dropout",
               "precision")
"""The plan's values the card lists, where the plan has them."""


def base_of(model: torch.nn.Module) -> str:
    """The base model's name or path, as the saved adapter names it.

    Examples:
        >>> from types import SimpleNamespace
        >>> base_of(SimpleNamespace(peft_config={"default": SimpleNamespace(base_model_name_or_path="org/base")}))
        'org/base'
        >>> base_of(SimpleNamespace(config=SimpleNamespace(name_or_path="/models/tiny")))
        '/models/tiny'
    """
    for cfg in (getattr(model, "peft_config", None) or {}).values():
        base = getattr(cfg, "base_model_name_or_path", None)
        if base:
            return str(base)
    return str(getattr(getattr(model, "config", None), "name_or_path", "") or "unknown")


def model_card(plan: Plan, record: dict[str, Any], base: str, folder: str = ".") -> str:
    """The card: front matter, then the base, the data (its file, rows and hash), the plan's main
    values with their kinds, the held-out (and eval) readings before and after, the outcome, and
    how to load it from ``folder``.

    Examples:
        >>> from leadline.plan import Plan, Value
        >>> plan = Plan(data={"path": "train.jsonl", "sha256": "ab12"})
        >>> plan.set("lr", Value(0.0025, "constant", "schedule-free's default", unit="per step"))
        >>> plan.set("lora_rank", Value(16, "constant", "leadline's default"))
        >>> record = {"train_rows": 86, "outcome": "improved", "kept_step": 20, "checks": [],
        ...           "held_out_before": {"mean": 5.94, "se": 0.01, "rows": 10},
        ...           "held_out_after": {"mean": 5.67, "se": 0.02, "rows": 10},
        ...           "answers": {"held_out": {"rows": 10, "before": {"accuracy": 0.3}, "after": {"accuracy": 0.9}}}}
        >>> card = model_card(plan, record, "org/base", "run")
        >>> print(card[card.index("- **Base"):card.index("Every number")].strip())
        - **Base model:** `org/base`
        - **Data:** `train.jsonl`, 86 training rows, sha256 `ab12`
        - **Held-out loss:** 5.9400 ± 0.0100 before, 5.6700 ± 0.0200 after on 10 rows
        - **Held-out accuracy:** 30% before, 90% after on 10 rows
        - **Outcome:** improved; the model kept is step 20's
        <BLANKLINE>
        ## Trained with
        <BLANKLINE>
        | value | number | kind |
        | --- | --- | --- |
        | lr | 0.0025 per step | constant |
        | lora_rank | 16 | constant |
    """
    adapter = "lora_rank" in plan
    lines = ["---", f"base_model: {base}", f"library_name: {'peft' if adapter else 'transformers'}", "tags:",
             "- leadline", *(["- lora"] if adapter else []), "---", "",
             f"# {'A LoRA adapter' if adapter else 'A fine-tuned model'} trained by leadline", "",
             f"- **Base model:** `{base}`", _data_line(plan.data, record)]
    lines += _readings(record)
    values = [f"| {n} | {plan[n].text()} | {plan[n].kind} |" for n in MAIN_VALUES if n in plan]
    if values:
        lines += ["", "## Trained with", "", "| value | number | kind |", "| --- | --- | --- |", *values]
    lines += ["", "Every number's sentence and evidence is in `plan.json` (`leadline report "
              f"{folder} --why NAME`); the run's record, its checks and its curve, in `run.json`.", "",
              "## Load it", "", "```python"]
    if adapter:
        lines += ["from peft import AutoPeftModelForCausalLM", "",
                  f"model = AutoPeftModelForCausalLM.from_pretrained({json.dumps(folder)})"]
    else:
        lines += ["from transformers import AutoModelForCausalLM", "",
                  f"model = AutoModelForCausalLM.from_pretrained({json.dumps(folder)})"]
    return "\n".join([*lines, "```", ""])


def write_card(folder: str | os.PathLike[str], plan: Plan, record: dict[str, Any], model: torch.nn.Module) -> Path:
    """The card written whole as ``folder/README.md`` (over PEFT's template); returns its path."""
    from leadline._io import write_atomic

    return write_atomic(Path(folder) / "README.md", model_card(plan, record, base_of(model), str(folder)))


def _data_line(data: dict[str, Any], record: dict[str, Any]) -> str:
    path = data.get("path") or "rows given in memory"
    rows = record.get("train_rows")
    return (f"- **Data:** `{path}`" + (f", {rows} training rows" if rows else "")
            + (f", sha256 `{data['sha256']}`" if data.get("sha256") else ""))


def _readings(record: dict[str, Any]) -> list[str]:
    """The loss and, for a classifier, the accuracy before and after, on the held-out and eval rows."""
    out = []
    b, a = record.get("held_out_before"), record.get("held_out_after")
    if b and a:
        out.append(f"- **Held-out loss:** {_loss(b)} before, {_loss(a)} after on {a.get('rows', '?')} rows")
    t0, t1 = record.get("test_loss_before"), record.get("test_loss_after")
    if t0 and t1:
        out.append(f"- **{str(record.get('test_source') or 'test').capitalize()} loss:** {_loss(t0)} before, "
                   f"{_loss(t1)} after on {t1.get('rows', record.get('test_rows', '?'))} rows no decision read")
    answers = record.get("answers") or {}
    for part, label in (("held_out", "Held-out"), ("test", str(answers.get("test_source") or "test").capitalize())):
        check = answers.get(part) or {}
        if check.get("before") and check.get("after"):
            out.append(f"- **{label} accuracy:** {check['before']['accuracy']:.0%} before, "
                       f"{check['after']['accuracy']:.0%} after on {check['rows']} rows")
    kept = record.get("kept_step")
    out.append(f"- **Outcome:** {record.get('outcome', 'unknown').replace('_', ' ')}"
               + (f"; the model kept is step {kept}'s" if kept is not None else ""))
    return out


def _loss(r: dict[str, Any]) -> str:
    return f"{r['mean']:.4f} ± {r['se']:.4f}"
