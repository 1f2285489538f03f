# The two commands of the README: `make demo` and `make test`. Both set themselves up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Three workers on two cores: with two, the machine stayed 15 % idle over `make test` (tests
# waiting on processes they started); with three, 4 %, and runs took 15 min 56 s and 16 min 38 s
# against 16 min 47 s and 17 min 7 s (fresh clones, 2026-11-29; a trial the day before gained
# nothing).
# Four made both suites slower and failed two timing tests.
PYTEST_WORKERS ?= 3

.PHONY: install jvm native demo demo-sim test test-fast lint typecheck bench clean cluster cluster-down mutate \
	s3server

install: $(STAMP) jvm native

# Reinstalled only when the dependency list (or the Makefile, which pins pip and uv) changes, so
# a second `make install` is instant.
# The dependencies' wheels are kept outside the checkout, keyed by the venv's Python and the
# declared dependencies: built once by pip (whose cache keeps pyspark's wheel, built from its
# sdist), then installed by uv from them alone, compiled to bytecode (PYTHONDONTWRITEBYTECODE is
# set here: without it every node process the tests start compiled aiohttp and pydantic again),
# in less time than `pip install` took (40 s; uv from the index rebuilds pyspark every time).
# One run at a time builds, installs from or prunes them (flock); the 3 newest are kept.
WHEELHOUSE := $(HOME)/.cache/raftlog-wheels
# Pinned: pip's version keys the cluster's images (cluster/images.py), and an installed pin is
# not asked of the index again.
PIP_VERSION := 26.3
UV_VERSION := 0.13.9
DEPS_KEY = $(PY) -c 'import sys, tomllib; t = tomllib.load(open("pyproject.toml", "rb")); \
	print(sys.version, t["build-system"], t["project"]["dependencies"], \
	t["project"].get("optional-dependencies"))'
