# colocgrpo — the commands for a newcomer:
#   make demo   the main job on the embedded default (local control plane, fake GPU nodes and a real node, the
#               operator from its chart, the sample job in the trainer image)
#   make demo-learn  the same path with a real small model whose reward rises (about 15 minutes on 2 cores)
#   make test   every test
# Everything slow (venvs, Go-built control-plane binaries, helm) is cached outside the repo under $(CACHE),
# keyed by what it was built from, so a warm run is fast.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
CACHE ?= $(HOME)/.cache/colocgrpo
export COLOCGRPO_CACHE := $(CACHE)

# Venvs are keyed by the files that define their contents. The trainer venv's torch stack (several GB)
# is keyed only by its pin file, so editing pyproject.toml reinstalls the small project deps, not torch.
DEV_KEY := $(shell cat pyproject.toml dev/pyproject.toml | sha256sum | cut -c1-12)
TRAINER_KEY := $(shell cat training/requirements-cpu-test.txt | sha256sum | cut -c1-12)
DEV_VENV := $(CACHE)/venv-dev-$(DEV_KEY)
TRAINER_VENV := $(CACHE)/venv-trainer-$(TRAINER_KEY)
TRAINER_STAMP := $(TRAINER_VENV)/.project-deps-$(DEV_KEY)
# DeepSpeed at the trainer image's pin, for the multi-rank ZeRO-3 tests on CPU (tests/training/test_multirank.py).
DEEPSPEED_PIN := $(shell grep -E '^deepspeed==' images/trainer/requirements.txt)
NINJA_PIN := $(shell grep -E '^ninja==' images/trainer/requirements.txt)
SETUPTOOLS_PIN := $(shell grep -E '^setuptools==' images/trainer/constraints.txt)
TRAINER_DEEPSPEED := $(TRAINER_VENV)/.$(subst ==,-,$(DEEPSPEED_PIN))-cpu
export PIP_CACHE_DIR ?= $(CACHE)/pip
# A venv is ready once its .ready marker exists: the paths are keyed by content, so rules never look at
# file times (a fresh clone's files are all "new", which would rebuild every cached venv on each CI run).
DEV_READY := $(DEV_VENV)/.ready
# The oldest kopf pyproject.toml allows, in a venv of its own: the operator tests run on it too.
KOPF_FLOOR := $(shell sed -n 's/.*"kopf>=\([0-9.]*\),.*/\1/p' pyproject.toml)
FLOOR_VENV := $(CACHE)/venv-kopf-$(KOPF_FLOOR)-$(DEV_KEY)
FLOOR_READY := $(FLOOR_VENV)/.ready
FLOOR_PY := $(FLOOR_VENV)/bin/python
TRAINER_READY := $(TRAINER_VENV)/.ready
DEV_PY := $(DEV_VENV)/bin/python
TRAINER_PY := $(TRAINER_VENV)/bin/python

# The checkout always wins over whatever a cached venv holds, so one venv serves every clone.
export PYTHONPATH := $(CURDIR)/operator:$(CURDIR)/training:$(CURDIR)/dev
export PATH := $(DEV_VENV)/bin:$(PATH)

PYTEST_ARGS ?=

help:
	@echo "make demo   - local control plane + real node + operator (chart) + sample job in its image, watched to the end"
	@echo "make demo-learn - the same with SmolLM2-135M-Instruct learning to add (~15 min on 2 cores)"
	@echo "make test   - every test (operator, chart, cluster, trainer on CPU; GPU tests skip without a GPU)"
	@echo "make lint   - ruff (lint + format check), mypy and a duplicate-code check; make test runs it first"
	@echo "make images - the operator and trainer images, built with buildah (no Docker daemon) into $(CACHE)/images"

.PHONY: help demo demo-learn lint test test-operator test-node test-kopf-floor test-trainer dev-venv trainer-venv cluster-bin crd clean-cache \
	images image-tools

