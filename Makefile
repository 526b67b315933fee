# ufp4-megatron: every entry point a developer, CI or a cluster user needs.
# `make demo` and `make test` are the two commands the README promises on a fresh machine.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
PYTEST := $(VPY) -m pytest

STAMP := $(VENV)/.installed-$(shell cat Makefile pyproject.toml scripts/install.sh requirements/*.txt 2>/dev/null | sha1sum | cut -c1-12)

.PHONY: install test test-gpu test-all test-wheel demo bench wheelhouse patch-check lint clean help

help:
	@echo "make install | test | demo | test-gpu | test-wheel | bench | wheelhouse PY=3.12 | patch-check | clean"

install: $(STAMP)

$(STAMP): Makefile pyproject.toml scripts/install.sh $(wildcard requirements/*.txt)
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/install.sh
	rm -f $(VENV)/.installed-*; touch $(STAMP)

# The CPU suite: what CI runs first (.ci/run, then test-slow). GPU-only and long tests have
# their own targets. Two xdist workers by default (most tests wait on trainer subprocesses);
# --dist loadgroup puts the tests that share a costly fixture on one worker (tests/conftest.py).
# This 2-core machine is an Intel Xeon, ~2x slower than the AMD EPYC of earlier sessions (11:49
# there, 2026-12-02), and its speed varies by the hour: three runs of make test with the same
# code took 13:02, 17:42 and 20:24 (CPU time 21, 29 and 33 min; 2026-12-03); ~24 and ~31
# minutes before 22 long tests moved to test-slow. TEST_WORKERS=0 runs them in this process.
# The tests on the local Slurm cluster run after, alone.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)
test: install
	$(PYTEST) -q -m "not gpu and not slow and not slurm" -p no:cacheprovider $(XDIST)
	$(PYTEST) -q -m "slurm and not gpu and not slow" -p no:cacheprovider

test-gpu: install
	$(PYTEST) -q -m gpu -p no:cacheprovider

# Long CPU tests kept out of `make test` (its 20-minute budget on a 2-core machine), all but the
# fused-loss run beside a cheaper test of the same thing there (each says which); CI runs them
# after make test. 23 tests, 9:04 here on 2026-12-03.
test-slow: install  # exit 5 of pytest is "no tests collected"
	$(PYTEST) -q -m "slow and not gpu" -p no:cacheprovider $(XDIST) || [ $$? -eq 5 ]

# Part of `make test`; alone: build the wheel, install it into a fresh venv (reusing this
# venv's dependencies, offline), train/describe/launch from outside the checkout.
test-wheel: install
	$(PYTEST) -q tests/launch/test_wheel_install.py -p no:cacheprovider

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
