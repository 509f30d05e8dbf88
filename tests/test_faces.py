"""The package's faces say what it does: ``leadline`` names the default run and loads no torch to
do so; ``leadline.rate`` names the opening race and the guard as the default way to decide the
rate; ``leadline.hf`` keeps the task's names it always exported, now from the run's own home."""

from __future__ import annotations

import subprocess
import sys


def test_the_top_level_names_the_default_run_and_stays_free_of_torch():
    code = (
        "import sys, leadline\n"
        "assert {'run_in_one', 'RunResult'} <= set(leadline.__all__), leadline.__all__\n"
        "from leadline import RunResult, run_in_one\n"
        "from leadline.run import run_in_one as run\n"
        "from leadline.run.result import RunResult as Result\n"
        "assert run_in_one is run and RunResult is Result\n"
        "print('HEAVY', [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "HEAVY []" in out.stdout, out.stdout + out.stderr


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