$(DEV_READY):
	rm -rf "$(DEV_VENV)"
	$(PYTHON) -m venv "$(DEV_VENV)"
	"$(DEV_PY)" -m pip install -q --upgrade pip
	"$(DEV_PY)" -m pip install -q -e '.[dev]' -e dev/
	touch "$(DEV_READY)"

dev-venv: $(DEV_READY)

$(FLOOR_READY):
	rm -rf "$(FLOOR_VENV)"
	$(PYTHON) -m venv "$(FLOOR_VENV)"
	"$(FLOOR_PY)" -m pip install -q --upgrade pip
	"$(FLOOR_PY)" -m pip install -q -e '.[dev]' -e dev/ "kopf==$(KOPF_FLOOR)"
	touch "$(FLOOR_READY)"

# torch from PyPI is the CUDA build (several GB): its venv is built once per pin set and cached.
$(TRAINER_READY):
	rm -rf "$(TRAINER_VENV)"
	$(PYTHON) -m venv "$(TRAINER_VENV)"
	"$(TRAINER_PY)" -m pip install -q --upgrade pip
	"$(TRAINER_PY)" -m pip install -q -r training/requirements-cpu-test.txt
	touch "$(TRAINER_READY)"

# The project's own (small) dependencies, refreshed whenever pyproject.toml changes.
$(TRAINER_STAMP): $(TRAINER_READY)
	"$(TRAINER_PY)" -m pip install -q -r training/requirements-cpu-test.txt -e '.[dev]'
	rm -f "$(TRAINER_VENV)"/.project-deps-*
	touch "$(TRAINER_STAMP)"

# PyPI has DeepSpeed only as a source distribution whose setup imports torch: built without build
# isolation against the venv's torch, with its CUDA ops off (DS_BUILD_OPS=0), as the trainer image
# does. Its one CPU op that gloo runs need, the shared-memory collectives every process loads in
# init_distributed, is compiled here once (DS_BUILD_SHM_COMM=1, ~1.5 CPU-minutes) instead of by
# DeepSpeed's JIT in the first test run; --no-cache-dir because pip's wheel cache ignores those
# variables. A stamp of its own, so adding DeepSpeed never reinstalls the torch stack.
$(TRAINER_DEEPSPEED): $(TRAINER_READY)
	"$(TRAINER_PY)" -m pip install -q "$(SETUPTOOLS_PIN)" "$(NINJA_PIN)"
	DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 "$(TRAINER_PY)" -m pip install -q --no-cache-dir --no-build-isolation \
		"$(DEEPSPEED_PIN)"
	rm -f "$(TRAINER_VENV)"/.deepspeed-*
	touch "$(TRAINER_DEEPSPEED)"

trainer-venv: $(TRAINER_STAMP) $(TRAINER_DEEPSPEED)

# The two images, from their own Dockerfiles, with buildah and no Docker daemon (images/build.py): each base made once
# from Debian's packages, layers and archives kept under $(CACHE), keyed by what they are built from. The tools come
# from Debian's archive (root; tests/images also runs the images in a containerd of its own).
IMAGE_TOOLS := buildah mmdebstrap containerd runc
image-tools:
	@missing=""; for tool in $(IMAGE_TOOLS); do command -v "$$tool" >/dev/null || missing="$$missing $$tool"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing with apt-get"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(IMAGE_TOOLS); \
	fi

images: image-tools
	$(PYTHON) -m images.build

cluster-bin: dev-venv
	bash dev/colocgrpo_dev/cluster/build/build.sh
	bash dev/colocgrpo_dev/cluster/build/build-node.sh
	bash dev/colocgrpo_dev/cluster/build/build-kueue.sh

crd: dev-venv
	"$(DEV_PY)" -m colocgrpo_operator.cli crd > charts/colocgrpo-operator/crds/colocgrpojobs.colocgrpo.io.yaml
	"$(DEV_PY)" -m colocgrpo_operator.cli crd --helm-template > charts/colocgrpo-crds/templates/colocgrpojobs.colocgrpo.io.yaml
	"$(DEV_PY)" -m colocgrpo_operator.cli crd --runtimes > charts/colocgrpo-operator/crds/runtimes.colocgrpo.io.yaml
	"$(DEV_PY)" -m colocgrpo_operator.cli crd --runtimes --helm-template > charts/colocgrpo-crds/templates/runtimes.colocgrpo.io.yaml

