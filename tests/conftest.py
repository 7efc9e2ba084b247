from __future__ import annotations

import pytest

from devkit.simulator import process as simulator_process
from tests.faults.figures import FIGURES, Figure
from tests.helpers import layers


def pytest_configure(config: pytest.Config) -> None:
    layers.register(config)
    # The Fed Ledger simulator serves from a thread of the test process: the validator still
    # talks to it over HTTP, without a Python start-up per test (tests of the simulator's own
    # command line ask for its process).
    simulator_process.IN_THREAD_DEFAULT = True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    layers.mark_layers(items)


@pytest.fixture(scope="session")
def engine():
    """The Docker engine (its users are marked `docker`); a module may define its own."""
    # Imported here: the docker SDK is not needed to collect or run the other layers.
    from tests.helpers.docker_env import require_engine

    return require_engine()


@pytest.fixture
def cli(tmp_path):
    """The validator's CLI with the fixture module, its state under tmp_path (its users run a
    child: integration; tests/helpers/cli.py)."""
    from tests.helpers.cli import LoopCli

    return LoopCli(tmp_path)


@pytest.fixture
def loop(tmp_path):
    """The runner in this process, against a fake Fed Ledger and clock (tests/helpers/loop.py)."""
    from tests.helpers.loop import Loop

    harness = Loop(tmp_path)
    yield harness
    harness.close()


@pytest.fixture
def chromium(tmp_path):
    """A headless Chromium driver (its users are marked `browser`)."""
    from tests.helpers.browser import browser

    with browser(tmp_path) as driver:
        yield driver


def pytest_sessionfinish(session: pytest.Session) -> None:
    # In an xdist worker: its figures go to the controller, which prints them all.
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["figures"] = [(figure.case, figure.result) for figure in FIGURES]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    FIGURES.extend(Figure(*pair) for pair in getattr(node, "workeroutput", {}).get("figures", []))


def pytest_terminal_summary(terminalreporter) -> None:
    if not FIGURES:
        return
    terminalreporter.section("fault suite figures")
    width = max(len(f.case) for f in FIGURES)
    for figure in FIGURES:
        terminalreporter.write_line(f"{figure.case:<{width}}  {figure.result}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    layers.RUNNING["docker"] = item.get_closest_marker("docker") is not None
    if not item.get_closest_marker("unit"):
        return (yield)
    with layers.guard_unit(item.nodeid):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    if not item.get_closest_marker("unit"):
        return (yield)
    with layers.guard_unit(item.nodeid):
        return (yield)
