"""The assignment decides what the task decides: a field that defines the task is taken from
the assignment's data only, never from what the submitter wrote, and in the loop a validation
set is fetched over http(s) only. The real CLI, the rl module, a local Hub and the simulator."""

from __future__ import annotations

import pytest

from devkit.simulator.process import Simulator, task
from devkit.tiny_policies import linear_policy, npz_bytes, to_bytes, validation_arrays
from devkit.validator_cli import loop_args, run_validator, validator_env, write_config
from tests.faults.ledger import journal_rows
from tests.helpers.served_hub import served_hub
from validator.ledger.answers import Assignment

FEATURES, VENUES = 5, 4


@pytest.fixture
def world(tmp_path):
    with served_hub(tmp_path / "hub") as hub:
        x, info = validation_arrays(200, FEATURES, VENUES, seed=11)
        hub.add_repo("flock/sets", {"val.npz": npz_bytes(X=x, Info=info)})
        hub.add_repo("alice/policy", {"model.onnx": to_bytes(linear_policy(FEATURES, VENUES, 3))})
        local_set = tmp_path / "on-this-host.npz"
        local_set.write_bytes(npz_bytes(X=x, Info=info))
        env = validator_env(tmp_path, HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "hf"))
        del env["HF_TOKEN"]  # rl declares no secret
        write_config(tmp_path, "rl", {"inference_threads": 1})
        yield hub, local_set, env


def run_loop(tmp_path, tasks, env) -> tuple[dict, dict]:
    with Simulator({"tasks": tasks}, tmp_path) as sim:
        result = run_validator(
            loop_args("rl", sim.api_url, "1", "--max-assignments", "1"), env, timeout=120
        )
        assert result.returncode == 0, result.stderr
        (submitted,) = sim.submissions()
    (row,) = journal_rows(tmp_path / "state").values()
    return submitted, row


def test_a_task_field_the_assignment_lacks_is_not_taken_from_the_submitter(tmp_path, world):
    hub, local_set, env = world
    # A task without validation_set_url; the submitter names a file of the validator's host.
    submission = {"data": {"hg_repo_id": "alice/policy", "validation_set_url": str(local_set)}}
    submitted, row = run_loop(
        tmp_path, [task(1, [submission], task_type="rl", max_params=10**6)], env
    )
    assert submitted["status"] == "failed"
    assert "validation_set_url" in row["error"] and "missing field" in row["error"]
    assert str(local_set) not in row["input"]


def test_the_assignment_wins_and_the_submitters_own_fields_still_count(tmp_path, world):
    hub, _, env = world
    url = f"{hub.endpoint}/flock/sets/resolve/main/val.npz"
    submission = {"data": {"hg_repo_id": "alice/policy", "max_params": 1, "revision": "main"}}
    submitted, _ = run_loop(
        tmp_path,
        [task(1, [submission], task_type="rl", validation_set_url=url, max_params=10**6)],
        env,
    )
    # Scored (not the -999 of a 1-parameter limit): max_params came from the task.
    assert submitted["status"] == "completed"
    assert submitted["data"]["average_reward"] > -999


def test_in_the_loop_a_validation_set_is_only_an_http_url(tmp_path, world):
    _, local_set, env = world
    tasks = [
        task(
            1, ["alice/policy"], task_type="rl", validation_set_url=str(local_set), max_params=10**6
        )
    ]
    submitted, row = run_loop(tmp_path, tasks, env)
    assert submitted["status"] == "failed"
    assert "is not an http(s) URL" in row["error"] and "--check" in row["error"]


def test_module_input_keeps_only_the_declared_submitter_fields():
    assignment = Assignment.model_validate(
        {
            "id": 7,
            "data": {"context_length": 512},
            "task_submission": {
                "data": {"hg_repo_id": "a/b", "revision": "v1", "max_params": 1, "x": 2}
            },
        }
    )
    fields = frozenset({"hg_repo_id", "revision"})
    assert assignment.module_input(fields) == {
        "hg_repo_id": "a/b",
        "revision": "v1",
        "context_length": 512,
    }
    # Undeclared (a module that says nothing): upstream's merge, the assignment winning.
    assert assignment.module_input() == {
        "hg_repo_id": "a/b",
        "revision": "v1",
        "max_params": 1,
        "x": 2,
        "context_length": 512,
    }
