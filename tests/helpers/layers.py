"""Which layer a test belongs to, as a pytest marker: `-m unit` is the inner loop (`make
test-fast`), `-m faults` the fault suite, `-m "not docker"` everything a machine without an
engine can run.

Each test gets exactly one layer, the first that applies:
- faults: under tests/faults/.
- docker: uses the `engine` fixture (a real Docker engine, tests/helpers/docker_env.py).
- browser: uses the `chromium` fixture (headless Chromium, tests/helpers/browser.py).
- integration: its module uses a real part beyond the test process: a child process
  (`subprocess`, `multiprocessing`, the validator CLI), a server (the Fed Ledger simulator, the
  local hub, the judge server, the trickling server) or a real tiny model (`torch`,
  `transformers`, `devkit.tiny_*`).
- unit: the rest (pure functions and objects in the test process, files under tmp_path).

A layer marker written on a test by hand wins. The rule reads a module's namespace (what it
imported), so a new test file is placed without anyone listing it.
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from pathlib import Path

import pytest

LAYERS = {
    "unit": "in the test process only: no child process, server, model, engine or browser",
    "integration": "real child processes, local servers or tiny models (no engine, no browser)",
    "docker": "needs a Docker engine (`make docker-engine`; FLOCK_SKIP_DOCKER_TESTS=1 opts out)",
    "browser": "needs headless Chromium (`make browser`; FLOCK_SKIP_BROWSER_TESTS=1 opts out)",
    "faults": "the fault suite, tests/faults/: the real CLI against a faulty Fed Ledger",
}

FAULTS_DIR = Path(__file__).resolve().parents[1] / "faults"

# Modules whose use makes a test an integration test (a name or a dotted prefix).
REAL_PARTS = (
    "subprocess",
    "multiprocessing",
    "http.server",
    "torch",
    "transformers",
    "safetensors",
    "devkit.simulator",
    "devkit.validator_cli",
    "devkit.hf_hub",
    "devkit.judge_server",
    "devkit.tiny_",
    "tests.helpers.served_hub",
    "tests.helpers.trickle_server",
    "tests.helpers.children",
)


def register(config: pytest.Config) -> None:
    for name, what in LAYERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")


def _imported(module: types.ModuleType) -> set[str]:
    """The modules a test module's names come from."""
    found = set()
    for value in vars(module).values():
        if isinstance(value, types.ModuleType):
            found.add(value.__name__)
        else:
            origin = getattr(value, "__module__", None)
            if isinstance(origin, str):
                found.add(origin)
    return found


def _uses_real_parts(module: types.ModuleType, cache: dict[str, bool]) -> bool:
    if module.__name__ not in cache:
        names = _imported(module)
        cache[module.__name__] = any(
            name == part or name.startswith(part if part.endswith("_") else part + ".")
            for name in names
            for part in REAL_PARTS
        )
    return cache[module.__name__]


def layer_of(item: pytest.Item, cache: dict[str, bool]) -> str:
    if FAULTS_DIR in Path(item.path).resolve().parents:
        return "faults"
    fixtures = getattr(item, "fixturenames", ())
    if "engine" in fixtures:
        return "docker"
    if "chromium" in fixtures:
        return "browser"
    module = getattr(item, "module", None)
    if module is not None and _uses_real_parts(module, cache):
        return "integration"
    return "unit"


def mark_layers(items: Iterable[pytest.Item]) -> None:
    cache: dict[str, bool] = {}
    for item in items:
        if any(item.get_closest_marker(name) for name in LAYERS):
            continue
        item.add_marker(getattr(pytest.mark, layer_of(item, cache)))
