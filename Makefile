# FlowForge developer entry points. Everything installs into .venv of this checkout;
# the local control plane is built into ~/.cache/flowforge (see deploy/local/).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: dev dev-down test test-unit lint controlplane crds clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

controlplane:
	bash deploy/local/build.sh

test: $(STAMP) controlplane
	$(PY) -m ruff check operator tests bench
	$(PY) -m mypy
	$(PY) -m pytest tests

test-unit: $(STAMP)
	$(PY) -m pytest tests/unit

lint: $(STAMP)
	$(PY) -m ruff check operator tests bench
	$(PY) -m mypy

dev: $(STAMP) controlplane
	bash deploy/local/dev.sh

dev-down:
	bash deploy/local/dev-down.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
