# The two commands: `make demo` and `make test`. Each creates .venv when missing and
# installs what it needs (re-installing only when pyproject.toml changes).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# Extras that `make test` installs so every optional part's tests run in CI.
TEST_EXTRAS := test,data,data-ray,torchbridge,serve,inference-test,experiments,experiments-test,ui,notebook
# XLA's CPU runtime returns large buffers to the OS every step and faults them back in;
# these glibc settings removed that (1.36x faster steps, PERF-NOTES.md).
export GLIBC_TUNABLES ?= glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736

.PHONY: demo test test-xla lint bench-quick clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed-base: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# --no-compile: pip would byte-compile all ~22,000 installed files (~100 CPU-s, measured
# 35 s for torch + transformers + ray's 7,724); the tests import a fraction of them, and
# Python compiles (and caches) those on first import.
$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q --no-compile -e ".[$(TEST_EXTRAS)]"
	touch $@ $(VENV)/.installed-base

# The demo needs the data pipeline, the experiments store, the server and the OpenAI client.
$(VENV)/.installed-demo: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[data,experiments,serve,run]"
	touch $@ $(VENV)/.installed-base

demo: $(VENV)/.installed-demo
	$(BIN)/jaxcore run configs/demo.yaml

# Two pytest-xdist workers, one test file per work unit (tests/conftest.py): much of the
# suite waits on subprocesses, servers and sleeps, which two workers overlap on 2 cores.
TEST_WORKERS ?= 2
test: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# torch_xla is built against its own torch release, so it lives in its own venv.
test-xla:
	bash scripts/test-xla.sh

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check jaxcore tests/jaxcore

bench-quick: $(VENV)/.installed-test
	for b in benchmarks/engine_overhead.py benchmarks/zero_memory.py benchmarks/vs_torch_cpu.py; do \
		$(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) demo_runs .pytest_cache
