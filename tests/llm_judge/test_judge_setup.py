"""llm_judge's start-up checks: its judge texts and its judge endpoint are checked by
`check_setup`, which the validator runs before it asks for any assignment and the doctor runs
for its row: the same code. A setting that is missing stops the validator with exit 3 and no
lookup (what the Fed Ledger simulator heard); the doctor names it, and every other problem of
the judge's, in one row (an answer of the wrong shape or one that never ends too)."""

from __future__ import annotations

import json
import signal

import pytest
from click.testing import CliRunner

from devkit.judge_prompts import write_judge_source
from devkit.judge_server import LocalJudge
from devkit.simulator.process import Simulator, task
from devkit.validator_cli import loop_args, run_validator, start_validator, validator_env, wait_for
from tests.helpers.odd_server import TRICKLE, OddServer
from validator.doctor.command import main as doctor

KEY = "sk-judge-TEST-1234567890"
LOOKUP = "/api/v1/tasks/request-validation-assignment/12"


@pytest.fixture
def world(tmp_path):
    """A state and config dir whose llm_judge config reads local judge texts, and the
    environment of a validator."""
    source = write_judge_source(tmp_path / "judge-source")
    env = validator_env(tmp_path, OPENAI_API_KEY=KEY)
    env.pop("OPENAI_BASE_URL", None)
    config = {"supported_base_models": ["tiny/base"], "prompt_source": str(source)}
    (tmp_path / "configs" / "llm_judge.json").write_text(json.dumps(config))
    return tmp_path, env


def setup_row(env: dict[str, str], *args: str, row: str = "module setup") -> tuple[str, str]:
    """The doctor's `row` for llm_judge (its module row unless said), run in this process as
    the image runs it."""
    result = CliRunner().invoke(doctor, ["llm_judge", "--only", row, *args], env=env)
    assert "Traceback" not in result.output, result.output
    line = result.output.splitlines()[1]
    assert line.startswith(row), result.output
    found, _, text = line.removeprefix(row).strip().partition("  ")
    return found, text.strip()


def test_an_unset_judge_url_stops_the_validator_at_the_door(world):
    """Before, the validator took assignment 1 and stopped only when the module started; then
    its start-up checks named the URL, after a start that had named the keys. The door names it
    with every other missing setting (exit 2), and the doctor's settings row says the same."""
    tmp_path, env = world
    with Simulator({"tasks": [task(12, ["alice/model"], task_type="llm_judge")]}, tmp_path) as sim:
        args = loop_args("llm_judge", sim.api_url, "12", "--max-assignments", "1")
        result = run_validator(args, env, timeout=180)
        asked = sim.state()["requests"]
    assert result.returncode == 2, result.stderr
    said = "missing OPENAI_BASE_URL: the judge endpoint's URL, e.g. https://.../v1, for llm_judge"
    assert result.stderr.splitlines()[-1] == f"Error: {said} (only --check runs without it)"
    assert asked == []  # not a lookup, not even the task list
    found, text = setup_row(env, "--task_ids", "12", row="settings")
    assert found == "failed" and text.startswith(said + " -> "), text
    found, text = setup_row(env)  # the module's own check names it too
    assert found == "failed" and "missing OPENAI_BASE_URL" in text, text


def test_the_judge_rows_of_the_doctor_and_a_start_that_follows_a_green_one(world):
    tmp_path, env = world
    with (
        LocalJudge(["judge-a"], KEY) as judge,
        Simulator({"tasks": [task(12, [], task_type="llm_judge")]}, tmp_path) as sim,
    ):
        env = {**env, "OPENAI_BASE_URL": judge.endpoint}
        found, text = setup_row(env, "--judge-model", "judge-a")
        assert found == "ok" and f"{judge.endpoint} lists 1 models" in text
        found, text = setup_row(env, "--judge-model", "judge-zz")
        assert found == "failed" and "does not list the judge models judge-zz" in text
        found, text = setup_row({**env, "OPENAI_API_KEY": "sk-wrong-000000"})
        assert found == "failed" and "401" in text
        # Green: the validator starts and asks for work.
        process = start_validator(loop_args("llm_judge", sim.api_url, "12"), env, tmp_path / "log")
        try:
            wait_for(
                lambda: any(r["path"] == LOOKUP for r in sim.state()["requests"]),
                120,
                "the validator's first lookup",
            )
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)


def test_a_judge_listing_of_the_wrong_shape_or_that_never_ends_is_a_row(world):
    _, env = world
    with OddServer({"/v1/models": {"data": 5}, "/slow/v1/models": TRICKLE}) as odd:
        found, text = setup_row({**env, "OPENAI_BASE_URL": odd.root_url + "/v1"})
        assert found == "failed" and "GET /models answered something that is not a model list" in (
            text
        )
        env = {**env, "OPENAI_BASE_URL": odd.root_url + "/slow/v1"}
        assert setup_row(env, "--timeout", "2") == (
            "failed",
            "no answer within 2 s -> check the network and that server (a proxy, a firewall), "
            "then run the doctor again",
        )
