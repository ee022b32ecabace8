# The two commands a newcomer needs:  make demo   and   make test
# Both create ./.venv (from the system Python, so the unprivileged user that runs
# PostgreSQL can execute it) and install everything from PyPI into it.
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# The lock: every package at the exact version the tests passed with, with sha256 hashes
# (CONTRIBUTING.md, "Dependencies and the lock"). test.txt for .venv (tests, demo, CI),
# runtime.txt for the image. `make lock` re-resolves both from pyproject.toml's ranges.
LOCK_TEST    := requirements/test.txt
LOCK_RUNTIME := requirements/runtime.txt
UV_COMPILE    = $(BIN)/uv pip compile pyproject.toml --universal --python-version 3.11 \
                --generate-hashes --quiet --custom-compile-command "make lock"

# The image (Dockerfile). Override IMAGE to build for your registry:
#   make image IMAGE=registry.example.com/team/pg-failover-hook:0.1.0 && docker push ...
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE   ?= ghcr.io/adg-io/pg-failover-hook:$(VERSION)
DOCKER  ?= docker

.PHONY: venv demo serve test lint bench clean lock image promtool mutation controlplane

$(STAMP): pyproject.toml $(LOCK_TEST)
	@$(PYTHON) -m venv --help >/dev/null 2>&1 || { echo "Python's venv module is missing: apt-get install -y python3-venv"; exit 1; }
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --require-hashes --no-deps -r $(LOCK_TEST)
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP) controlplane
	$(BIN)/python -m demo

serve: $(STAMP)
	$(BIN)/gunicorn -c python:hooks.gunicorn_conf 'hooks.app:create_app()'

CODE := $(wildcard hooks tests standin devcluster controlplane bench demo ops)

lint: $(STAMP)
	$(BIN)/ruff check $(CODE)
	$(BIN)/ruff format --check $(CODE)
	$(BIN)/mypy
	$(BIN)/lint-imports

test: $(STAMP) lint promtool controlplane
	$(BIN)/python -m pytest

# The real Kubernetes control plane of the tests (controlplane/): kube-apiserver,
# kube-controller-manager, kube-proxy, kubectl and etcd built from the Go modules pinned in
# controlplane/go/, once per machine, into ~/.cache/pg-failover-hook/controlplane/<key>/.
controlplane: $(STAMP)
	$(BIN)/python -m controlplane build

# The alert tests need promtool and prometheus (Debian's prometheus package; .ci/run installs it).
# promtool (alert unit tests) and prometheus (the real-Prometheus failover test) come from
# Debian's `prometheus` package: installed here when missing and we are root with apt-get.
promtool:
	@{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's prometheus package (promtool, prometheus)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus; \
	  else \
	    echo "promtool/prometheus missing: apt-get install -y prometheus (Debian), as .ci/run does"; \
	    exit 1; \
	  fi; }

# Re-resolve the lock from pyproject.toml (newest versions within its ranges), then
# reinstall .venv from it. Run the tests before committing the new lock.
lock: $(STAMP)
	$(UV_COMPILE) --extra test -o $(LOCK_TEST)
	$(UV_COMPILE) -o $(LOCK_RUNTIME)
	$(MAKE) venv

image:
	$(DOCKER) build -t $(IMAGE) .

bench: $(STAMP)
	$(BIN)/python -m bench.failover

# Mutation testing of the pure core (mutmut 3; not in CI, not in `make test`): CONTRIBUTING.md,
# "Mutation testing". The modules are pyproject.toml's [tool.mutmut] only_mutate; each is run
# on its own with at most MUTATION_CHILDREN tests at once, then the per-module scores are
# printed and any module under 95 % fails the target. mutants/ (mutmut's copy of the tree)
# is started afresh so that nothing of an earlier tree survives in it.
MUTATION_CHILDREN ?= 2

mutation: $(STAMP)
	rm -rf mutants
	$(BIN)/python -m bench.mutation_score --run --max-children $(MUTATION_CHILDREN) --fail-under 95

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache mutants
