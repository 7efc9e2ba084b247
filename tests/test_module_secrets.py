"""Secrets per module: a validator asks for the core's key and the secrets its module's spec
declares, no other; a module's secret reaches the validator only as an env var, the module
through the run context (`current_run().secret`), and is never logged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import API_KEY, loop_args, run_validator, validator_env
from launcher.commands.image_choice import ImageChoice
from launcher.commands.launch import Launch
from launcher.engine.containers import ContainerSpec
from launcher.errors import UsageError
from validator.spec import ModuleSpec

JUDGE_KEY = "sk-judge-TEST-0a1b2c3d4e"
SECRETIVE_SPEC = """\
name: secretive
secrets:
  JUDGE_API_KEY: the judge's API key
"""
# Scores a submission by the length of the key it finds in the run context, and logs the key,
# as a careless module might: the validator's redaction must still keep it out of the logs.
SECRETIVE_MODULE = """\
import logging

from validator.kit import current_run
from validator.kit.base import BaseInputData, BaseMetrics, BaseValidationModule


class Metrics(BaseMetrics):
    key_length: int


class Secretive(BaseValidationModule):
    metrics_schema = Metrics
    task_type = "training"

    def validate(self, data: BaseInputData) -> Metrics:
        key = current_run().secret("JUDGE_API_KEY")
        logging.getLogger(__name__).info("judging with %s", key)
        return Metrics(key_length=len(key))


MODULE = Secretive
"""


@pytest.fixture
def env(tmp_path):
    """The validator's environment with a second modules/ folder holding `secretive`."""
    extra = tmp_path / "extra"
    module = extra / "modules" / "secretive"
    module.mkdir(parents=True)
    (module / "__init__.py").write_text(SECRETIVE_MODULE)
    (module / "module.yaml").write_text(SECRETIVE_SPEC)
    base = validator_env(tmp_path)
    return {**base, "PYTHONPATH": os.pathsep.join([base["PYTHONPATH"], str(extra)])}


def test_a_module_that_declares_no_secret_runs_without_an_hf_token(tmp_path, env):
    del env["HF_TOKEN"]
    with Simulator({"tasks": [task(1, ["ok/abc"])]}, tmp_path) as sim:
        result = run_validator(
            loop_args("fixture", sim.api_url, "1", "--max-assignments", "1"), env
        )
        assert result.returncode == 0, result.stderr
        assert [s["status"] for s in sim.submissions()] == ["completed"]


def test_lora_still_requires_its_hf_token(env):
    del env["HF_TOKEN"]
    result = run_validator(["lora", "--task_ids", "1"], env)
    assert result.returncode == 2
    assert "missing --hf-token / HF_TOKEN: HuggingFace token" in result.stderr
    assert ", for lora (only --check runs without it)" in result.stderr


def test_a_declared_secret_that_is_missing_is_a_usage_error_naming_it(env):
    result = run_validator(["secretive", "--task_ids", "1"], env)
    assert result.returncode == 2
    assert "missing JUDGE_API_KEY: the judge's API key, for secretive" in result.stderr


def test_a_malformed_declared_secret_is_refused_without_its_value(env):
    env["JUDGE_API_KEY"] = JUDGE_KEY + "\u201d"
    result = run_validator(["secretive", "--task_ids", "1"], env)
    assert result.returncode == 2
    assert "JUDGE_API_KEY contains a non-ASCII character" in result.stderr
    assert JUDGE_KEY not in result.stderr


def test_a_declared_secret_reaches_the_module_stripped_and_is_never_logged(tmp_path, env):
    env["JUDGE_API_KEY"] = f"  {JUDGE_KEY}\r\n"  # as copied from a Windows .env file
    with Simulator({"tasks": [task(1, ["ok/abc"])]}, tmp_path) as sim:
        args = loop_args("secretive", sim.api_url, "1", "--max-assignments", "1", "--debug")
        result = run_validator(args, env)
        assert result.returncode == 0, result.stderr
        [submission] = sim.submissions()
    assert submission["data"] == {"key_length": len(JUDGE_KEY)}
    assert "judging with ***" in result.stderr
    # A module reading os.environ (the earlier API) gets the value as given: said at start-up.
    assert "JUDGE_API_KEY has surrounding whitespace: used stripped" in result.stderr
    for secret in (JUDGE_KEY, API_KEY):
        assert secret not in result.stdout + result.stderr


# --- the launcher's side: what the container is given ------------------------------------------


def options(**given) -> Launch:
    image = ImageChoice(
        image=None,
        rebuild=False,
        pull=False,
        release_channel="https://github.com/FLock-io/flock-validator",
        registry="ghcr.io/flock-io",
        base_image="local/base:bookworm",
        env_installer="pip",
        pip_options="",
        lock="cpu",
    )
    defaults = dict(
        passthrough=[],
        module="secretive",
        image=image,
        gpus=None,
        gpus_per_worker=None,
        workers=None,
        plan=False,
        build_only=False,
        follow_releases=False,
        config_dir=Path("configs"),
        state_volume=None,
        hf_cache_volume=None,
        network="host",
        restart_delay=1.0,
        stop_timeout=None,
        task_ids="1",
        flock_api_key=API_KEY,
        hf_token="hf_TESTnotforthismodule",
        check_file=None,
    )
    return Launch(**{**defaults, **given})


def container(spec: ModuleSpec, launch: Launch) -> ContainerSpec:
    return launch.container(spec, "flock-validator-test:1")


def test_the_launcher_passes_declared_secrets_as_env_only(monkeypatch):
    monkeypatch.setenv("JUDGE_API_KEY", f" {JUDGE_KEY} ")
    spec = ModuleSpec(name="secretive", secrets={"JUDGE_API_KEY": "the judge's API key"})
    kwargs = container(spec, options()).run_kwargs()
    # Beside the secrets, what the status page's report calls the state: its volume.
    assert kwargs["environment"] == {
        "FLOCK_API_KEY": API_KEY,
        "JUDGE_API_KEY": JUDGE_KEY,
        "VALIDATOR_STATE_SOURCE": "volume flock-validator-secretive-state",
    }
    assert not any(JUDGE_KEY in part or API_KEY in part for part in kwargs["command"])
    assert kwargs["device_requests"] == []  # gpu: false in the spec


def test_the_launcher_refuses_a_missing_declared_secret_before_building(monkeypatch):
    monkeypatch.delenv("JUDGE_API_KEY", raising=False)
    spec = ModuleSpec(name="secretive", secrets={"JUDGE_API_KEY": "the judge's API key"})
    with pytest.raises(UsageError, match="missing JUDGE_API_KEY: the judge's API key"):
        container(spec, options())


def test_the_launcher_gives_the_hf_token_and_cache_only_where_declared():
    lora = ModuleSpec(
        name="lora", secrets={"HF_TOKEN": "token"}, volumes={"hf-cache": "/data/hf-cache"}
    )
    launch = options(module="lora", hf_cache_volume="my-cache")
    mounts = container(lora, launch).run_kwargs()["volumes"]
    assert mounts["my-cache"] == {"bind": "/data/hf-cache", "mode": "rw"}
    assert mounts["flock-validator-lora-state"] == {"bind": "/data/state", "mode": "rw"}
    bare = container(ModuleSpec(name="bare"), options(module="bare")).run_kwargs()
    assert "HF_TOKEN" not in bare["environment"]
    assert set(bare["volumes"]) == {str(Path("configs").resolve()), "flock-validator-bare-state"}