$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check pip==$(PIP_VERSION) uv==$(UV_VERSION)
	@mkdir -p $(WHEELHOUSE) && exec 9>$(WHEELHOUSE)/.lock && flock 9 && \
	wheels=$(WHEELHOUSE)/$$($(DEPS_KEY) | sha256sum | cut -c1-12) && \
	if [ ! -f $$wheels/.complete ]; then \
		rm -rf $$wheels && $(PY) -m pip wheel --quiet -w $$wheels '.[dev]' hatchling editables && \
		rm -f $$wheels/raftlog-*.whl && touch $$wheels/.complete && \
		{ ls -dt $(WHEELHOUSE)/*/ | tail -n +4 | xargs -r rm -rf; }; \
	fi && echo "uv pip install -e '.[dev]' from $$wheels" && \
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) --offline --no-index \
		--find-links $$wheels -e '.[dev]'
	@touch $(STAMP)

# The JVM reader of the Spark source (format `raftlog-jvm`), compiled against pyspark's own jars
# and rebuilt when a Java source changes. Without a JDK, Debian's is installed (CI has no stdin).
# The jar's entries carry a fixed date, so the same sources make the same bytes: the Spark
# image, keyed by them (cluster/images.py), is then not rebuilt for every fresh clone (123 s).
JVM_JAR := spark/raftlog/spark/jars/raftlog-spark.jar
JVM_SRC := $(shell find spark/jvm/src -type f)
JVM_OUT := spark/jvm/build
SPARK_JARS = $(shell $(PY) -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')/jars
APT = $(if $(filter 0,$(shell id -u)),,sudo -n) env DEBIAN_FRONTEND=noninteractive apt-get -y -qq

jvm: $(JVM_JAR)

# The node's hot modules compiled with mypyc (node/raftlog/node/native.py) into
# ~/.cache/raftlog-native, keyed by their sources: about 20 s when one of them changed,
# a hash of them otherwise. A node uses the build only while its sources are the ones built.
native: $(STAMP)
	@command -v cc >/dev/null || { $(APT) update && $(APT) install gcc; }
	@$(PY) -m raftlog.node.native_build

$(JVM_JAR): $(JVM_SRC) $(STAMP) Makefile
	@command -v javac >/dev/null || { $(APT) update && $(APT) install openjdk-17-jdk-headless; }
	@rm -rf $(JVM_OUT) && mkdir -p $(JVM_OUT) $(dir $@)
	@echo "javac, jar -> $@"
	@javac --release 17 -Xlint:all,-path,-serial -Werror -d $(JVM_OUT) -cp '$(SPARK_JARS)/*' \
		$(filter %.java,$^)
	@jar --create --date=1980-01-01T00:00:02Z --file $@ -C $(JVM_OUT) . -C spark/jvm/src/main/resources .

demo: install
	$(PY) -m raftlog.demo

demo-sim: install
	$(PY) -m raftlog.node.sim.demo

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy's cache lives outside the checkout, by mypy's version, so a fresh clone checks in about a
# second instead of ~18 s: a module whose source hash is unchanged (whatever its mtime) is not
# checked again, and a changed one is checked with everything that depends on it.
typecheck: install
	$(VENV)/bin/mypy --cache-dir "$$HOME/.cache/raftlog-mypy/$$($(VENV)/bin/mypy --version | cut -d' ' -f2)"

# Everything: lint, types, and every test of every marker. The project's own modules are
# compiled to bytecode first: with PYTHONDONTWRITEBYTECODE set (as on CI's machines) every
# node, `raftctl` and operator process the tests start compiled them again (0.1 s of CPU
# each). pytest's exit code 5 (nothing collected) fails the run like any other non-zero
# code. The tests outside `k8s` run on
# PYTEST_WORKERS workers with `--dist worksteal`: a worker that runs out takes half of another's
# queue (with `--dist load`, one worked alone for the last two minutes). The `k8s` suite runs on the real
# cluster beside the rest (it mostly waits on the cluster), two tests at a time, each in its own
# namespace; a test whose operator watches every namespace (`cluster_wide`) runs alone after them.
# Each run collects only its own folder: collecting means pytest rewriting every test module's
# asserts (about 9 s of CPU a process here), five processes in all.
# Its output is kept in .cluster/k8s-tests.log and shown at the end with the figures its tests
# measured; a cluster `make test` started is stopped again (also on failure), one that
# `make cluster` started stays up.
test: lint typecheck s3server
	@$(PY) -m compileall -q -j 2 node operator spark harness demo tests >/dev/null
	@was_up=$$($(PY) -m cluster status >/dev/null 2>&1 && echo yes); mkdir -p .cluster; \
	rm -f .cluster/k8s-figures.log; \
	( $(PY) -m cluster up && { $(VENV)/bin/pytest -q --durations=15 -n 2 --dist worksteal \
		-m "k8s and not cluster_wide" tests/k8s; a=$$?; \
		$(VENV)/bin/pytest -q -m "k8s and cluster_wide" tests/k8s; \
		b=$$?; [ $$a -eq 0 ] && [ $$b -eq 0 ]; } ) > .cluster/k8s-tests.log 2>&1 & k8s=$$!; \
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist worksteal -q --durations=15 -m "not k8s" \
		--ignore=tests/k8s; rest=$$?; \
	wait $$k8s; k8s_rc=$$?; echo "---- the k8s suite (.cluster/k8s-tests.log)"; \
	cat .cluster/k8s-tests.log; cat .cluster/k8s-figures.log 2>/dev/null; \
	[ -n "$$was_up" ] || $(PY) -m cluster down; \
	echo "not k8s: exit $$rest; k8s: exit $$k8s_rc"; [ $$rest -eq 0 ] && [ $$k8s_rc -eq 0 ]

# The S3-compatible server of the tests (SeaweedFS's `weed`, harness/raftlog/harness/s3.py), built
# from the Go module proxy at the version of cluster/layout.py into
# ~/.cache/raftlog-cluster/seaweedfs-<version>/ (its log beside it), so a second run builds nothing.
# The first build took 15 min on this 2-core machine (empty Go build cache, other work running;
# the module download before it 2.4 min more): docs/test-cluster.md.
s3server: install
	@$(PY) -m cluster weed >/dev/null

# A real single-machine Kubernetes (cluster/): builds what is missing (cached by version under
# ~/.cache/raftlog-cluster), starts it, prints `export KUBECONFIG=...`. Needs root.
cluster: install
	$(PY) -m cluster up

cluster-down: install
	$(PY) -m cluster down

# The quick loop for a developer: everything not marked slow.
test-fast: install s3server
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) -q -m "not slow"

# Single-line mutants of the Raft core (tests/mutation/mutants.py), each run against the unit
# tests and the simulation at CI's seeds; fails if one that is not equivalent survives. Not part
# of `make test` (a survivor runs the whole simulation: tens of minutes in all).
mutate: install
	$(PY) -m tests.mutation

bench: install
	$(PY) -m bench.run

clean:
	rm -rf $(VENV) $(JVM_OUT) $(JVM_JAR) .pytest_cache .mypy_cache .ruff_cache
