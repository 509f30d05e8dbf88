# make demo  — creates .venv, installs, runs the main job on the embedded default model and data
# make test  — creates .venv, installs, runs ruff and the whole suite (GPU tests skip without CUDA)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The exact CPU wheel lies on these machines' disk; a bare `torch` pulls a multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: demo test lint clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[hf,report,dev]'
	touch $@

$(VENV)/.demo: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[demo]'
	touch $@

demo: $(VENV)/.demo
	$(VENV)/bin/leadline demo

lint: $(VENV)/.installed
	$(PY) -m ruff check src tests benchmarks examples

test: lint
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
