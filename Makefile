# ufp4-megatron: every entry point a developer, CI or a cluster user needs.
# `make demo` and `make test` work on a fresh Linux machine with Python 3.11+ (CONTRIBUTING.md).

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
PYTEST := $(VPY) -m pytest

STAMP := $(VENV)/.installed-$(shell cat Makefile pyproject.toml scripts/install.sh requirements/*.txt 2>/dev/null | sha1sum | cut -c1-12)

.PHONY: install test test-slow test-gpu test-all test-wheel demo bench wheelhouse patch-check lint clean help

help:
	@echo "make install | test | test-slow | demo | test-gpu | test-wheel | lint | bench | wheelhouse PY=3.12 | patch-check | clean"

install: $(STAMP)

$(STAMP): Makefile pyproject.toml scripts/install.sh $(wildcard requirements/*.txt)
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/install.sh
	rm -f $(VENV)/.installed-*; touch $(STAMP)

# The CPU suite: what CI runs first (.ci/run, then test-slow); it is kept under 20 minutes on a
# 2-core machine. GPU-only and long tests have their own targets. Two xdist workers by default
# (most tests wait on trainer subprocesses); --dist loadgroup puts the tests that share a costly
# fixture on one worker (tests/conftest.py). TEST_WORKERS=0 runs them in this process. The
# tests on the local Slurm cluster run after, alone. `lint` runs first: a lint or format
# finding fails the suite in seconds. The GPUs are hidden (CPU_ONLY): on a GPU node the suite
# tests what it tests on CI, CPU runs, which the trainer refuses where CUDA is visible
# (docs/training.md); the GPU paths are make test-gpu's and gpu/*.sh's.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)
CPU_ONLY := CUDA_VISIBLE_DEVICES=
test: install lint
	$(CPU_ONLY) $(PYTEST) -q -m "not gpu and not slow and not slurm" -p no:cacheprovider $(XDIST)
	$(CPU_ONLY) $(PYTEST) -q -m "slurm and not gpu and not slow" -p no:cacheprovider

test-gpu: install
	$(PYTEST) -q -m gpu -p no:cacheprovider

# Long CPU tests kept out of `make test` (to keep it under 20 minutes on a 2-core machine), all
# but the fused-loss run beside a cheaper test of the same thing there (each says which); CI
# runs them after make test (about 10 minutes on two cores).
test-slow: install  # exit 5 of pytest is "no tests collected"
	$(CPU_ONLY) $(PYTEST) -q -m "slow and not gpu" -p no:cacheprovider $(XDIST) || [ $$? -eq 5 ]

# The wheel alone: build it, install it into a fresh venv (reusing this venv's dependencies,
# offline) and train/describe/launch from outside the checkout; resolve its declared
# dependencies with pip for Python 3.11 and 3.12 (needs the package registries); and (slow)
# install it with those dependencies into an empty venv and train. All but the last are part
# of `make test`.
test-wheel: install
	$(PYTEST) -q tests/launch/test_wheel_install.py tests/launch/test_wheel_dependencies.py \
		-p no:cacheprovider

# ruff's lint rules and formatter (pyproject.toml, [tool.ruff]); ruff comes with the test extra.
# `ruff check --fix . && ruff format .` repairs most findings.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test-all: install
	$(PYTEST) -q -p no:cacheprovider

demo: install
	$(VPY) -m ufp4_megatron.cli.demo

bench: install
	$(VPY) -m ufp4_megatron.bench --out docs/performance.md

# Wheels an air-gapped GPU node needs for this package, for Python $(PY) (default 3.12, the
# GPU image's); torch and triton stay those of the node's CUDA image.
PY ?= 3.12
wheelhouse:
	PY=$(PY) PYTHON=$(PYTHON) bash scripts/wheelhouse.sh

# Megatron-LM patches and routes; MEGATRON_LM_DIR=/path/to/Megatron-LM (core_r0.19.0) adds
# the checkout's own tests (pretrain_gpt.py, its 0.19.1 megatron/core).
patch-check: install
	$(PYTEST) -q tests/patches tests/megatron_lm -p no:cacheprovider

clean:
	rm -rf $(VENV) wheelhouse .pytest_cache build *.egg-info
