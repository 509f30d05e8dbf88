"""The package's faces say what it does: ``leadline.__all__`` is the documented API, the default
run first, and ``import leadline`` loads no torch; the look-ahead's names resolve from their home
and are not in it; ``leadline.rate`` names the opening race and the guard as the default way to
decide the rate; ``leadline.hf`` keeps the task's names it always exported; ``leadline run
--help`` and ``leadline derive --help`` state the defaults the run uses and put every flag the
default run refuses under "only with --effort full"."""

from __future__ import annotations

import subprocess
import sys

API = {"run_in_one", "RunOptions", "RunResult", "race_only", "derive_for", "train_with_plan", "LeadlineCallback",
       "training_arguments", "load_model", "load_tokenizer", "Plan", "Value", "InputError", "LeadlineError",
       "__version__"}
"""The documented API: the default run, a Hugging Face model's plan, run and Trainer, the plan's
types, the errors (the README's "From Python")."""


def test_the_top_level_names_the_default_run_and_stays_free_of_torch():
    code = (
        "import sys, leadline\n"
        "from leadline import RunResult, run_in_one\n"
        "from leadline.run import run_in_one as run\n"
        "from leadline.run.result import RunResult as Result\n"
        "assert run_in_one is run and RunResult is Result\n"
        "print('HEAVY', [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "HEAVY []" in out.stdout, out.stdout + out.stderr


def test_all_is_the_documented_api_and_each_name_is_its_homes():
    import leadline
    import leadline.hf
    import leadline.run
    import leadline.train

    assert set(leadline.__all__) == API and len(leadline.__all__) == len(API)
    homes = {"run_in_one": leadline.run, "RunOptions": leadline.run, "race_only": leadline.run,
             "derive_for": leadline.hf, "LeadlineCallback": leadline.hf, "training_arguments": leadline.hf,
             "load_model": leadline.hf, "load_tokenizer": leadline.hf, "train_with_plan": leadline.train}
    for name, home in homes.items():
        assert getattr(leadline, name) is getattr(home, name), name


def test_the_look_ahead_is_not_in_all_and_its_earlier_names_still_resolve():
    import leadline
    import leadline.lookahead.derive
    import leadline.lookahead.pieces
    import leadline.lookahead.rate

    assert not [n for n in leadline.__all__ if getattr(getattr(leadline, n), "__module__", "").startswith(
        "leadline.lookahead")]
    assert leadline.derive is leadline.lookahead.derive.derive and leadline.Corpus is leadline.lookahead.pieces.Corpus
    assert leadline.LookaheadSchedule is leadline.lookahead.rate.LookaheadSchedule
    for name in ("derive", "Corpus", "Pieces", "LookaheadSchedule", "measure_noise_scale", "ramp", "stats"):
        assert name not in leadline.__all__ and getattr(leadline, name) is not None


def test_every_name_the_top_level_exports_resolves():
    import leadline

    missing = [name for name in leadline.__all__ if getattr(leadline, name, None) is None]
    assert not missing, missing


def test_the_rate_package_names_the_opening_race_and_the_guard_first():
    import leadline.rate

    doc = leadline.rate.__doc__ or ""
    first = doc.split("\n- ")[0]  # what it says before listing derive()'s phases
    for name in ("leadline.run.run_in_one", "leadline.rate.opening", "leadline.rate.guard", "default"):
        assert name in first, f"leadline.rate's docstring does not name {name} before derive()'s phases"


def test_the_hugging_face_layer_keeps_exporting_the_tasks_names_from_the_run():
    import leadline.hf
    import leadline.run.task

    for name in ("Task", "prepare", "tokens_to_steps", "trained_as_of", "trained_named_weights"):
        assert name in leadline.hf.__all__ and getattr(leadline.hf, name) is getattr(leadline.run.task, name)
    assert "DeriveOptions" in leadline.hf.__all__


# ---- `leadline run --help` and `leadline derive --help` say what the default run does ---------------------------

LOOKAHEAD_SAMPLES = {"--quantile": ["0.9"], "--max-seconds": ["600"], "--step-for": ["time"],
                     "--ending": ["to-zero"], "--ending-share": ["0.5"], "--resume": ["resume.json"],
                     "--prior": ["prior"], "--no-state": [], "--scale-out": [], "--fit-rank": []}
"""A value for each flag only the look-ahead effort takes, other than its default."""
SAMPLES = {"--model": ["m"], "--revision": ["v1"], "--field": ["prompt=prompt"], "--lora-rank": ["8"], "--full": [],
           "--lora-alpha": ["8"], "--seed": ["1"], "--dtype": ["bfloat16"], "--load-in-4bit": [],
           "--load-in-8bit": [], "--gradient-checkpointing": [], "--steps": ["2"], "--epochs": ["2"],
           "--seq-len": ["32"], "--rows-per-step": ["2"], "--decide-share": ["0.1"], "--lr": ["0.001"],
           "--test-share": ["0.1"], "--eval": ["EVAL"], "--train-held-out": [], "--no-train-held-out": [],
           "--html": [], **LOOKAHEAD_SAMPLES}
"""A value for every other flag a user may give (``--data``, ``--out``, ``--device`` and ``--effort`` are
given on every line), other than its default."""


def _parser(command: str):
    import argparse

    from leadline.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[command]


def _help(command: str, flag: str) -> str:
    """The flag's help as ``--help`` prints it, on one line."""
    action = _parser(command)._option_string_actions[flag]
    text = action.help % {"default": action.default} if "%(default)" in action.help else action.help
    return " ".join(text.split())


def _lookahead_flags(command: str) -> set[str]:
    from leadline.cli.derive import LOOKAHEAD_FLAGS

    group = next(g for g in _parser(command)._action_groups if g.title == LOOKAHEAD_FLAGS)
    return {s for a in group._group_actions for s in a.option_strings}


def _refused(command: str, flag: str, effort: str, tmp_path, monkeypatch) -> str | None:
    """What the command says of ``flag`` (with its sample value) at ``effort``: None where it is
    taken (the command goes on to load the model, stubbed here), else the refusal's sentence."""
    import importlib
    import io
    from contextlib import redirect_stderr

    from helpers import DATA
    from leadline import Plan
    from leadline.cli import main

    module = importlib.import_module(f"leadline.cli.{command}")
    for stage in ("_run_race", "_run") if command == "run" else ("_derive",):
        monkeypatch.setattr(module, stage, lambda *a, **k: 0)  # the checks before any load are what is read
    monkeypatch.chdir(tmp_path)
    if not (tmp_path / "prior").exists():  # --prior's plan
        (tmp_path / "prior").mkdir()
        Plan().to_json(tmp_path / "prior" / "plan.json")
    data = str(DATA / "prompt_completion.jsonl")
    value = [data if v == "EVAL" else v for v in SAMPLES[flag]]
    argv = [command, *(["--model", "m"] if command == "derive" and flag != "--model" else []), "--data", data,
            "--out", str(tmp_path / f"out-{flag.strip('-')}-{effort}"), "--device", "cpu", "--effort", effort, flag,
            *value]
    said = io.StringIO()
    with redirect_stderr(said):
        rc = main(argv)
    assert rc in (0, 2), (argv, rc, said.getvalue())
    return None if rc == 0 else said.getvalue()


def test_every_flag_of_the_commands_has_a_sample():
    for command in ("run", "derive"):
        flags = {s for a in _parser(command)._actions for s in a.option_strings if s.startswith("--")}
        missing = flags - set(SAMPLES) - {"--help", "--data", "--out", "--device", "--effort"}
        assert not missing, f"leadline {command}: add a sample value for {sorted(missing)} to SAMPLES"


def test_the_flags_the_default_run_refuses_are_the_look_ahead_group_and_full_takes_them(tmp_path, monkeypatch):
    """Each flag of ``leadline run`` and ``leadline derive`` given alone at the default effort:
    the ones refused are exactly the ``--help`` group "only with --effort full", and each of those
    is taken by ``--effort full``."""
    for command in ("run", "derive"):
        parser = _parser(command)
        assert parser.get_default("effort") == "race"
        flags = sorted(s for a in parser._actions for s in a.option_strings if s in SAMPLES)
        refused = {}
        for flag in flags:
            said = _refused(command, flag, "race", tmp_path, monkeypatch)
            if said is not None:
                refused[flag] = said
        group = _lookahead_flags(command)
        assert set(refused) == group, (command, sorted(set(refused) ^ group), refused)
        for flag, said in refused.items():
            assert flag in said and "--effort full" in said, (command, flag, said)  # the flag named, and the fix
        for flag in sorted(group):
            assert _refused(command, flag, "full", tmp_path, monkeypatch) is None, (command, flag)
    assert {"--quantile", "--max-seconds", "--step-for", "--ending", "--ending-share"} <= _lookahead_flags("run")


def test_no_help_outside_the_look_ahead_group_names_only_the_look_ahead():
    """A flag the default run takes says what it does there: no help outside the group opens with
    "with --effort full"."""
    for command in ("run", "derive"):
        group = _lookahead_flags(command)
        for action in _parser(command)._actions:
            flag = action.option_strings[0] if action.option_strings else None
            if flag is None or flag in group or flag == "-h":
                continue
            assert not _help(command, flag).startswith("with --effort full"), (command, flag)


def test_the_out_of_memory_hint_names_flags_the_default_run_takes():
    import re

    from leadline.cli import OUT_OF_MEMORY_FIX

    for command in ("run", "derive"):
        named = set(re.findall(r"--[a-z0-9-]+", OUT_OF_MEMORY_FIX[command]))
        assert named and not named & _lookahead_flags(command), (command, named)
        assert named <= set(_parser(command)._option_string_actions), (command, named)


def _stated(command: str, flag: str, pattern: str) -> str:
    import re

    m = re.search(pattern, _help(command, flag))
    assert m, f"leadline {command} {flag}: its help states no default matching {pattern!r}: {_help(command, flag)}"
    return m.group(1)


def test_each_default_the_run_help_states_is_the_one_the_run_uses(tmp_path):
    """The defaults ``leadline run --help`` states, read from its text, against what a bare
    ``leadline run`` asks of the run: the rows a step, the passes, the decide share, the held-out
    rows trained, and the adapter's rank and alpha as the model loads."""
    from helpers import DATA, make_model, make_tokenizer, save_model_dir
    from leadline.cli._common import load_for_training
    from leadline.cli.run import run_options
    from leadline.rate.opening import DECIDE_SHARE
    from leadline.run.job import prepare_job
    from leadline.run.length import MAX_PASSES
    from leadline.run.lora import ALPHA_PER_RANK, DEFAULT_RANK
    from leadline.run.options import ROWS_PER_STEP

    rows = int(_stated("run", "--rows-per-step", r"default: (\d+)\b"))
    passes = int(_stated("run", "--epochs", r"at most (\d+) passes in all"))
    share = float(_stated("run", "--decide-share", r"\(default ([0-9.]+)"))
    held_out = _stated("run", "--train-held-out", r"\(default: (on|off)\b")
    rank = int(_stated("run", "--lora-rank", r"\(default (\d+)\)"))
    alpha = int(_stated("run", "--lora-alpha", r"default: twice the rank, (\d+) at rank 16\)"))
    assert "the passes --epochs describes" in _help("run", "--steps")
    assert (rows, passes, share, held_out, rank) == (ROWS_PER_STEP, MAX_PASSES, DECIDE_SHARE, "on", DEFAULT_RANK)
    assert alpha == ALPHA_PER_RANK * DEFAULT_RANK and ALPHA_PER_RANK == 2 and DEFAULT_RANK == 16  # "twice", "at 16"

    data = str(DATA / "prompt_completion.jsonl")
    args = _parser("run").parse_args(["--model", str(save_model_dir(tmp_path / "tiny")), "--data", data,
                                      "--out", str(tmp_path / "out"), "--device", "cpu"])
    options = run_options(args)
    assert options.decide_share == share and options.train_held_out is (held_out == "on")
    tok = make_tokenizer()
    job = prepare_job(make_model(vocab_size=len(tok)), tok, data, options)
    assert job.rows_per_step == rows and job.passes_left + 1 == passes  # one pass planned, the rest may follow
    assert job.steps == len(job.task.order) // rows
    model, _ = load_for_training(args)
    lora = model.peft_config["default"]
    assert (lora.r, lora.lora_alpha) == (rank, alpha)


def test_the_readme_is_short_and_reads_in_its_order():
    """At most 250 lines: what it is, the two commands, the example with its output, the results
    table between its markers, then the API; the rest lives in docs/ and is linked."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert len(readme.splitlines()) <= 250, len(readme.splitlines())
    first_section = readme.index("\n## ")
    assert readme.index("make demo") < first_section and readme.index("make test") < first_section
    assert "derive and train" not in readme and "trains it" in readme[:first_section]
    assert "docs/results.md`, \"The sweep\")" in readme[:first_section]
    order = ["## One command", "## An example: `make demo`", "<!-- scoreboard:start -->", "<!-- scoreboard:end -->",
             "## From Python", "leadline.__all__"]
    places = [readme.index(mark) for mark in order]
    assert places == sorted(places), order
    for name in API - {"__version__", "LeadlineError"}:
        assert f"`{name}" in readme[readme.index("## From Python"):], f"the README's API does not name {name}"