# mypy runs in the trainer venv: torch, transformers and TRL type the trainer code there. pylint's
# duplicate-code check runs in the dev venv, where astroid finds no torch to parse (minutes, not seconds).
lint: dev-venv trainer-venv
	"$(TRAINER_VENV)/bin/ruff" check .
	"$(TRAINER_VENV)/bin/ruff" format --check .
	"$(TRAINER_PY)" -m mypy
	"$(DEV_PY)" -m pylint --disable=all --enable=duplicate-code operator training dev bench tests

# Lint and the four suites run at once, each suite against a control plane of its own (named
# $(TEST_CLUSTER)-<suite>): most of an operator test is waiting on the API server while the trainer's tests keep both
# cores busy, so together they take about as long as the longest one. Each job's output is printed whole when it
# ends; every job runs to its end (--keep-going), and any failure fails make test.
TEST_CLUSTER ?= colocgrpo-test
TEST_JOBS ?= 5

test:
	@echo "make test: lint and the operator, node, kopf-floor and trainer suites run at once ($(TEST_JOBS) jobs); each prints when it ends"
	$(MAKE) --no-print-directory --output-sync=target --keep-going -j$(TEST_JOBS) lint test-operator test-node test-kopf-floor test-trainer

# Everything but the trainer's tests and the tests that run containers (marker `node`, tests/conftest.py).
test-operator: dev-venv cluster-bin
	COLOCGRPO_TEST_CLUSTER="$(TEST_CLUSTER)-operator" "$(DEV_PY)" -m pytest tests --ignore=tests/training -m "not node" $(PYTEST_ARGS)

# The tests that run containers: the images in a containerd of their own, the real node and the chart's operator
# on it. A session of its own, so that no container runtime, kubelet or in-cluster operator runs beside the
# operator suite's shared control plane.
test-node: dev-venv cluster-bin images
	COLOCGRPO_TEST_CLUSTER="$(TEST_CLUSTER)" "$(DEV_PY)" -m pytest tests --ignore=tests/training -m node $(PYTEST_ARGS)

# The operator tests again on the kopf floor (the pure status-derivation tests do not touch kopf).
test-kopf-floor: $(FLOOR_READY) cluster-bin
	test "$$("$(FLOOR_PY)" -c 'import importlib.metadata as m; print(m.version("kopf"))')" = "$(KOPF_FLOOR)"
	COLOCGRPO_TEST_CLUSTER="$(TEST_CLUSTER)-floor" "$(FLOOR_PY)" -m pytest tests/operator \
		--ignore=tests/operator/test_operator_status.py $(PYTEST_ARGS)

# The longest suite under make test: its 30 slowest tests are listed at its end, to see where its time goes.
test-trainer: trainer-venv cluster-bin
	COLOCGRPO_TEST_CLUSTER="$(TEST_CLUSTER)-trainer" "$(TRAINER_PY)" -m pytest tests/training --durations=30 $(PYTEST_ARGS)

# The demo runs the tiny CPU job in the trainer image on the real node, with the operator installed from its chart;
# it builds the images (python -m images.build) when their inputs changed. Where this machine cannot run containers
# it says why and trains on this host instead, from the trainer venv (`make trainer-venv`).
demo: dev-venv cluster-bin
	COLOCGRPO_TRAINER_PYTHON="$(TRAINER_PY)" "$(DEV_PY)" -m colocgrpo_dev demo

# The same path with SmolLM2-135M-Instruct (in the trainer image): the reward rises (~15 min on 2 cores).
demo-learn: dev-venv cluster-bin
	COLOCGRPO_TRAINER_PYTHON="$(TRAINER_PY)" "$(DEV_PY)" -m colocgrpo_dev demo --learn

clean-cache:
	rm -rf "$(CACHE)"
