# The two commands of the README: `make demo` and `make test`. Both set themselves up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Two workers: the machine has two cores; the simulation suites dominate the run time.
PYTEST_WORKERS ?= 2

.PHONY: install demo demo-sim test test-fast lint typecheck bench clean

install: $(STAMP)

# Reinstalled only when the dependency list changes, so a second `make install` is instant.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: install
	$(PY) -m raftlog.node.demo

demo-sim: install
	$(PY) -m raftlog.node.sim.demo

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

# Everything: lint, types, and every test of every marker. pytest's exit code 5
# (nothing collected) fails the run like any other non-zero code.
test: lint typecheck
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) -q --durations=15

# The quick loop for a developer: everything not marked slow.
test-fast: install
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) -q -m "not slow"

bench: install
	$(PY) -m bench.run

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
