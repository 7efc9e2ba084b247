"""One name per worker's journal, against a real Docker engine and the Fed Ledger simulator:
compose.gpus.yaml and run.py both name it after the worker (run.py's name), so that a host that
moves from one to the other keeps its journal and what is not yet submitted. A journal under a
GPU's name (compose.gpus.yaml's earlier one) is named by the doctor, and a start of run.py moves
it into its worker's journal, which submits it."""

from __future__ import annotations

import signal
import subprocess
import uuid

import pytest

from devkit.docker_env import LOCAL_BASE, launcher_env, make_module_repo, run_py_command
from devkit.simulator.process import Simulator, task
from devkit.validator_cli import wait_for
from tests.helpers.docker_env import require_engine


@pytest.fixture(scope="module")
def engine():
    return require_engine()


@pytest.fixture(scope="module")
def repo(engine, tmp_path_factory):
    return make_module_repo(tmp_path_factory.mktemp("repo"))


def run_py(repo, *args, env=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        run_py_command(repo, *args),
        env=env or launcher_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def loop_args(sim, task_ids, *extra):
    return [
        "fixture", "--gpus", "none", "--task_ids", task_ids, "--api-url", sim.api_url,
        "--assignment-lookup-interval", "0.2", "--time-sleep", "0.3", *extra,
    ]  # fmt: skip


def test_a_journal_under_compose_gpus_earlier_name_is_moved_and_submitted(engine, repo, tmp_path):
    old = f"flock-validator-fixture-gpuGPU-{uuid.uuid4().hex[:8]}-state"
    state = f"fv-test-state-{uuid.uuid4().hex[:8]}"
    down = {"endpoint": "update", "kind": "status", "status": 503, "count": None}
    try:
        with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path, faults=[down]) as sim:
            process = subprocess.Popen(  # scored under the earlier name, its submit refused
                run_py_command(repo, *loop_args(sim, "1", "--state-volume", old)),
                env=launcher_env(VALIDATOR_API_RETRIES="0"),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            wait_for(lambda: any(r["fault"] for r in sim.state()["requests"]), 120, "a submit")
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=60)
            sim.clear_faults()
            doctor = run_py(repo, "doctor", "fixture", "--task_ids", "1", "--api-url", sim.api_url)
            assert f"{old}: journals named after a GPU" in doctor.stdout, doctor.stdout
            setup = [line for line in doctor.stdout.splitlines() if line.startswith("module setup")]
            assert setup and "fixture: nothing missing (scale 1)" in setup[0], doctor.stdout
            args = loop_args(sim, "1", "--max-assignments", "1", "--state-volume", state)
            result = run_py(repo, *args)
            assert result.returncode == 0, result.stderr
            assert [s["status"] for s in sim.submissions()] == ["completed"]
        assert f"the journal of {old} (compose.gpus.yaml's name before) is now in {state}" in (
            result.stderr
        )
        assert "1 results to submit" in result.stderr
        assert not engine.volumes.list(filters={"name": old})  # moved, nothing left behind
    finally:
        for name in (old, state):
            for volume in engine.volumes.list(filters={"name": name}):
                volume.remove(force=True)


def test_a_move_container_the_engine_removes_while_it_is_listed_is_passed_over(engine, monkeypatch):
    """An auto-removed move container that ends between the engine's list and its inspection
    (a start after a launcher killed mid-move) is gone, not a lost engine."""
    from docker.models.containers import ContainerCollection

    from launcher.fleet import volumes

    name = f"fv-test-old-{uuid.uuid4().hex[:8]}"
    labelled = {"label": f"{volumes.MOVE_LABEL}={name}"}
    container = engine.containers.create(
        LOCAL_BASE, ["true"], labels={volumes.MOVE_LABEL: name}, network_mode="none"
    )
    inspected = []
    real_get = ContainerCollection.get

    def removed_first(self, container_id):
        if container_id == container.id:  # the engine removes it after listing it
            engine.api.remove_container(container_id, force=True)
        inspected.append(container_id)
        return real_get(self, container_id)

    monkeypatch.setattr(ContainerCollection, "get", removed_first)
    try:
        volumes._end_earlier_moves(engine, name)
    finally:
        monkeypatch.undo()
        for left in engine.containers.list(all=True, filters=labelled, sparse=True):
            left.remove(force=True)
    assert inspected == [container.id]
    assert engine.containers.list(all=True, filters=labelled, sparse=True) == []
