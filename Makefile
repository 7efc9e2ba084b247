PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MODULE ?= lora
MODULES := $(patsubst modules/%/environment.yml,%,$(wildcard modules/*/environment.yml))

.PHONY: install test lint format demo demo-loop images up simulator wheels base-image docker-engine bench-launcher bench gpu-kit

install: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-host.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

# The test suite. The Docker tests need a running engine (`make docker-engine` starts one on a
# Debian machine without); FLOCK_SKIP_DOCKER_TESTS=1 opts out of them explicitly.
test: install wheels
	@if [ "$$FLOCK_SKIP_DOCKER_TESTS" != 1 ]; then bash scripts/local-base-image.sh; fi
	$(PY) -m pytest -q

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/hadolint docker/Dockerfile

format: install
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

# The lora validator end to end, offline, through its image built from the local stand-in base
# (VALIDATOR_BASE_IMAGE=... make demo builds from another base). Needs a Docker engine.
demo: install wheels base-image
	VALIDATOR_BASE_IMAGE=$${VALIDATOR_BASE_IMAGE:-local/base:bookworm} \
	VALIDATOR_ENV_INSTALLER=$${VALIDATOR_ENV_INSTALLER:-pip} \
	VALIDATOR_PIP_OPTIONS="$${VALIDATOR_PIP_OPTIONS:---no-index --find-links /opt/flock/wheels}" \
	$(PY) scripts/demo.py

# The validator loop alone (no Docker, no torch) against the Fed Ledger simulator, in seconds.
demo-loop: install
	$(PY) scripts/demo_loop.py

# The image of every module in modules/ (the production base unless VALIDATOR_BASE_IMAGE says
# otherwise).
images: install
	@if [ -z "$(MODULES)" ]; then echo "no modules with an environment.yml in modules/"; fi
	@for module in $(MODULES); do $(PY) run.py $$module --build-only || exit 1; done

# Run one module's validator in the background with Docker Compose: make up MODULE=lora
up:
	docker compose up -d validator-$(MODULE)

# A Fed Ledger simulator on 127.0.0.1:8765 serving DATA (a JSON file of tasks and submissions).
simulator: install
	$(PY) -m validator.simulator --data $(DATA) --port 8765

# Wheels of the orchestrator's and the lora module's requirements, for image builds that cannot
# reach PyPI (CI); torch comes as the CPU build where pip finds one locally.
wheels: install
	$(PY) -m pip download --quiet --only-binary=:all: -d docker/wheels \
		-r requirements.txt -r requirements-lora.txt

base-image:
	bash scripts/local-base-image.sh

# A Docker engine, Compose v2 and the local stand-in base image, on a Debian machine that has
# none running (CI, a development sandbox). Needs root.
docker-engine: install wheels
	bash scripts/docker-engine.sh
	bash scripts/local-base-image.sh

# Time from `python run.py` to the validator's first API call, image already built.
bench-launcher: install wheels base-image
	$(PY) bench/launcher_startup.py

# The lora module's scoring against the reference's way (load, merge, Trainer.evaluate), CPU.
bench: install
	$(PY) bench/lora_bench.py

# Pinned wheels for running `make bench`'s GPU mode on a machine without network
# (bench/gpu_session.sh there; see bench/README.md).
gpu-kit: install
	$(PY) bench/gpu_kit.py

# `make test demo` in a fresh clone of HEAD (committed work only) in a new temporary directory,
# with nothing beside it, using this checkout's .venv and wheels: proves the repository is
# self-contained. Needs what `make test` and `make demo` need (a Docker engine).
.PHONY: test-clone
test-clone: install wheels
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	git clone --quiet "$(CURDIR)" "$$tmp/repo"; \
	cp -a docker/wheels/. "$$tmp/repo/docker/wheels/"; \
	test ! -e "$$tmp/shared"; \
	echo "clone of HEAD in $$tmp/repo"; \
	$(MAKE) -C "$$tmp/repo" VENV="$(abspath $(VENV))" -o "$(abspath $(VENV))/.installed" test demo
