PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MODULE ?= lora
# Every module: a folder modules/<name>/ with __init__.py and module.yaml, the rule of
# validator/spec.py (find_module_folders; a test holds the two equal). Images, Compose services
# and requirements-<name>.txt derive from the specs, never from a list kept here.
MODULES := $(sort $(patsubst modules/%/__init__.py,%,$(filter \
	$(patsubst %/module.yaml,%/__init__.py,$(wildcard modules/*/module.yaml)), \
	$(wildcard modules/*/__init__.py))))
# Modules whose spec says `test_venv: own` (a stack that conflicts with the dev venv's): each
# gets its own venv .venv-<name>, where tests/<name>/ runs. The others' requirements-<name>.txt
# go into the dev venv. Read with grep: no Python is needed before the venvs exist.
STACKS := $(filter $(MODULES),$(patsubst modules/%/module.yaml,%,$(shell \
	grep -lE '^test_venv:[[:space:]]*own[[:space:]]*(\#.*)?$$' modules/*/module.yaml)))
SHARED := $(filter-out $(STACKS),$(MODULES))
STACK_VENVS := $(foreach m,$(STACKS),.venv-$(m)/.installed)
# The docs site's own venv (requirements-docs.txt: mkdocs and mkdocs-material, ~170 MB): `make
# docs` needs nothing else, and `make lint` builds and lints the pages from it.
DOCS_VENV := .venv-docs

.PHONY: install test lint format docs docs-figures demo demo-serve demo-loop images compose new-module up simulator wheels base-image docker-engine bench-launcher bench-soak bench bench-model-work bench-llm-judge bench-llm-judge-warm bench-llm-judge-plan gpu-kit browser prometheus registry report

# The venvs are built side by side (a make of their own with -j): pip waits on the disk and the
# index as much as on a core (on 2 cores: 181 s one after the other, 93 s side by side).
VENV_JOBS ?= 3
VENVS_MAKE = $(MAKE) --no-print-directory -q $(1) || $(MAKE) --no-print-directory -j$(VENV_JOBS) $(1)
install:
	@$(call VENVS_MAKE,$(VENV)/.installed $(STACK_VENVS))

# The requirements, then the repository itself in editable mode (pyproject.toml), so that
# validator, launcher, devkit and bench import by name from tests, scripts and benches.
$(VENV)/.installed: requirements.txt requirements-host.txt requirements-dev.txt requirements-docs.txt \
		requirements-typecheck.txt $(foreach m,$(SHARED),requirements-$(m).txt) pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt $(foreach m,$(SHARED),-r requirements-$(m).txt)
	$(PY) -m pip install --quiet --no-deps --editable .
	touch $@

# A module's own venv: the validator's runtime, its stack, the launcher's, the test tools and the
# type checker, and this repository.
.venv-%/.installed: requirements-%.txt requirements.txt requirements-host.txt \
		requirements-typecheck.txt pyproject.toml
	$(PYTHON) -m venv .venv-$*
	.venv-$*/bin/python -m pip install --quiet --upgrade pip
	.venv-$*/bin/python -m pip install --quiet -r requirements.txt -r requirements-$*.txt \
		-r requirements-host.txt -r requirements-typecheck.txt "pytest>=8,<10" "pytest-xdist>=3.6,<4"
	.venv-$*/bin/python -m pip install --quiet --no-deps --editable .
	touch $@

# Named in full, so that the module venvs' pattern rule above does not take it.
$(DOCS_VENV)/.installed: requirements-docs.txt
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install --quiet -r requirements-docs.txt
	touch $@

# The test suite. What it needs beyond the venvs (a Docker engine with Compose v2, the stand-in
# base image, headless Chromium, Prometheus) is brought up first, as root on Debian, the way
# `make docker-engine`, `make browser` and `make prometheus` do; elsewhere a missing one stops
# with one line naming the command to run (scripts/needs.sh). FLOCK_SKIP_DOCKER_TESTS=1 and
# FLOCK_SKIP_BROWSER_TESTS=1 opt out of those tests explicitly.
# The core suite, its Docker tests and each stack's run side by side, each printing its 25
# slowest tests (scripts/test_suites.sh; TEST_SERIAL=1 runs them one after the other).
test: install wheels
	@bash scripts/needs.sh test-docker test-browser test-prometheus test-registry
	bash scripts/test_suites.sh $(PY) $(STACKS)

# The inner loop: the unit tests only (no child process, server, model, engine or browser;
# tests/helpers/layers.py sets each test's layer), in seconds. pytest -m integration, docker,
# browser or faults runs another layer.
.PHONY: test-fast
test-fast: install
	$(PY) -m pytest -q -m unit $(foreach m,$(STACKS),--ignore=tests/$(m))
	@# Exit 5: a stack with no unit test.
	@for m in $(STACKS); do echo "== tests/$$m in .venv-$$m"; \
		.venv-$$m/bin/python -m pytest -q -m unit tests/$$m || [ $$? = 5 ] || exit 1; done

# The type checker (pyproject.toml's [tool.mypy]): validator/, run.py, launcher/ and the modules
# of the dev venv from .venv; each module with a venv of its own from that venv, against its own
# stack (llm_judge: transformers 5). The runs go side by side (each reads torch's types: half a
# minute of a core, cold); each keeps its cache in .mypy_cache/<its venv>, so that a second
# `make typecheck` reads only what changed.
STACK_TYPECHECKS := $(foreach m,$(STACKS),typecheck-$(m))
.PHONY: typecheck typecheck-dev $(STACK_TYPECHECKS)
typecheck: install
	@$(MAKE) --no-print-directory -j2 --output-sync=target typecheck-dev $(STACK_TYPECHECKS)
typecheck-dev:
	$(PY) -m mypy --cache-dir .mypy_cache/dev validator run.py launcher \
		$(foreach m,$(SHARED),modules/$(m))
$(STACK_TYPECHECKS): typecheck-%:
	.venv-$*/bin/python -m mypy --cache-dir .mypy_cache/$* modules/$*

# The types are checked by mypy (`typecheck`). The release workflow is checked by actionlint and
# zizmor (pinned actions, permissions, injection). The docs pages are linted for what
# Python-Markdown renders wrong without a word (scripts/docs_lint.py: a list with no blank line
# before it, an escaped pipe in code, a long page without subheadings), then the site is built
# with --strict: a broken link or anchor in docs/ fails lint (and CI); not with --quiet, which
# hides the warnings that --strict counts (mkdocs 1.6).
lint:
	@$(call VENVS_MAKE,$(VENV)/.installed $(STACK_VENVS) $(DOCS_VENV)/.installed)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	@$(MAKE) --no-print-directory typecheck
	$(VENV)/bin/hadolint docker/Dockerfile
	$(VENV)/bin/actionlint .github/workflows/*.yml
	@# --offline: the audits that ask GitHub's API need a token and the network.
	$(VENV)/bin/zizmor --offline --persona=pedantic .github/workflows/
	$(DOCS_VENV)/bin/python -m scripts.docs_lint
	@site=$$(mktemp -d); NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/python -m mkdocs build --strict \
		--site-dir "$$site"; status=$$?; rm -rf "$$site"; exit $$status

# The documentation site (mkdocs.yml, pages in docs/) on http://127.0.0.1:8000, rebuilt on edits;
# from .venv-docs alone (seconds to install), not the dev venvs.
docs: $(DOCS_VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/python -m mkdocs serve -a 127.0.0.1:8000

# docs/images/: the status page and the report page of a real run (the rl module's validator
# against the Fed Ledger simulator and a local hub, one submission failed), screenshotted in
# headless Chromium (scripts/docs_figures.py).
docs-figures: install browser
	$(PY) -m scripts.docs_figures

format: install
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

# The lora, rl and llm_judge validators end to end, offline, through their images built from
# the local stand-in base (VALIDATOR_BASE_IMAGE=... builds from another base; DEMO=rl runs one;
# a module with its own venv runs its demo there). Needs a Docker engine: brought up as for
# `make test` (scripts/needs.sh).
DEMO ?= lora rl llm_judge
demo: install wheels
	@bash scripts/needs.sh demo-docker
	@for module in $(DEMO); do \
		echo "== demo: $$module"; \
		export VALIDATOR_BASE_IMAGE=$${VALIDATOR_BASE_IMAGE:-local/base:bookworm} \
		VALIDATOR_ENV_INSTALLER=$${VALIDATOR_ENV_INSTALLER:-pip} \
		VALIDATOR_PIP_OPTIONS="$${VALIDATOR_PIP_OPTIONS:---no-index --find-links /opt/flock/wheels}" \
		VALIDATOR_LOCK=$${VALIDATOR_LOCK:-cpu}; \
		python=$(PY); [ -x .venv-$$module/bin/python ] && python=.venv-$$module/bin/python; \
		$$python -m scripts.demo$$([ "$$module" = lora ] || echo _$$module) || exit 1; \
	done

# One module's demo (the first of DEMO: lora unless DEMO=rl or DEMO=llm_judge) whose validator
# keeps running once its assignments are done: its status page and report on 127.0.0.1 until
# Ctrl-C, its state volume kept (scripts/demo_look.py).
demo-serve: export DEMO_SERVE = 1
demo-serve: DEMO := $(firstword $(DEMO))
demo-serve: demo

# The validator loop alone (no Docker, no torch) against the Fed Ledger simulator, in seconds.
demo-loop: install
	$(PY) -m scripts.demo_loop

# The image of every module in modules/ (the production base unless VALIDATOR_BASE_IMAGE says
# otherwise).
images: install
	@if [ -z "$(MODULES)" ]; then echo "no modules with a module.yaml in modules/"; fi
	@for module in $(MODULES); do $(PY) run.py $$module --build-only || exit 1; done

# requirements-<name>.txt of every module, from the pip section of its environment.yml (a test
# fails when one is stale); a file whose pins did not change is not rewritten.
.PHONY: requirements
requirements: install
	$(PY) -m devkit.requirements

# The module lists above (a test holds them equal to validator.spec's).
.PHONY: list-modules
list-modules:
	@echo "modules: $(MODULES)"
	@echo "own venv: $(STACKS)"

# compose.yaml, compose.cpu.yaml, compose.gpus.yaml (one service per GPU, from
# deploy/hosts/example.yaml) and deploy/kubernetes/ from the module specs (a test fails when
# they are stale).
compose: install
	$(PY) run.py compose
	$(PY) run.py kubernetes

# A new module that works with no edit: make new-module NAME=my_task (docs/adding-a-module.md);
# ARGS="--pip roman==5.2 --own-venv" passes options (python -m devkit.scaffold --help).
new-module: install
	@if [ -z "$(NAME)" ]; then echo "usage: make new-module NAME=<lower_case_name>"; exit 2; fi
	$(PY) -m devkit.scaffold $(NAME) $(ARGS)

# Run one module's validator in the background with Docker Compose: make up MODULE=lora
up:
	docker compose up -d validator-$(MODULE)

# A Fed Ledger simulator on 127.0.0.1:8765 serving DATA (a JSON file of tasks and submissions).
simulator: install
	$(PY) -m devkit.simulator --data $(DATA) --port 8765

# The wheels of every module's CPU image (modules/<name>/locks/cpu.txt: the files its lock names,
# checked against their hashes), for image builds that cannot reach PyPI (CI); torch's CPU build
# is found where pip's find-links point (PIP_FIND_LINKS). wheels/ is read by the image build's
# first stage only: no module image holds it, and no image tag depends on it.
wheels: install
	@# One module at a time: their stacks may pin different versions of one package.
	@for lock in $(wildcard modules/*/locks/cpu.txt devkit/fixtures/modules/*/locks/cpu.txt); do \
		$(PY) -m pip download --quiet --only-binary=:all: --require-hashes --no-deps \
			-d wheels -r $$lock || exit 1; done

# The hash locks (devkit/lock.py, with uv): requirements-host.lock for the host's venv and each
# module's modules/<name>/locks/{production,cpu}.txt for its image. Resolves only the locks
# whose inputs changed (a test fails on a stale one), keeping their other versions; UPGRADE=1
# resolves every lock at the newest versions its inputs allow. Review the diff like code.
.PHONY: lock
lock: install
	$(PY) -m devkit.lock $(if $(UPGRADE),--upgrade)

base-image:
	bash scripts/local-base-image.sh

# Debian's headless Chromium and ChromeDriver for the page tests (tests/helpers/browser.py);
# FLOCK_SKIP_BROWSER_TESTS=1 opts out of those tests instead. Needs root on a Debian machine.
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then echo "chromium: present"; \
	else DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		chromium chromium-driver >/dev/null || { apt-get update -q >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		chromium chromium-driver >/dev/null; }; fi

# Debian's Prometheus and promtool for the fleet-observation tests (tests/test_prometheus.py,
# deploy/prometheus/). Needs root on a Debian machine.
prometheus:
	@if [ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ]; then echo "prometheus: present"; \
	else DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		prometheus >/dev/null || { apt-get update -q >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		prometheus >/dev/null; }; fi

# Debian's docker-registry for the released-image tests (tests/test_released_images.py runs it on
# a free 127.0.0.1 port, from a config in a temporary folder; the package's own service is not
# started). Needs root on a Debian machine.
registry:
	@if [ -x /usr/bin/docker-registry ]; then echo "docker-registry: present"; \
	else DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		docker-registry >/dev/null || { apt-get update -q >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		docker-registry >/dev/null; }; fi

# A Docker engine, Compose v2 and the local stand-in base image, on a Debian machine that has
# none running (CI, a development sandbox). Needs root.
docker-engine: install wheels
	bash scripts/docker-engine.sh
	bash scripts/local-base-image.sh

# What a state dir says happened: `make report STATE=./state` (text; docs/observing.md for --html).
STATE ?= state
report: install
	$(PY) -m validator report --state-dir $(STATE)

# Time from `python run.py` to the validator's first API call, image already built.
bench-launcher: install wheels base-image
	$(PY) -m bench.launcher_startup

# The lora module's scoring against the reference's way (load, merge, Trainer.evaluate), CPU.
bench: install
	$(PY) -m bench.lora_bench

# The lora module's model work per assignment at Qwen2.5-1.5B/3B sizes, ours against the
# reference's reload and merge (CPU; about 12 GiB of memory and 10 GiB of disk).
bench-model-work: install
	$(PY) -m bench.lora_model_work

# The llm_judge module's batched generation against one prompt at a time (CPU, its own venv).
bench-llm-judge: install
	.venv-llm_judge/bin/python -m bench.llm_judge_generation

# The llm_judge module's model work per LoRA assignment: a warm base against a reload (CPU).
bench-llm-judge-warm: install
	.venv-llm_judge/bin/python -m bench.llm_judge_warm_base

# The validator's own CPU while it fetches an llm_judge full model: honest, and an index of
# 1,000 tiny shards (a hostile one: each shard a download in the validator's process).
bench-llm-judge-plan: install
	.venv-llm_judge/bin/python -m bench.llm_judge_plan

# A year of work (bench/RESULTS.md "A year of work"): each step's cost on a journal of a million
# assignments beside a small one (bench/soak.py, about 20 minutes on 2 cores), then the loop's
# side (bench/soak_loop.py): 429s at 200 tasks, bytes per idle lookup, an rl run of 1,000
# assignments with real children.
bench-soak: install
	$(PY) -m bench.soak
	$(PY) -m bench.soak_loop

# Pinned wheels for running the GPU benches on a machine without network: the lora stack
# (bench/gpu_session.sh there) and the llm_judge stack with fla-core
# (bench/gpu_session_llm_judge.sh); see bench/README.md.
gpu-kit: install
	$(PY) -m bench.gpu_kit
	.venv-llm_judge/bin/python -m bench.gpu_kit --stack llm_judge

# `make test demo` in a fresh clone of HEAD (committed work only) in a new temporary directory,
# with nothing beside it, using this checkout's .venv and wheels: proves the repository is
# self-contained. Needs what `make test` and `make demo` need (a Docker engine).
.PHONY: test-clone
test-clone: install wheels
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	git clone --quiet "$(CURDIR)" "$$tmp/repo"; \
	cp -a wheels/. "$$tmp/repo/wheels/"; \
	test ! -e "$$tmp/shared"; \
	echo "clone of HEAD in $$tmp/repo"; \
	$(MAKE) -C "$$tmp/repo" VENV="$(abspath $(VENV))" -o "$(abspath $(VENV))/.installed" test demo
