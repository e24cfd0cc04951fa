# FlowForge developer entry points. Everything installs into .venv of this checkout;
# the local control plane is built into ~/.cache/flowforge (see deploy/local/).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: dev dev-down test test-unit lint controlplane kueue crds clean ui chromium screenshots image image-tools

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# Mermaid's own parser (under jsdom) checks the graphs `flowforge graph` renders.
NODE_STAMP := tests/tools/node_modules/.installed
$(NODE_STAMP): tests/tools/package.json tests/tools/package-lock.json
	npm ci --prefix tests/tools --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

controlplane:
	bash deploy/local/build.sh

# The web UI (ui/, Vite + Preact + dagre) builds from its lockfile into the Python package;
# the build is committed, and tests/ui/test_build.py proves it matches the sources.
UI_STAMP := ui/node_modules/.installed
$(UI_STAMP): ui/package.json ui/package-lock.json
	npm ci --prefix ui --no-audit --no-fund --loglevel=error
	touch $(UI_STAMP)

ui: $(UI_STAMP)
	npm run --prefix ui build

# The browser tests again, also writing the run-page screenshots the README shows.
screenshots: $(STAMP) $(UI_STAMP) chromium controlplane
	FLOWFORGE_UPDATE_SCREENSHOTS=1 $(PY) -m pytest tests/ui/test_ui.py -q

# The browser tests drive Debian's Chromium (Playwright cannot download its own here).
chromium:
	@dpkg -s chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium)

# Kueue's controller manager, CRDs and webhooks, for the tests of task types that queue
kueue:
	bash deploy/local/build-kueue.sh

# The container image, built with buildah on this machine (no Docker engine; see
# deploy/image/): buildah and mmdebstrap are installed from Debian's packages when missing,
# the base and the layers are cached in ~/.cache/flowforge/image.
image-tools:
	bash deploy/image/install-tools.sh

image:
	bash deploy/image/build.sh

# Prometheus' promtool (tests/unit/test_alerts.py: `promtool test rules`) and Jaeger's
# all-in-one (tests/cluster/test_tracing.py), built from the Go module proxy into
# ~/.cache/flowforge/<tool>/ (cached: nothing rebuilds when present).
.PHONY: promtool jaeger
promtool:
	bash deploy/tools/build-promtool.sh

jaeger:
	bash deploy/tools/build-jaeger.sh

# The image is built before pytest (tests/e2e/test_image.py runs it; warm, nothing rebuilds).
test: $(STAMP) $(NODE_STAMP) $(UI_STAMP) chromium controlplane kueue image promtool jaeger
	$(PY) -m ruff check operator tests bench
	$(PY) -m ruff format --check operator tests bench
	$(PY) -m mypy
	$(VENV)/bin/lint-imports --no-logo
	@# the tests without a cluster (pure, PostgreSQL, the engine harness) two at a time, each
	@# worker its own PostgreSQL server; then the ones on the real control plane, a module at
	@# a time on each of two workers, each with its own control plane and PostgreSQL: they
	@# mostly wait for Jobs and clocks (quiet, 2 cores: 14.6 min, one by one 25.2 min).
	@# Tracebacks are Python's own: pytest's source excerpts parse with `ast`, which on 3.11
	@# can raise SystemError while another thread compiles (cpython#106905) and turn one
	@# failure into an INTERNALERROR that hides it
	$(PY) -m pytest tests/unit tests/store tests/engine -n 2 --dist loadfile --durations=15 --tb=native
	$(PY) -m pytest tests --ignore=tests/unit --ignore=tests/store --ignore=tests/engine -n 2 --dist loadfile --durations=30 --tb=native

test-unit: $(STAMP) $(NODE_STAMP)
	$(PY) -m pytest tests/unit

# Layers (import-linter contracts in pyproject.toml): domain <- store | kube | sdk <- operator | cli.
lint: $(STAMP)
	$(PY) -m ruff check operator tests bench
	$(PY) -m ruff format --check operator tests bench
	$(PY) -m mypy
	$(VENV)/bin/lint-imports --no-logo

# Task types' Pod-spec schema from Kubernetes' OpenAPI (go fetches the module k8s.io/kubernetes
# at the pinned version), then the CRDs, their reference and the chart's copy.
crds: $(STAMP)
	$(PY) -m flowforge.kube.podspec_gen
	$(PY) -m flowforge.kube.crdgen
	$(PY) -m flowforge.kube.crddocs
	cp crds/*.yaml charts/flowforge/crds/

dev: $(STAMP) controlplane
	bash deploy/local/dev.sh

dev-down:
	bash deploy/local/dev-down.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# For machines with Docker: build the image, start kind, helm install, run an example.
.PHONY: e2e-kind
e2e-kind:
	bash deploy/kind/e2e.sh
