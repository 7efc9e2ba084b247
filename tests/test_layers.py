"""tests/helpers/layers.py: a test's layer is read from what that test uses (its body, its
helpers, its fixtures), not from its file's imports; a unit test that starts a real part fails."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from devkit.simulator.process import Simulator
from tests.helpers import layers
from tests.helpers.layers import NotUnit, guard_unit, layer_of


def item(function, fixtures=(), fixture_functions=(), params=None):
    """What layer_of reads of a pytest item."""
    defs = {f"f{i}": [SimpleNamespace(func=f)] for i, f in enumerate(fixture_functions)}
    return SimpleNamespace(
        path=Path(__file__),
        fixturenames=list(fixtures),
        obj=function,
        cls=None,
        _fixtureinfo=SimpleNamespace(name2fixturedefs=defs),
        callspec=SimpleNamespace(params=params) if params else None,
    )


def pure():
    assert sorted([2, 1]) == [1, 2]


def helper_runs_a_child():
    return subprocess.run(["true"], check=True)


def calls_the_helper():
    helper_runs_a_child()


def imports_torch_inside():
    import torch  # noqa: F401


def uses_the_simulator_fixture(sim):
    pass


def simulator_fixture(tmp_path):
    with Simulator({"tasks": []}, tmp_path) as sim:
        yield sim


class Helper:
    def start(self):
        return subprocess.Popen(["true"])


def uses_a_class_that_starts_a_child():
    Helper().start()


class Served:
    """Stands for a server class listed by name in a module of pure helpers
    (devkit.judge_prompts.JudgeSourceServer)."""


def pure_helper():
    return 1


def uses_the_listed_class():
    Served()


def test_a_pure_test_in_a_file_that_imports_subprocess_is_unit():
    assert layer_of(item(pure)) == "unit"


def test_a_class_listed_by_name_is_a_real_part_and_its_modules_other_names_are_not(monkeypatch):
    monkeypatch.setattr(layers, "REAL_PARTS", (*layers.REAL_PARTS, f"{__name__}.Served"))
    assert layer_of(item(uses_the_listed_class)) == "integration"
    assert layer_of(item(pure_helper)) == "unit"


@pytest.mark.parametrize(
    "function",
    [calls_the_helper, imports_torch_inside, uses_a_class_that_starts_a_child],
)
def test_what_a_test_reaches_through_its_helpers_makes_it_integration(function):
    assert layer_of(item(function)) == "integration"


def test_a_fixture_that_starts_a_server_makes_its_user_integration():
    test = item(uses_the_simulator_fixture, ["sim"], [simulator_fixture])
    assert layer_of(test) == "integration"
    assert layer_of(item(pure, ["tmp_path"])) == "unit"


def test_a_parameter_that_is_a_real_part_makes_the_case_integration():
    assert layer_of(item(pure, params={"runner": helper_runs_a_child})) == "integration"
    assert layer_of(item(pure, params={"n": 3})) == "unit"


def test_the_engine_and_browser_fixtures_decide_first():
    assert layer_of(item(pure, ["engine"])) == "docker"
    assert layer_of(item(pure, ["chromium"])) == "browser"


@pytest.mark.unit  # by hand: it names subprocess and socket only to see them refused
def test_a_unit_test_that_starts_a_child_or_listens_fails_and_the_guard_lets_go():
    popen, listen = subprocess.Popen._execute_child, socket.socket.listen
    with guard_unit("tests/x.py::test_x"):
        with pytest.raises(NotUnit, match=r"tests/x.py::test_x .* starts a child process"):
            subprocess.run(["true"])
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            with pytest.raises(NotUnit, match="listens on a socket"):
                sock.listen()
    assert (subprocess.Popen._execute_child, socket.socket.listen) == (popen, listen)
