# ortrain: every target creates and reuses .venv itself, so on a fresh machine
# `make test` and `make demo` are the only set-up commands you type.

PYTHON ?= $(shell for p in python3.11 python3.12 python3.10 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(not ((3,10) <= sys.version_info[:2] < (3,13)))' 2>/dev/null && { echo $$p; break; }; done)
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
STAMP  := $(VENV)/.ortrain-installed
TSTAMP := $(VENV)/.ortrain-test-installed
PYTEST := $(PY) -m pytest

.PHONY: help venv install install-test test test-all demo bench lint artifacts clean

help:
	@echo "make test      create .venv, install ortrain with test extras, run the tests and doctests (<10 min)"
	@echo "make test-all  also the slow tests (the memory-leak checks)"
	@echo "make demo      train on the bundled digits data, export model.onnx, verify it in onnxruntime"
	@echo "make bench     run bench/ and print the ratio table (writes bench/results.json)"
	@echo "make artifacts regenerate artifacts/ with the ortrain CLI"
	@echo "make lint      ruff"
	@echo "make clean     remove .venv and caches"

$(VENV)/bin/python:
	@test -n "$(PYTHON)" || { echo "error: ortrain needs Python 3.10-3.12 (onnxruntime-training 1.19.2 has no wheel for newer versions)" >&2; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel

venv: $(VENV)/bin/python

# The demo needs ortrain and its progress/plot extras; the tests add pytest, torch (for the
# PyTorch parity tests) and onnxscript (torch's ONNX exporter).
$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(PIP) install -e ".[progress,plot]"
	@touch $(STAMP)

$(TSTAMP): $(STAMP)
	$(PIP) install -e ".[test,progress,plot]"
	@touch $(TSTAMP)

install: $(STAMP)

install-test: $(TSTAMP)

test: install-test
	$(PYTEST) -q -m "not slow" ; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

test-all: install-test
	$(PYTEST) -q ; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

demo: install
	$(VENV)/bin/ortrain demo

bench: install-test
	$(PIP) install -e ".[bench]"
	$(PY) -m bench.run

artifacts: install-test
	$(PY) artifacts/generate.py

lint: install-test
	$(PIP) install ruff
	$(PY) -m ruff check ortrain tests bench examples

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
