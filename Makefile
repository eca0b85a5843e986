# LLM control panel. `make` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: help venv run test lint format migrate check-deploy bench sim docs clean

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("Python 3.11+ is needed, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	@touch $@

venv: $(STAMP) ## Create .venv and install the panel with its dev tools

run: $(STAMP) ## Run the panel (embedded: SQLite, in-process worker, demo fleet) on http://127.0.0.1:8000
	$(PY) manage.py serve --demo --host $(HOST) --port $(PORT)

test: $(STAMP) ## Run the whole suite once, in parallel, on PostgreSQL + Redis (timing tests in a lane of their own)
	$(PY) scripts/run_tests.py

lint: $(STAMP) ## ruff check + format check + import layers (import-linter)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

format: $(STAMP) ## Format the code with ruff
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

migrate: $(STAMP) ## Apply migrations to the configured database
	$(PY) manage.py migrate

docs: $(STAMP) ## Build the manual (docs/, MkDocs) into var/site; a broken link or anchor fails
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

check-deploy: $(STAMP) ## Django's deployment checks with production-like settings
	$(PY) scripts/check_deploy.py

bench: $(STAMP) ## Benchmarks that print numbers (simulator; load generator's timing error; history page)
	$(PY) scripts/bench_simulator.py
	$(PY) scripts/bench_loadgen.py
	$(PY) scripts/bench_history.py

sim: $(STAMP) ## Run one simulated vLLM engine (Llama-3.1-8B on an H100) on http://127.0.0.1:8001
	$(PY) -m hosts.simulator vllm meta-llama/Llama-3.1-8B-Instruct --max-model-len 8192 --host 127.0.0.1 --port 8001

clean: ## Remove the virtualenv and local data (var/)
	rm -rf $(VENV) var staticfiles .pytest_cache .ruff_cache
