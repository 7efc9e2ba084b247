"""An rl fleet end to end: `python run.py rl --workers 2` in the rl image against the Fed Ledger
simulator with four tasks and a local Hub: every assignment submitted once, each task looked up
by one worker only (the User-Agent the simulator heard), and `run.py report rl` adding up both
workers' journals to what the simulator received."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections import Counter

import pytest

from devkit.docker_env import launcher_env, run_py_command
from devkit.hf_hub import LocalHub
from devkit.simulator.process import Simulator, task
from devkit.tiny_policies import linear_policy, npz_bytes, to_bytes, validation_arrays
from devkit.validator_cli import REPO_ROOT
from tests.helpers.docker_env import require_engine

FEATURES, VENUES, ROWS = 6, 3, 64


@pytest.fixture(scope="module")
def engine():
    return require_engine()


def run_py(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        run_py_command(REPO_ROOT, *args), env=env, capture_output=True, text=True, timeout=900
    )


def test_two_rl_workers_share_four_tasks_and_report_them_together(engine, tmp_path):
    x, info = validation_arrays(ROWS, FEATURES, VENUES, seed=5)
    state = f"fv-test-rl-fleet-{uuid.uuid4().hex[:8]}"
    with LocalHub(tmp_path / "hub") as hub:
        hub.add_repo("flock/sets", {"val.npz": npz_bytes(X=x, Info=info)})
        hub.add_repo("alice/policy", {"model.onnx": to_bytes(linear_policy(FEATURES, VENUES, 4))})
        data = {
            "validation_set_url": f"{hub.endpoint}/flock/sets/resolve/main/val.npz",
            "max_params": 10**6,
        }
        tasks = [task(t, ["alice/policy"], task_type="rl", **data) for t in (11, 12, 13, 14)]
        env = launcher_env(HF_ENDPOINT=hub.endpoint)
        del env["HF_TOKEN"]  # rl declares no secret
        try:
            with Simulator({"tasks": tasks}, tmp_path) as sim:
                result = run_py(
                    "rl", "--workers", "2", "--task_ids", "11,12,13,14", "--api-url",
                    sim.api_url, "--max-assignments", "2", "--assignment-lookup-interval", "0.2",
                    "--time-sleep", "0.5", "--state-volume", state,
                    env=env,
                )  # fmt: skip
                assert result.returncode == 0, result.stderr[-4000:]
                sim_state = sim.state()
                lookups = sim.lookups()
            report = run_py("report", "rl", "--json", "--state-volume", state, env=env)
        finally:
            for volume in (state, f"{state}-1"):
                subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True)
    task_of = {a["id"]: str(a["task_id"]) for a in sim_state["assignments"]}
    submitted = Counter(task_of[s["assignment_id"]] for s in sim_state["submissions"])
    assert submitted == Counter({"11": 1, "12": 1, "13": 1, "14": 1})  # each once
    assert {s["status"] for s in sim_state["submissions"]} == {"completed"}
    askers: dict[str, set[str]] = {}
    for entry in lookups:
        askers.setdefault(entry["path"].rsplit("/", 1)[-1], set()).add(entry["agent"])
    first, second = (f"flock-validator (worker {state}-{k})" for k in range(2))
    assert askers == {"11": {first}, "12": {second}, "13": {first}, "14": {second}}
    assert report.returncode == 0, report.stderr
    fleet = json.loads(report.stdout)
    assert fleet["totals"]["by_task"] == {t: {"completed": 1} for t in ("11", "12", "13", "14")}
    assert fleet["totals"]["assignments"] == len(sim_state["assignments"]) == 4
    assert [w["summary"]["assignments"] for w in fleet["workers"]] == [2, 2]
