# Every target that needs the environment depends on $(STAMP): the first use creates
# .venv and installs the project into it, so a fresh machine needs nothing else typed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)

# Pass extra arguments to `gameday run`, e.g. make chaos-router RUN_ARGS="--target my.yaml"
RUN_ARGS ?=
PYTEST_ARGS ?=

.PHONY: help venv test test-fast lint fmt clean chaos-router chaos-broker chaos-rollback gameday bench

help:
	@echo "make test            run the test suite (sets up .venv on first use)"
	@echo "make chaos-router    run the router experiments against the local stack"
	@echo "make chaos-broker    run the broker experiments"
	@echo "make chaos-rollback  run the rollback-executor experiments"
	@echo "make gameday         all nine experiments plus the control run"
	@echo "make lint            ruff and mypy"
	@echo "make clean           remove the venv, caches and reports"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@rm -f $(VENV)/.installed-*
	@touch $@

venv: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

chaos-router: $(STAMP)
	$(BIN)/gameday run experiments/router/*.yaml $(RUN_ARGS)

chaos-broker: $(STAMP)
	$(BIN)/gameday run experiments/broker/*.yaml $(RUN_ARGS)

chaos-rollback: $(STAMP)
	$(BIN)/gameday run experiments/rollback/*.yaml $(RUN_ARGS)

gameday: $(STAMP)
	$(BIN)/gameday run experiments/control.yaml experiments/router/*.yaml \
		experiments/broker/*.yaml experiments/rollback/*.yaml $(RUN_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	find reports -mindepth 1 ! -name README.md -prune -exec rm -rf {} +
