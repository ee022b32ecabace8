# The two commands a newcomer needs:  make demo   and   make test   (make help lists them all:
# every target's `## ` comment on its own line is its help line; tests/test_makefile.py checks
# that every .PHONY target has one).
# Both create ./.venv (from the system Python, so the unprivileged user that runs
# PostgreSQL can execute it) and install everything from PyPI into it.
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# The lock: every package at the exact version the tests passed with, with sha256 hashes
# (CONTRIBUTING.md, "Dependencies and the lock"). test.txt for .venv (tests, demo, CI),
# runtime.txt for the image, build.txt (from build.in) for the image's build backend. `make lock` re-resolves both from pyproject.toml's ranges.
LOCK_TEST    := requirements/test.txt
LOCK_RUNTIME := requirements/runtime.txt
LOCK_BUILD   := requirements/build.txt
UV_COMPILE    = $(BIN)/uv pip compile pyproject.toml --universal --python-version 3.11 \
                --generate-hashes --quiet --custom-compile-command "make lock"

# The image (Dockerfile). Override IMAGE to build for your registry:
#   make image IMAGE=registry.example.com/team/pg-failover-hook:0.1.0 && docker push ...
# With docker when a Docker daemon answers, else with buildah (or podman), which need no
# daemon (BUILDER=docker|buildah|podman chooses). BASE overrides the Dockerfile's pinned base
# (the tests build on a local stand-in: testbed/metacontroller/image_build.py). The host's CA bundle goes in
# as the build secret "pipcert" (for a path to PyPI whose CA only the host trusts; never in a
# layer), and pip's index mirror, if this machine's pip uses one, as PIP_INDEX_URL.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE   ?= ghcr.io/adg-io/pg-failover-hook:$(VERSION)
DOCKER  ?= docker
BUILDAH ?= buildah
PODMAN  ?= podman
BASE    ?=
BUILDER ?= $(shell if $(DOCKER) info >/dev/null 2>&1; then echo docker; \
             elif command -v $(BUILDAH) >/dev/null 2>&1; then echo buildah; \
             elif command -v $(PODMAN) >/dev/null 2>&1; then echo podman; else echo none; fi)
BUILD_CA ?= $(or $(PIP_CERT),$(wildcard /etc/ssl/certs/ca-certificates.crt))
PIP_INDEX_URL ?= $(shell $(PYTHON) -m pip config get global.index-url 2>/dev/null)
BUILD_FLAGS = $(if $(BASE),--build-arg BASE=$(BASE)) \
              $(if $(PIP_INDEX_URL),--build-arg PIP_INDEX_URL=$(PIP_INDEX_URL)) \
              $(if $(BUILD_CA),--secret id=pipcert$(,)src=$(BUILD_CA))
, := ,

.PHONY: help venv demo serve test lint bench clean lock image image-tools promtool mutation readme-figures controlplane helm chart

help: ## list the targets and what each does
	@awk -F ':[^#]*## ' '/^[a-z][a-z-]*:[^#]*## / {printf "  make %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml $(LOCK_TEST)
	@$(PYTHON) -m venv --help >/dev/null 2>&1 || { echo "Python's venv module is missing: apt-get install -y python3-venv"; exit 1; }
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --require-hashes --no-deps -r $(LOCK_TEST)
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

venv: $(STAMP) ## create .venv from the lock (requirements/test.txt)

demo: $(STAMP) controlplane ## a real Patroni cluster as Pods on the real control plane: kill, switchover, watch the EndpointSlice follow
	$(BIN)/python -m testbed.demo

# `make serve`: the hook as in production (caller authentication on), with a local token that
# is generated once into .venv (git-ignored, mode 0600) and printed with a ready curl line.
SERVE_TOKEN ?= $(VENV)/serve-token
SERVE_BIND  ?= 127.0.0.1:8080
SERVE_OPS_BIND ?= 127.0.0.1:9090
SERVE_REQUEST := tests/fixtures/metacontroller/customize-request.json

$(SERVE_TOKEN): | $(STAMP)
	umask 077 && $(BIN)/python -c 'import secrets; print(secrets.token_urlsafe(32))' > $@

serve: $(STAMP) $(SERVE_TOKEN) ## run the hook under gunicorn on 127.0.0.1:8080 (SERVE_BIND; health and metrics on 127.0.0.1:9090, SERVE_OPS_BIND) with a local token, printed with a curl line
	@echo "caller token (PGFH_AUTH_TOKENS_PATH=$(SERVE_TOKEN)): $$(cat $(SERVE_TOKEN))"
	@echo "try:  curl -sS -H \"Authorization: Bearer $$(cat $(SERVE_TOKEN))\" -H 'Content-Type: application/json' --data @$(SERVE_REQUEST) http://$(SERVE_BIND)/customize"
	PGFH_AUTH_TOKENS_PATH=$(SERVE_TOKEN) GUNICORN_BIND=$(SERVE_BIND) GUNICORN_OPS_BIND=$(SERVE_OPS_BIND) \
	  $(BIN)/gunicorn -c python:hooks.shell.gunicorn_conf 'hooks.shell.app:create_app()'

CODE := $(wildcard hooks tests testbed ops)

lint: $(STAMP) ## ruff, ruff format --check, mypy --strict, the import contracts (the hook's layers; the test bed apart)
	$(BIN)/ruff check $(CODE)
	$(BIN)/ruff format --check $(CODE)
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/lint-imports testbed/import-contracts.toml

