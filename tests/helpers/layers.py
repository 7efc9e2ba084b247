"""Which layer a test belongs to, as a pytest marker: `-m unit` is the inner loop (`make
test-fast`), `-m faults` the fault suite, `-m "not docker"` everything a machine without an
engine can run.

Each test gets exactly one layer, the first that applies:
- faults: under tests/faults/.
- docker: uses the `engine` fixture (a real Docker engine, tests/helpers/docker_env.py).
- browser: uses the `chromium` fixture (headless Chromium, tests/helpers/browser.py).
- integration: the test itself uses a real part beyond the test process: a child process
  (`subprocess`, `multiprocessing`, the validator CLI), a server (the Fed Ledger simulator, the
  local hub, the judge server, the trickling server) or a real tiny model (`torch`,
  `transformers`, `devkit.tiny_*`).
- unit: the rest (pure functions and objects in the test process, files under tmp_path).

"Uses" is read per test, not per file: the global names the test's code refers to (its body,
nested functions, the fixtures it requests, its parameters), followed into the helpers and
classes its own test modules define (tests/, and the test class's methods), down to where they
come from. One `import subprocess` at the top of a file no longer makes its pure tests
integration. A name in the product's code (validator, launcher, devkit) is judged by the module
it comes from, not followed: a product function that starts a child is caught at run time
instead, by `guard_unit` (a unit test that starts a process or listens on a socket fails with a
line saying to mark it). A layer marker written on a test (or its module via `pytestmark`) by
hand wins. So a new test is placed without anyone listing it.
"""

from __future__ import annotations

import inspect
import multiprocessing.util
import os
import socket
import subprocess
import sys
import types
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
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

# Modules whose use makes a test an integration test (a name or a dotted prefix), or one class
# or function of a module that is otherwise pure.
REAL_PARTS = (
    "subprocess",
    "multiprocessing",
    "http.server",
    "socketserver",
    "torch",
    "transformers",
    "safetensors",
    "bench",
    "validator.sandbox.child_process",
    "validator.kit.boundary",
    "validator.sandbox.child_server",
    "validator.kit.adapter_patterns",
    # Modules that read a submission in a bounded child through the kit's facade:
    "modules.rl.policy",
    "modules.lora.reading",
    "modules.llm_judge.inspection",
    "validator.observe.status_server",
    "validator.observe.bounded_http",
    "devkit.simulator",
    "devkit.validator_cli",
    "devkit.hf_hub",
    "devkit.hf_hub_http",
    "devkit.hf_hub_repos",
    "devkit.local_server",  # the base of devkit's servers
    "devkit.judge_server",
    "devkit.github_api",
    "devkit.local_registry",
    "devkit.release_channel.LocalReleaseChannel",  # its ReleaseKey is a pure helper
    "devkit.judge_prompts.JudgeSourceServer",  # a name in a module of pure helpers
    "devkit.tiny_",
    "tests.helpers.cli",  # the validator's CLI (the `cli` fixture)
    "tests.helpers.served_hub",
    "tests.helpers.trickle_server",
    "tests.helpers.hostile_server",
    "tests.helpers.children",
    "tests.helpers.prometheus",
    "tests.helpers.hf_cache_worker",
)

# Code followed into: the tests' own (test modules, conftest, tests/helpers); anything else is
# judged by its module's name.
TESTS_DIR = FAULTS_DIR.parent


def register(config: pytest.Config) -> None:
    for name, what in LAYERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")


def _is_real(module_name: str | None) -> bool:
    if not isinstance(module_name, str):
        return False
    return any(
        module_name == part or module_name.startswith(part if part.endswith("_") else part + ".")
        for part in REAL_PARTS
    )


def _qualified(value: object) -> str:
    return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}"


def _followed(module_name: str | None) -> bool:
    module = sys.modules.get(module_name) if isinstance(module_name, str) else None
    file = getattr(module, "__file__", None)
    return isinstance(file, str) and TESTS_DIR in Path(file).resolve().parents


