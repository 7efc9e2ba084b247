"""compose.yaml against a real engine with Compose v2."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid

import pytest
import yaml
from packaging.utils import canonicalize_name

from devkit.docker_env import launcher_env, make_module_repo, run_py_command
from devkit.hf_hub import LocalHub
from devkit.simulator.process import Simulator, task
from devkit.tiny_policies import linear_policy, npz_bytes, to_bytes, validation_arrays
from devkit.validator_cli import REPO_ROOT
from launcher.engine.images import BuildSpec, ensure_image
from tests.helpers.docker_env import require_engine
from tests.helpers.locks import entries

# What a module author adds to run a new module with compose: a service extending lora's.
FIXTURE_SERVICE = """
services:
  validator-fixture:
    extends: {file: compose.yaml, service: validator-lora}
    image: flock-validator-fixture:compose-test  # not lora's released name
    build:
      args:
        MODULE: fixture
    command: ["fixture", "--task_ids", "${TASK_IDS}", "--max-assignments", "2",
              "--assignment-lookup-interval", "0.2"]
    restart: "no"
    deploy: !reset {}  # no GPUs here
    volumes: !override
      - ./configs:/app/configs:ro
      - fixture-state:/data/state
volumes:
  fixture-state:
    name: ${STATE_VOLUME}
"""

# The generated rl service as it is, made to stop after its work and to keep its journal in a
# volume of this test.
RL_OVERRIDE = """
services:
  validator-rl:
    image: {image}
    command: ["rl", "--max-assignments", "2", "--assignment-lookup-interval", "0.2"]
    restart: "no"
    volumes: !override
      - ./configs:/app/configs:ro
      - rl-state:/data/state
volumes:
  rl-state:
    name: ${STATE_VOLUME}
