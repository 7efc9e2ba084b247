PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install test lint format simulator demo

install: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

test: install
	$(PY) -m pytest -q

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: install
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

# A Fed Ledger simulator on 127.0.0.1:8765 serving DATA (a JSON file of tasks and submissions).
simulator: install
	$(PY) -m validator.simulator --data $(DATA) --port 8765

# Offline end-to-end run of the validator loop against the Fed Ledger simulator.
demo: install
	$(PY) scripts/demo.py
