"""`python run.py rl` in the rl image against the Fed Ledger simulator and a local Hub: no GPU
asked for, no HF token needed, honest and hostile submissions each with their outcome."""

from __future__ import annotations

import subprocess
import uuid

import numpy as np
import pytest

from devkit.docker_env import launcher_env, run_py_command
from devkit.hf_hub import LocalHub
from devkit.simulator.process import Simulator, task
from devkit.tiny_policies import (
    custom_domain_policy,
    linear_policy,
    npz_bytes,
    point_external_data,
    to_bytes,
    validation_arrays,
    weights,
)
from devkit.validator_cli import REPO_ROOT
from modules.rl.reward import average_reward, rewards
from tests.helpers.docker_env import require_engine

FEATURES, VENUES, ROWS = 6, 3, 256


@pytest.fixture(scope="module")
def engine():
    return require_engine()


def test_run_py_rl_validates_assignments_in_its_image(engine, tmp_path):
    x, info = validation_arrays(ROWS, FEATURES, VENUES, seed=21)
    with LocalHub(tmp_path / "hub") as hub:
        hub.add_repo("flock/sets", {"val.npz": npz_bytes(X=x, Info=info)})
        hub.add_repo("alice/policy", {"model.onnx": to_bytes(linear_policy(FEATURES, VENUES, 4))})
        escape = point_external_data(linear_policy(FEATURES, VENUES), "../../../etc/shadow")
        hub.add_repo("mallory/escape", {"model.onnx": to_bytes(escape)})
        hub.add_repo(
            "mallory/custom", {"model.onnx": to_bytes(custom_domain_policy(FEATURES, VENUES))}
        )
        data = {
            "validation_set_url": f"{hub.endpoint}/flock/sets/resolve/main/val.npz",
            "max_params": 10**6,
        }
        repos = ["alice/policy", "mallory/escape", "mallory/custom"]
        with Simulator({"tasks": [task(7, repos, task_type="rl", **data)]}, tmp_path) as sim:
            state = f"fv-test-rl-state-{uuid.uuid4().hex[:8]}"
            env = launcher_env(HF_ENDPOINT=hub.endpoint)
            del env["HF_TOKEN"]  # rl declares no secret: none is needed
            try:
                result = subprocess.run(
                    run_py_command(
                        REPO_ROOT, "rl", "--task_ids", "7", "--api-url", sim.api_url,
                        "--max-assignments", "3", "--assignment-lookup-interval", "0.2",
                        "--time-sleep", "0.5", "--state-volume", state,
                    ),
                    env=env, capture_output=True, text=True, timeout=600,
                )  # fmt: skip
            finally:
                subprocess.run(["docker", "volume", "rm", "-f", state], capture_output=True)
            assert result.returncode == 0, result.stderr
            submitted = sim.results_by_repo()
    assert "(gpus: none)" in result.stderr  # the spec asks for no GPU: none is requested
    w, b = weights(FEATURES, VENUES, 4)
    expected = float(average_reward(rewards((x @ w + b).astype(np.float32), info)))
    assert submitted["alice/policy"]["status"] == "completed"
    assert submitted["alice/policy"]["data"]["average_reward"] == pytest.approx(expected, rel=1e-5)
    assert submitted["mallory/escape"]["status"] == "failed"
    assert submitted["mallory/custom"]["status"] == "failed"
    assert "outside the submission's folder; never read" in result.stderr
    assert "'com.evil.ops'" in result.stderr