class _Reader:
    """Reads code for the names it uses; remembers what it has judged."""

    def __init__(self) -> None:
        self.seen: dict[int, bool] = {}

    def value(self, value: object, owner: type | None = None) -> bool:
        key = id(value)
        if key in self.seen:
            return self.seen[key]
        self.seen[key] = False  # a cycle reads as not real until proven otherwise
        self.seen[key] = result = self._value(value, owner)
        return result

    def _value(self, value: object, owner: type | None) -> bool:
        if isinstance(value, types.ModuleType):
            return _is_real(value.__name__)
        if isinstance(value, (staticmethod, classmethod)):
            return self.value(value.__func__, owner)
        if isinstance(value, property):
            return any(self.value(f, owner) for f in (value.fget, value.fset) if f)
        if isinstance(value, types.MethodType):
            return self.value(value.__func__, owner)
        if inspect.isfunction(value):
            value = inspect.unwrap(value)
            if _is_real(value.__module__) or _is_real(_qualified(value)):
                return True
            if not _followed(value.__module__):
                return False
            return self.code(value.__code__, value.__globals__, owner)
        if inspect.isclass(value):
            if any(_is_real(b.__module__) or _is_real(_qualified(b)) for b in value.__mro__):
                return True
            if not _followed(value.__module__):
                return False
            return any(self.value(attr, value) for attr in vars(value).values())
        origin = getattr(type(value), "__module__", None)
        if _is_real(origin):
            return True
        if _followed(origin):
            return self.value(type(value))
        if isinstance(value, (list, tuple, set, frozenset)):
            return any(self.value(v) for v in value)
        if isinstance(value, dict):
            return any(self.value(v) for v in value.values())
        return False

    def code(self, code: types.CodeType, globals_: dict, owner: type | None) -> bool:
        for name in code.co_names:
            if _is_real(name):  # an import inside the function: `import torch`, `from x import`
                return True
            if name in globals_ and self.value(globals_[name], owner):
                return True
            if owner is not None and name in vars(owner) and self.value(vars(owner)[name], owner):
                return True
        for const in code.co_consts:
            if isinstance(const, types.CodeType) and self.code(const, globals_, owner):
                return True
        return False


def _uses_real_parts(item: pytest.Item, reader: _Reader) -> bool:
    function = getattr(item, "obj", None)
    owner = getattr(item, "cls", None)
    if function is not None and reader.value(function, owner):
        return True
    info = getattr(item, "_fixtureinfo", None)
    for defs in getattr(info, "name2fixturedefs", {}).values():
        for fixturedef in defs:
            func = getattr(fixturedef, "func", None)
            if func is not None and reader.value(func):
                return True
    callspec = getattr(item, "callspec", None)
    params = getattr(callspec, "params", {}) if callspec is not None else {}
    return any(reader.value(value) for value in params.values())


def layer_of(item: pytest.Item, reader: _Reader | None = None) -> str:
    if FAULTS_DIR in Path(item.path).resolve().parents:
        return "faults"
    fixtures = getattr(item, "fixturenames", ())
    if "engine" in fixtures:
        return "docker"
    if "chromium" in fixtures:
        return "browser"
    if _uses_real_parts(item, reader or _Reader()):
        return "integration"
    return "unit"


def mark_layers(items: Iterable[pytest.Item]) -> None:
    reader = _Reader()
    for item in items:
        if any(item.get_closest_marker(name) for name in LAYERS):
            continue
        item.add_marker(getattr(pytest.mark, layer_of(item, reader)))


# Whether the running test is in the docker layer (set by tests/conftest.py): the engine is
# handed only to those, as `make test` runs them one after another in a process of their own
# (a test that reached the engine another way ran beside them, and its containers failed their
# "none left" checks).
RUNNING = {"docker": False}


class NotUnit(Exception):
    """A test the rule placed in the unit layer started a real part."""


@contextmanager
def guard_unit(nodeid: str) -> Iterator[None]:
    """Within a unit test: starting a process or listening on a socket fails the test, naming
    the fix (mark it `integration`), so the unit layer stays what `make test-fast` promises."""

    def refuse(what: str):
        def stop(*args, **kwargs):
            raise NotUnit(
                f"{nodeid} is in the unit layer but {what}: mark it "
                "@pytest.mark.integration (tests/helpers/layers.py)"
            )

        return stop

    saved = [
        (subprocess.Popen, "_execute_child", subprocess.Popen._execute_child),
        (os, "fork", os.fork),
        (multiprocessing.util, "spawnv_passfds", multiprocessing.util.spawnv_passfds),
        (socket.socket, "listen", socket.socket.listen),
    ]
    subprocess.Popen._execute_child = refuse("starts a child process")  # type: ignore[method-assign]
    os.fork = refuse("forks")  # type: ignore[assignment]
    multiprocessing.util.spawnv_passfds = refuse("starts a child process")  # type: ignore[assignment]
    socket.socket.listen = refuse("listens on a socket")  # type: ignore[method-assign]
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