"""


@pytest.fixture(scope="module")
def engine():
    client = require_engine()
    version = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if version.returncode != 0:
        pytest.fail("Compose v2 is missing: run `make docker-engine`", pytrace=False)
    return client


def compose(cwd, *args, env, timeout=300):
    return subprocess.run(
        ["docker", "compose", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_compose_config_is_valid_and_requires_the_secrets(engine):
    env = launcher_env(TASK_IDS="12,34")
    result = compose(REPO_ROOT, "config", env=env)
    assert result.returncode == 0, result.stderr
    assert "MODULE: lora" in result.stdout
    assert "BASE_IMAGE: local/base:bookworm" in result.stdout  # overridable from the environment
    # Every service's log rotates: 5 files of 10 MB, or what the host's environment says.
    services = yaml.safe_load(result.stdout)["services"]
    assert {json.dumps(s["logging"], sort_keys=True) for s in services.values()} == {
        json.dumps({"driver": "json-file", "options": {"max-file": "5", "max-size": "10m"}})
    }
    resized = compose(REPO_ROOT, "config", env={**env, "VALIDATOR_LOG_MAX_SIZE": "20m"})
    logging = yaml.safe_load(resized.stdout)["services"]["validator-rl"]["logging"]
    assert logging["options"] == {"max-size": "20m", "max-file": "5"}
    for variable in ("FLOCK_API_KEY", "TASK_IDS"):
        missing = {**env, variable: ""}
        result = compose(REPO_ROOT, "config", "-q", env=missing)
        assert result.returncode != 0
        assert f"set {variable}" in result.stderr
    # A module's own secret is the validator's to require (exit 2 naming it), not Compose's:
    # Compose interpolates every service, and `up validator-rl` must not demand lora's token.
    without_token = {k: v for k, v in env.items() if k != "HF_TOKEN"}
    result = compose(REPO_ROOT, "config", "validator-rl", env=without_token)
    assert result.returncode == 0, result.stderr
    assert "HF_TOKEN" not in result.stdout


def test_compose_cpu_override_drops_the_gpu_reservation(engine):
    env = launcher_env(TASK_IDS="1")
    result = compose(REPO_ROOT, "-f", "compose.yaml", "-f", "compose.cpu.yaml", "config", env=env)
    assert result.returncode == 0, result.stderr
    service = result.stdout.split("validator-lora:")[1].split("\nvolumes:")[0]
    assert "driver: nvidia" not in service
    assert "driver: nvidia" in compose(REPO_ROOT, "config", env=env).stdout


def git(cwd, *args):
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def losses(results):
    return {repo: r["data"]["loss"] for repo, r in results.items() if r["status"] == "completed"}


def doctor_row(repo, env, name):
    """`python run.py doctor fixture`'s row `name` (the doctor's other rows, a GPU's, may fail
    here: only this row is read)."""
    done = subprocess.run(
        run_py_command(repo, "doctor", "fixture", "--timeout", "20"),
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    rows = [re.match(rf"{name}\s+(\w+)\s+(.*)", line) for line in done.stdout.splitlines()]
    found = [row.groups() for row in rows if row]
    assert found, done.stdout + done.stderr
    return found[0]


def test_an_upgrade_at_the_same_version_runs_the_new_code_as_upgrading_md_says(engine, tmp_path):
    # docs/upgrading.md with Compose, as an operator follows it: a checkout of a remote, its
    # validator started; the remote's code changes at the same version (pyproject.toml's); stop,
    # `git pull`, start again with the same command. The new code must score what comes after.
    origin = make_module_repo(tmp_path / "origin")
    (origin / "compose.fixture.yaml").write_text(FIXTURE_SERVICE)
    git(origin, "init", "--quiet")
    git(origin, "add", "--all")
    git(origin, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-m", "v0.1.0")
    deploy = tmp_path / "deploy"
    git(tmp_path, "clone", "--quiet", str(origin), str(deploy))
    shutil.copytree(origin / "wheels", deploy / "wheels", dirs_exist_ok=True)  # git-ignored
    project, volume = f"fvtest{uuid.uuid4().hex[:8]}", f"fv-test-compose-{uuid.uuid4().hex[:8]}"
    files = ["-p", project, "-f", "compose.yaml", "-f", "compose.fixture.yaml"]
    up = [*files, "up", "-d", "validator-fixture"]
    submissions = ["ok/a", "broken/b", "ok/cc", "ok/ddd"]  # two for each version
    with Simulator({"tasks": [task(1, submissions)]}, tmp_path) as sim:
        env = launcher_env(TASK_IDS="1", FLOCK_API_URL=sim.api_url, STATE_VOLUME=volume)
        try:
            started = compose(deploy, *up, env=env, timeout=600)
            assert started.returncode == 0, started.stdout + started.stderr
            compose(deploy, *files, "wait", "validator-fixture", env=env)
            before = sim.results_by_repo()
            assert sorted(r["status"] for r in before.values()) == ["completed", "failed"]
            # 1. Stop it.
            assert compose(deploy, *files, "stop", env=env).returncode == 0
            # The new version: the same version number, other code (a loss ten times larger).
            code = origin / "modules" / "fixture" / "__init__.py"
            code.write_text(
                code.read_text().replace("self.config.scale / 100", "self.config.scale / 10")
            )
            git(origin, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "v0.1.0+")
            # 2. Update the checkout (its host venv's `pip install` is tests/test_locks.py's).
            git(deploy, "pull", "--quiet")
            result, detail = doctor_row(deploy, env, "deployed images")
            assert result == "failed" and "not this checkout's" in detail, detail
            # 3. Start it again with the same command.
            started = compose(deploy, *up, env=env, timeout=600)
            assert started.returncode == 0, started.stdout + started.stderr
            compose(deploy, *files, "wait", "validator-fixture", env=env)
            after = sim.results_by_repo()
            result, detail = doctor_row(deploy, env, "deployed images")
        finally:
            compose(deploy, *files, "down", "--rmi", "local", env=env)
            engine.volumes.get(volume).remove(force=True)
            for image in engine.images.list(name="flock-validator-fixture"):
                if "flock-validator-fixture:compose-test" in image.tags:
                    engine.images.remove(image.id, force=True)
    assert (result, detail) == ("ok", "Compose validator-fixture, exited: this checkout")
    first, second = losses(before), losses(after)
    upgraded = {repo: loss for repo, loss in second.items() if repo not in first}
    assert len(first) == 1 and len(upgraded) == 2, (before, after)
    for repo, loss in first.items():
        assert loss == pytest.approx(len(repo) / 100)  # the old code
    for repo, loss in upgraded.items():
        assert loss == pytest.approx(len(repo) / 10)  # the new code, not the old image


def test_compose_up_validator_rl_runs_the_generated_service(engine, tmp_path):
    # Not a line of the rl service is written here but what stops it: no GPU runtime, no HF
    # token, and the default compose.yaml alone (rl reserves no GPU).
    repo = make_module_repo(tmp_path / "repo")
    # The image is run.py's: built once per run of the suite under its content-hash tag, which
    # `make demo` then finds and reuses; compose runs it as the generated service says.
    # (Compose's own build of a service's `build:` section: test_compose_up_completes_assignments.)
    build = launcher_env()
    spec = BuildSpec(
        "rl",
        repo,
        build["VALIDATOR_BASE_IMAGE"],
        build["VALIDATOR_ENV_INSTALLER"],
        build["VALIDATOR_PIP_OPTIONS"],
    )
    image = ensure_image(engine, spec)
    # What the image installed is its lock, every package at the lock's version (pip and the
    # venv's setuptools come with the base's Python, outside the lock).
    listed = engine.containers.run(
        image, ["-m", "pip", "list", "--format=json"], entrypoint=["python"], remove=True
    )
    installed = {canonicalize_name(p["name"]): p["version"] for p in json.loads(listed)}
    locked = entries((repo / "modules" / "rl" / "locks" / "cpu.txt").read_text())
    seeded = {"pip", "setuptools"} - set(locked)
    assert {name: v for name, v in installed.items() if name not in seeded} == locked
    (repo / "compose.rl-test.yaml").write_text(RL_OVERRIDE.replace("{image}", image))
    project, volume = f"fvtest{uuid.uuid4().hex[:8]}", f"fv-test-rl-{uuid.uuid4().hex[:8]}"
    files = ["-p", project, "-f", "compose.yaml", "-f", "compose.rl-test.yaml"]
    x, info = validation_arrays(64, 4, 2)
    with LocalHub(tmp_path / "hub") as hub:
        hub.add_repo("flock/sets", {"val.npz": npz_bytes(X=x, Info=info)})
        hub.add_repo("alice/policy", {"model.onnx": to_bytes(linear_policy(4, 2))})
        data = {"validation_set_url": f"{hub.endpoint}/flock/sets/resolve/main/val.npz"}
        submissions = ["alice/policy", "missing/policy"]
        with Simulator(
            {"tasks": [task(1, submissions, task_type="rl", max_params=100, **data)]}, tmp_path
        ) as sim:
            env = launcher_env(
                TASK_IDS="1",
                FLOCK_API_URL=sim.api_url,
                STATE_VOLUME=volume,
                HF_ENDPOINT=hub.endpoint,
            )
            del env["HF_TOKEN"]
            # The build is tagged with the service's released name: a name of this test's, so
            # that no later `run.py rl --pull` takes this CI build for a release.
            env["VALIDATOR_IMAGE_REGISTRY"] = f"localhost/{project}"
            try:
                result = compose(repo, *files, "up", "--no-build", "validator-rl", env=env)
                assert result.returncode == 0, result.stdout + result.stderr
                results = sim.results_by_repo()
            finally:
                compose(repo, *files, "down", env=env)
                engine.volumes.get(volume).remove(force=True)
                for image in engine.images.list(name=f"localhost/{project}/flock-validator-rl"):
                    engine.images.remove(image.id, force=True)
    assert results["alice/policy"]["status"] == "completed"
    assert isinstance(results["alice/policy"]["data"]["average_reward"], float)
    assert results["missing/policy"]["status"] == "failed"
