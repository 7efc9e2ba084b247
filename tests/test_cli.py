"""The command line, run as a subprocess: usage errors, unknown modules, `--check`, and the
module and task ids from the environment (how a module's image runs as a pod)."""

import json

import pytest

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import (
    API_KEY,
    HF_TOKEN,
    run_validator,
    validator_env,
    write_config,
)


@pytest.fixture
def env(tmp_path):
    return validator_env(tmp_path)


def write_input(tmp_path, **fields):
    path = tmp_path / "input.json"
    path.write_text(json.dumps(fields))
    return str(path)


def test_unknown_module_is_one_line_listing_the_modules(env):
    result = run_validator(["nosuch", "--task_ids", "1"], env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "unknown module 'nosuch'" in lines[0]
    assert "fixture" in lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task_ids", "1", "--time-sleep", "soon"], "Invalid value for '--time-sleep'"),
        (["--task_ids", "1", "--assignment-lookup-interval", "0"], "is not in the range"),
        (["--task_ids", "1,,2"], "has an empty task id"),
        (["--task_ids", "12,abc"], "'abc' is not a task id: give the Fed Ledger's task ids"),
        (["--task_ids", "0"], "'0' is not a task id"),
        (["--task_ids", "1", "--max-assignments", "0"], "Invalid value for '--max-assignments'"),
        ([], "missing --task_ids"),
        (["--task_ids", "1", "--config-dir", "/no/such/dir"], "'/no/such/dir' does not exist"),
    ],
)
def test_bad_options_are_usage_errors(env, args, message):
    result = run_validator(["fixture", *args], env)
    assert result.returncode == 2
    assert message in result.stderr


def test_missing_key_is_a_usage_error(tmp_path):
    env = validator_env(tmp_path)
    del env["FLOCK_API_KEY"]
    result = run_validator(["fixture", "--task_ids", "1"], env)
    assert result.returncode == 2
    assert "missing --flock-api-key / FLOCK_API_KEY" in result.stderr


def test_check_prints_metrics_as_last_stdout_line(tmp_path, env):
    write_config(tmp_path, "fixture", {"scale": 2.0})
    result = run_validator(
        ["fixture", "--check", write_input(tmp_path, hg_repo_id="ok/abcd", context_length=9)], env
    )
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    assert metrics == {"loss": 7 * 2.0 / 100, "repo_length": 7, "context_length": 9}


def test_check_reports_a_submission_that_would_fail(tmp_path, env):
    result = run_validator(
        ["fixture", "--check", write_input(tmp_path, hg_repo_id="broken/x")], env
    )
    assert result.returncode == 1
    assert "would be marked failed: ValueError: cannot load broken/x" in result.stderr
    assert result.stdout == ""


def test_check_reports_a_rejected_submission_without_a_traceback(tmp_path, env):
    result = run_validator(
        ["fixture", "--check", write_input(tmp_path, hg_repo_id="rejected/x")], env
    )
    assert result.returncode == 1
    assert "would be marked failed: SubmissionRejected: rejected/x has no adapter" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_check_reports_an_unexpected_error_with_its_traceback(tmp_path, env):
    result = run_validator(["fixture", "--check", write_input(tmp_path, hg_repo_id="bug/x")], env)
    assert result.returncode == 1
    assert (
        "unexpected error in the module: TypeError: 'NoneType' object is not subscriptable "
        "(while scoring bug/x); validators score it again, up to 3 attempts in all, then mark "
        "it failed" in result.stderr
    )
    assert "Traceback (most recent call last)" in result.stderr
    assert "would be marked failed" not in result.stderr
    assert result.stdout == ""


def test_check_with_a_module_that_cannot_start_exits_3(tmp_path, env):
    write_config(tmp_path, "fixture", {"broken_init": True})
    result = run_validator(["fixture", "--check", write_input(tmp_path, hg_repo_id="ok/x")], env)
    assert result.returncode == 3
    assert "operator action needed: module fixture cannot start: AttributeError" in result.stderr
    assert "Traceback (most recent call last)" in result.stderr


def test_check_with_input_missing_a_field_is_a_usage_error(tmp_path, env):
    result = run_validator(["fixture", "--check", write_input(tmp_path, revision="main")], env)
    assert result.returncode == 2
    assert "hg_repo_id" in result.stderr


def test_check_with_operator_problem_exits_3(tmp_path, env):
    result = run_validator(
        ["fixture", "--check", write_input(tmp_path, hg_repo_id="operator/x")], env
    )
    assert result.returncode == 3
    assert "operator action needed: disk full" in result.stderr


def test_check_with_invalid_config_exits_2_naming_file_and_key(tmp_path, env):
    path = write_config(tmp_path, "fixture", {"scale": "big"})
    result = run_validator(["fixture", "--check", write_input(tmp_path, hg_repo_id="ok/x")], env)
    assert result.returncode == 2
    assert f"{path}: key 'scale'" in result.stderr


def test_check_needs_no_key_or_token(tmp_path):
    env = validator_env(tmp_path)
    del env["FLOCK_API_KEY"], env["HF_TOKEN"]
    result = run_validator(["fixture", "--check", write_input(tmp_path, hg_repo_id="ok/x")], env)
    assert result.returncode == 0, result.stderr


def test_missing_check_file_is_a_usage_error(tmp_path, env):
    result = run_validator(["fixture", "--check", str(tmp_path / "absent.json")], env)
    assert result.returncode == 2
    assert "absent.json: cannot be read" in result.stderr


def test_secrets_never_reach_the_output_of_a_failing_check(tmp_path, env):
    result = run_validator(
        ["fixture", "--debug", "--check", write_input(tmp_path, hg_repo_id=f"broken/{API_KEY}")],
        env,
    )
    assert result.returncode == 1
    assert "broken/***" in result.stderr
    for secret in (API_KEY, HF_TOKEN):
        assert secret not in result.stderr + result.stdout


def test_module_and_task_ids_come_from_the_environment(tmp_path):
    env = validator_env(tmp_path, VALIDATOR_MODULE="fixture", TASK_IDS="1")
    with Simulator({"tasks": [task(1, ["ok/abc"]), task(2, ["ok/x"])]}, tmp_path) as sim:
        result = run_validator(
            ["--api-url", sim.api_url, "--max-assignments", "1", "--time-sleep", "0.3"], env
        )
        assert result.returncode == 0, result.stderr
        assert [s["status"] for s in sim.submissions()] == ["completed"]
        assert {lookup["path"].rsplit("/", 1)[1] for lookup in sim.lookups()} == {"1"}


@pytest.mark.parametrize(
    ("args", "env_change", "message"),
    [
        (["nosuch", "--task_ids", "1"], {"VALIDATOR_MODULE": "fixture"}, "unknown module 'nosuch'"),
        (["--task_ids", "1"], {"VALIDATOR_MODULE": "nosuch"}, "unknown module 'nosuch'"),
        (["--task_ids", "1"], {}, "Missing argument 'MODULE'"),
        ([], {"VALIDATOR_MODULE": "fixture", "TASK_IDS": "1,,2"}, "has an empty task id"),
        ([], {"VALIDATOR_MODULE": "fixture", "TASK_IDS": "12, x7"}, "'x7' is not a task id"),
        ([], {"VALIDATOR_MODULE": "fixture", "TASK_IDS": ""}, "missing --task_ids / TASK_IDS"),
    ],
)
def test_environment_defaults_give_way_to_the_command_line_and_are_checked(
    tmp_path, args, env_change, message
):
    result = run_validator(args, validator_env(tmp_path, **env_change))
    assert result.returncode == 2
    assert message in result.stderr
