"""Settings reach the module and the kit as a run context (validator/run_context.py), never
through an os.environ the validator writes itself: the options win over their
variables in the context, the process's environment stays as the operator gave it, and the
kit's Hub calls send the run's token."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from devkit.validator_cli import run_validator, validator_env, write_config
from tests.helpers.served_hub import served_hub
from validator.errors import ConfigError, OperatorError
from validator.kit import RunContext, current_run
from validator.kit.base_models import fetch_base_model
from validator.options import HF_CACHE_BUDGET_ENV, STATE_DIR_ENV
from validator.run_context import running


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def test_options_reach_the_module_as_a_run_context_and_the_environment_is_left_alone(
    tmp_path: Path,
) -> None:
    env = validator_env(tmp_path)
    for name in ("HF_TOKEN", STATE_DIR_ENV, HF_CACHE_BUDGET_ENV):
        env.pop(name, None)  # given as options only: the old entrypoint copied them into env
    write_config(tmp_path, "fixture", {"marker_dir": str(tmp_path)})
    request = tmp_path / "input.json"
    request.write_text(json.dumps({"hg_repo_id": "context/a"}))
    state = tmp_path / "flag-state"
    token = "hf_FLAGtoken0987654321"
    result = run_validator(
        ["fixture", "--check", str(request), "--state-dir", str(state),
         "--hf-cache-max-gb", "2.5", "--hf-token", f"  {token}\n"],
        env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    seen = json.loads((tmp_path / "run-context.json").read_text())
    assert seen["state_dir"] == str(state)
    assert seen["hf_cache_budget_bytes"] == 2_500_000_000
    assert seen["hf_token"] == digest(token)  # stripped, as it is used and redacted
    # The scoring ran in a process whose environment is exactly the one it was started with.
    assert seen["environ"] == {name: digest(value) for name, value in env.items()}


def test_outside_a_run_the_context_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(HF_CACHE_BUDGET_ENV, "3")
    monkeypatch.setenv("OPENAI_API_KEY", " sk-key ")
    run = current_run()
    assert (run.state_dir, run.hf_cache_budget_bytes()) == (tmp_path, 3 * 10**9)
    assert run.secret("OPENAI_API_KEY") == "sk-key"
    with running(RunContext(tmp_path / "given", None, {"HF_TOKEN": "hf_x"})):
        given = current_run()
        assert (given.state_dir, given.hf_cache_budget_bytes()) == (tmp_path / "given", None)
        assert given.secret("OPENAI_API_KEY") is None  # a run's secrets are the ones it gathered
        assert given.secret("HF_TOKEN") == "hf_x"
        assert "hf_x" not in repr(given)
    assert current_run().state_dir == tmp_path
    monkeypatch.setenv(HF_CACHE_BUDGET_ENV, "lots")
    with pytest.raises(ConfigError, match=f"{HF_CACHE_BUDGET_ENV}='lots'"):
        current_run()


def test_the_kits_hub_calls_send_the_runs_token(tmp_path: Path) -> None:
    with served_hub(tmp_path) as hub:  # HF_TOKEN is not in this process's environment
        hub.add_repo("org/gated", {"config.json": b"{}", "model.safetensors": b"x"})
        hub.require_token("org/gated", "hf_RUNtoken")
        with pytest.raises(OperatorError, match="gated"):
            fetch_base_model("org/gated")
        with running(RunContext(secrets={"HF_TOKEN": "hf_RUNtoken"})):
            snapshot = fetch_base_model("org/gated")
        assert (snapshot / "config.json").read_text() == "{}"