# The junit file is what `make readme-figures` writes the README's test figures from; the 25
# slowest tests are printed at the end, where CI time goes.
JUNIT := .run/junit.xml

# Two pytest-xdist workers: each module runs whole on one, the real-Patroni ones all on the same
# one (tests/worker_groups.py says why); the other runs the control-plane faults and the rest.
TEST_WORKERS ?= 2

test: $(STAMP) lint promtool image-tools controlplane helm ## lint, then the whole test suite on TEST_WORKERS (2) workers (writes .run/junit.xml)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --junitxml=$(JUNIT) --durations=25

readme-figures: $(STAMP) ## rewrite the README's test figures from the last `make test` (.run/junit.xml)
	$(BIN)/python -m tests.suite_figures $(JUNIT) README.md

# The real Kubernetes control plane of the tests (testbed/kubernetes/): kube-apiserver,
# kube-controller-manager, kube-proxy, kubectl and etcd built from the Go modules pinned in
# testbed/kubernetes/go/, once per machine, into ~/.cache/pg-failover-hook/controlplane/<key>/.
controlplane: $(STAMP) ## build the test control plane's binaries once per machine (cached)
	$(BIN)/python -m testbed.kubernetes build

# helm (the chart's tests: tests/test_chart*.py) built the same way from the Go module pinned in
# testbed/kubernetes/go/helm/, once per machine, into ~/.cache/pg-failover-hook/helm/<key>/.
helm: $(STAMP) ## build the pinned helm once per machine (cached), for the chart's tests
	$(BIN)/python -m testbed.kubernetes helm

# charts/pg-failover-hook/ is generated from deploy/ (ops/chart/): run after changing deploy/.
chart: $(STAMP) ## rewrite the Helm chart charts/pg-failover-hook/ from deploy/
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m ops.chart

# The alert tests need promtool and prometheus (Debian's prometheus package; .ci/run installs it).
# promtool (alert unit tests) and prometheus (the real-Prometheus failover test) come from
# Debian's `prometheus` package: installed here when missing and we are root with apt-get.
promtool: ## install promtool and prometheus (Debian's package) when missing and root
	@{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's prometheus package (promtool, prometheus)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus; \
	  else \
	    echo "promtool/prometheus missing: apt-get install -y prometheus (Debian), as .ci/run does"; \
	    exit 1; \
	  fi; }

# The image tests (tests/test_image.py) build the Dockerfile without a Docker daemon on a
# stand-in base made by debootstrap, with buildah: installed here when missing and we are root
# with apt-get (as .ci/run does).
IMAGE_TOOLS := debootstrap buildah

image-tools: ## install debootstrap and buildah (the image tests) when missing and root
	@missing=""; for tool in $(IMAGE_TOOLS); do command -v $$tool >/dev/null 2>&1 || missing="$$missing $$tool"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's$$missing (the image tests)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else \
	    echo "$$missing missing: apt-get install -y$$missing (Debian, as root), as .ci/run does"; \
	    exit 1; \
	  fi; \
	fi

# Re-resolve the lock from pyproject.toml (newest versions within its ranges), then
# reinstall .venv from it. Run the tests before committing the new lock.
lock: $(STAMP) ## re-resolve the lock from pyproject.toml's ranges, reinstall .venv
	$(UV_COMPILE) --extra test -o $(LOCK_TEST)
	$(UV_COMPILE) -o $(LOCK_RUNTIME)
	$(BIN)/uv pip compile requirements/build.in --universal --python-version 3.11 \
	  --generate-hashes --quiet --custom-compile-command "make lock" -o $(LOCK_BUILD)
	$(MAKE) venv

image: ## build the image as $(IMAGE): docker when a daemon answers, else buildah or podman
ifeq ($(BUILDER),docker)
	$(DOCKER) build $(strip $(BUILD_FLAGS) -t $(IMAGE)) .
else ifeq ($(BUILDER),buildah)
	$(BUILDAH) bud --isolation chroot --layers $(strip $(BUILD_FLAGS) -t $(IMAGE)) .
else ifeq ($(BUILDER),podman)
	$(PODMAN) build --isolation chroot --layers $(strip $(BUILD_FLAGS) -t $(IMAGE)) .
else
	@echo "make image: no Docker daemon answers ($(DOCKER) info) and neither buildah nor podman is installed: start Docker, or apt-get install -y buildah"; exit 1
endif

bench: $(STAMP) ## measure failovers against the real cluster (python -m testbed.bench.failover_patroni)
	$(BIN)/python -m testbed.bench.failover_patroni

# Mutation testing of the pure core (mutmut 3; not in CI, not in `make test`): CONTRIBUTING.md,
# "Mutation testing". The modules are pyproject.toml's [tool.mutmut] only_mutate; each is run
# on its own with at most MUTATION_CHILDREN tests at once, then the per-module scores are
# printed and any module under 95 % fails the target. mutants/ (mutmut's copy of the tree)
# is started afresh so that nothing of an earlier tree survives in it.
MUTATION_CHILDREN ?= 2

mutation: $(STAMP) ## mutation-test the pure core (mutmut; about 19 minutes)
	rm -rf mutants
	$(BIN)/python -m testbed.bench.mutation_score --run --max-children $(MUTATION_CHILDREN) --fail-under 95

clean: ## remove .venv and the tools' caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache mutants
