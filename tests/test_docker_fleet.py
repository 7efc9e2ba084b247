"""A fleet on one host against a real Docker engine and the Fed Ledger simulator: the
fixture module's image (tests/test_docker_launcher.py builds it the same way), two workers
without a GPU. Every assignment is submitted once, each task is looked up by one worker (what
the simulator heard in each request's User-Agent), a worker killed from outside restarts and
loses nothing while the other goes on, one that needs the operator is one line and the other
goes on, and the report adds up both journals."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from docker.errors import NotFound

from devkit.docker_env import launcher_env, make_module_repo, run_py_command, unique_volumes
from devkit.simulator.process import Simulator, task
from devkit.validator_cli import wait_for
from tests.helpers.docker_env import require_engine

WAIT = 240  # seconds for what a busy 2-core machine does in a few


@pytest.fixture(scope="module")
def engine():
    return require_engine()


@pytest.fixture(scope="module")
def repo(engine, tmp_path_factory):
    return make_module_repo(tmp_path_factory.mktemp("repo"))


@pytest.fixture
def volumes(engine):
    """--state-volume (worker 0's; worker K's is it with -K) and --hf-cache-volume."""
    names = unique_volumes()
    yield names
    base = names[1]
    for name in (base, f"{base}-1", names[3]):
        try:
            engine.volumes.get(name).remove(force=True)
        except NotFound:
            pass


def fleet_args(sim, task_ids: str, configs: Path, volumes: list[str], *extra: str) -> list[str]:
    return [
        "fixture",
        "--workers",
        "2",
        "--task_ids",
        task_ids,
        "--api-url",
        sim.api_url,
        "--assignment-lookup-interval",
        "0.2",
        "--time-sleep",
        "0.3",
        "--restart-delay",
        "0.5",
        "--config-dir",
        str(configs),
        *volumes,
        *extra,
    ]


def start(repo: Path, args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w") as err:  # the launcher keeps its own copy of the descriptor
        return subprocess.Popen(
            run_py_command(repo, *args),
            env=launcher_env(),
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
        )


def stop(process: subprocess.Popen, log: Path) -> str:
    process.terminate()
    process.wait(timeout=WAIT)
    return log.read_text()


def task_of_assignment(sim) -> dict[int, str]:
    return {a["id"]: str(a["task_id"]) for a in sim.state()["assignments"]}


def submitted_by_task(sim) -> Counter[str]:
    tasks = task_of_assignment(sim)
    return Counter(tasks[s["assignment_id"]] for s in sim.submissions())


def worker_of_lookups(sim) -> dict[str, set[str]]:
    """Task id -> the workers whose lookups of it the simulator received."""
    found: dict[str, set[str]] = {}
    for entry in sim.lookups():
        task_id = entry["path"].rsplit("/", 1)[-1]
        found.setdefault(task_id, set()).add(entry["agent"])
    return found


def handed_out(sim) -> list[str]:
    return [a["task_submission"]["data"]["hg_repo_id"] for a in sim.state()["assignments"]]


def replaced(engine, name: str, old_id: str) -> bool:
    container = running_container(engine, name)
    return container is not None and container.id != old_id


def running_container(engine, name: str):
    try:
        container = engine.containers.get(name)
    except NotFound:
        return None
    return container if container.status == "running" else None


def test_two_workers_share_the_tasks_survive_a_kill_and_add_up_in_the_report(
    engine, repo, tmp_path, volumes
):
    configs = tmp_path / "configs"
    configs.mkdir()
    # slow/held waits for this file (in the mounted configs) before it is scored.
    release = configs / "release"
    (configs / "fixture.json").write_text(
        json.dumps({"release_file": "/app/configs/release", "slow_seconds": 600})
    )
    # Shard 0/2 takes tasks 1 and 3, shard 1/2 tasks 2 and 4 (positions K, K+N, ...).
    tasks = [
        task(1, ["ok/a1", "ok/a2"]),
        task(2, ["slow/held", "ok/b2"]),
        task(3, ["ok/c1", "ok/c2"]),
        task(4, ["ok/d1"]),
    ]
    base = volumes[1]
    names = [f"{base}-0", f"{base}-1"]
    log = tmp_path / "run.log"
    with Simulator({"tasks": tasks}, tmp_path) as sim:
        process = start(repo, fleet_args(sim, "1,2,3,4", configs, volumes), log)
        try:
            # Worker 1 holds slow/held; kill its container from outside, as an OOM would.
            wait_for(lambda: "slow/held" in handed_out(sim), WAIT, "slow/held to be handed out")
            killed = running_container(engine, names[1])
            assert killed is not None, log.read_text()
            killed.kill()
            wait_for(
                lambda: replaced(engine, names[1], killed.id),
                WAIT,
                "the killed worker's new container",
            )
            # The other worker went on: every assignment of its tasks is submitted.
            wait_for(
                lambda: submitted_by_task(sim) >= Counter({"1": 2, "3": 2}),
                WAIT,
                "worker 0's submissions",
            )
            assert submitted_by_task(sim)["2"] == 0  # worker 1 is still held on slow/held
            release.write_text("")
            wait_for(lambda: len(sim.submissions()) == 7, WAIT, "all seven submissions")
        finally:
            stderr = stop(process, log)
        state = sim.state()
        lookups = worker_of_lookups(sim)
        by_task = submitted_by_task(sim)
    assert process.returncode == 0, stderr
    # Every assignment submitted once, and no submission handed out twice (nothing lost, nothing
    # scored twice by two workers).
    assert sorted(s["assignment_id"] for s in state["submissions"]) == sorted(
        a["id"] for a in state["assignments"]
    )
    assert len(state["assignments"]) == 7
    assert {s["status"] for s in state["submissions"]} == {"completed"}
    assert by_task == Counter({"1": 2, "2": 2, "3": 2, "4": 1})
    # Each task looked up by one worker only, the one whose shard holds it.
    agent = "flock-validator (worker {})"
    assert lookups == {
        "1": {agent.format(names[0])},
        "2": {agent.format(names[1])},
        "3": {agent.format(names[0])},
        "4": {agent.format(names[1])},
    }
    assert f"worker {names[1]}: the validator was killed (exit 137); restarting" in stderr
    assert f"[{names[1]}] " in stderr  # its log lines carry its name
    assert engine.containers.list(all=True, filters={"name": base}) == []

    report = subprocess.run(
        run_py_command(repo, "report", "fixture", "--json", "--state-volume", base),
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert report.returncode == 0, report.stderr
    fleet = json.loads(report.stdout)
    totals = {t: counts.get("completed", 0) for t, counts in fleet["totals"]["by_task"].items()}
    assert totals == dict(by_task)
    assert fleet["totals"]["assignments"] == len(state["assignments"])
    assert [(w["worker"], w["state_volume"]) for w in fleet["workers"]] == [
        (0, base),
        (1, f"{base}-1"),
    ]
    assert set(fleet["workers"][0]["summary"]["by_task"]) == {"1", "3"}
    assert set(fleet["workers"][1]["summary"]["by_task"]) == {"2", "4"}
    one = subprocess.run(
        run_py_command(repo, "report", "fixture", "--state-volume", base, "--worker", "1"),
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert one.returncode == 0, one.stderr
    assert "(3 assignments," in one.stdout  # worker 1's journal alone: tasks 2 and 4


def test_a_worker_that_needs_the_operator_is_one_line_and_the_other_goes_on(
    engine, repo, tmp_path, volumes
):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "fixture.json").write_text(json.dumps({}))
    base = volumes[1]
    names = [f"{base}-0", f"{base}-1"]
    log = tmp_path / "run.log"
    with Simulator({"tasks": [task(1, ["ok/a"]), task(2, ["operator/x"])]}, tmp_path) as sim:
        process = start(repo, fleet_args(sim, "1,2", configs, volumes), log)
        try:
            wait_for(lambda: "stopped for good (exit 3)" in log.read_text(), WAIT, "worker 1's end")
            # Worker 0 still looks up work and scores what comes.
            sim.add_submission(1, {"hg_repo_id": "ok/late"})
            wait_for(lambda: len(sim.submissions()) == 2, WAIT, "worker 0's two submissions")
        finally:
            stderr = stop(process, log)
        results = sim.results_by_repo()
    assert process.returncode == 3, stderr
    assert set(results) == {"ok/a", "ok/late"}
    ended = [line for line in stderr.splitlines() if "needs operator action" in line]
    assert ended == [
        f"[run.py] worker {names[1]}: the validator needs operator action (exit 3): see its "
        "last error above; fix it and rerun"
    ]
    assert f"[run.py] worker {names[1]} stopped for good (exit 3); 1 go on" in stderr
