"""The real CLI as a subprocess against the Fed Ledger simulator as a separate process."""

from __future__ import annotations

import sqlite3

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import API_KEY, HF_TOKEN
from tests.faults import ledger


def journal_rows(tmp_path) -> dict[str, dict]:
    return ledger.journal_rows(tmp_path / "state")


def by_repo(sim: Simulator) -> dict[str, dict]:
    """Submitted results keyed by the submission's repo id."""
    repo_of = {
        a["id"]: a["task_submission"]["data"]["hg_repo_id"] for a in sim.state()["assignments"]
    }
    return {repo_of[s["assignment_id"]]: s for s in sim.submissions()}


def test_happy_path_over_several_tasks_round_robin(tmp_path, cli):
    tasks = [
        task(1, ["ok/a", "ok/bb"], context_length=4096),
        task(
            2,
            ["ok/ccc", {"data": {"hg_repo_id": "ok/dddd", "context_length": 1}}],
            context_length=2048,
        ),
        task(3, ["ok/eeeee"], context_length=512),
    ]
    with Simulator({"tasks": tasks}, tmp_path) as sim:
        result = cli.run(cli.args(sim.api_url, "1,2,3", "--max-assignments", "5"))
        assert result.returncode == 0, result.stderr
        submitted = by_repo(sim)
        assert set(submitted) == {"ok/a", "ok/bb", "ok/ccc", "ok/dddd", "ok/eeeee"}
        assert all(s["status"] == "completed" for s in submitted.values())
        assert submitted["ok/eeeee"]["data"] == {
            "loss": 0.08,
            "repo_length": 8,
            "context_length": 512,
        }
        # The assignment's data wins over the submission's on a clash.
        assert submitted["ok/dddd"]["data"]["context_length"] == 2048
        first_three = [lookup["path"].rsplit("/", 1)[1] for lookup in sim.lookups()[:3]]
        assert first_three == ["1", "2", "3"]
    rows = journal_rows(tmp_path)
    assert {row["state"] for row in rows.values()} == {"submitted"}


def test_an_unexpected_error_is_rescored_then_failed_after_three_attempts(tmp_path, cli):
    # A bug in the module (a TypeError) must neither stop the validator nor fail the submission
    # at once: it is logged with its traceback, the validator scores other assignments, and
    # the assignment is scored again after --time-sleep, then failed on the third attempt.
    bug = f"bug/{API_KEY}"  # the traceback carries the message: secrets are redacted there too
    tasks = [task(1, [bug, "ok/a"]), task(2, ["ok/b"])]
    with Simulator({"tasks": tasks}, tmp_path) as sim:
        args = cli.args(sim.api_url, "1,2", "--max-assignments", "3")
        args[args.index("--time-sleep") + 1] = "1.0"
        result = cli.run(args)
        assert result.returncode == 0, result.stderr
        submitted = by_repo(sim)
        order = [s["assignment_id"] for s in sim.submissions()]
    assert {repo: s["status"] for repo, s in submitted.items()} == {
        bug: "failed",
        "ok/a": "completed",
        "ok/b": "completed",
    }
    assert order[-1] == submitted[bug]["assignment_id"]  # the others did not wait for it
    row = journal_rows(tmp_path)[str(submitted[bug]["assignment_id"])]
    assert (row["state"], row["outcome"]) == ("submitted", "failed")
    assert row["attempts"] == 3
    assert row["error"].startswith(
        "unexpected error in the module after 3 attempts: TypeError: 'NoneType' object is not "
        "subscriptable"
    )
    stderr = result.stderr
    for attempt in (1, 2, 3):
        assert f"unexpected error in the module (attempt {attempt} of 3" in stderr
    assert stderr.count("Traceback (most recent call last)") == 3
    assert "in _buggy" in stderr  # the module's own frame
    assert "bug/***" in stderr and API_KEY not in stderr
    # Scored again after --time-sleep, not in a busy loop.
    with sqlite3.connect(tmp_path / "state" / "journal.sqlite3") as db:
        starts = [
            t
            for (t,) in db.execute(
                "SELECT time FROM events WHERE assignment_id = ? AND state = 'scoring'"
                " ORDER BY rowid",
                (row["id"],),
            )
        ]
    assert len(starts) == 3
    assert min(b - a for a, b in zip(starts, starts[1:], strict=False)) >= 0.95


def test_a_module_that_cannot_start_exits_3_and_fails_nothing(tmp_path, cli):
    # __init__ sees no submission: a bug there must not count against the assignments.
    cli.config({"broken_init": True})
    with Simulator({"tasks": [task(1, ["ok/x"])]}, tmp_path) as sim:
        args = cli.args(sim.api_url, "1", "--max-assignments", "1")
        result = cli.run(args)
        assert result.returncode == 3, result.stderr
        assert "module fixture cannot start: AttributeError: 'FixtureConfig'" in result.stderr
        assert "Traceback (most recent call last)" in result.stderr
        assert sim.submissions() == []
        row = journal_rows(tmp_path)["1"]
        assert (row["state"], row["attempts"]) == ("received", 0)  # kept, no attempt counted
        cli.config({})
        result = cli.run(args)
        assert result.returncode == 0, result.stderr
        assert [s["status"] for s in sim.submissions()] == ["completed"]


def test_invalid_config_exits_2_before_any_api_call(tmp_path, cli):
    path = cli.config({"scael": 2}, task_id="1")
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path) as sim:
        result = cli.run(cli.args(sim.api_url, "1"))
        assert result.returncode == 2
        assert f"{path}: unknown key 'scael'" in result.stderr
        assert sim.state()["requests"] == []


def test_kill_9_during_scoring_then_restart_scores_and_submits_once(tmp_path, cli):
    cli.config({"slow_seconds": 1.0, "marker_dir": str(tmp_path)})
    with Simulator({"tasks": [task(1, ["slow/a"])]}, tmp_path) as sim:
        args = cli.args(sim.api_url, "1", "--max-assignments", "1")
        process = cli.start(args, "v1.log")
        cli.wait_for(lambda: (tmp_path / "slow_a.started").exists(), 20, "scoring to start")
        process.kill()
        process.wait(10)
        assert journal_rows(tmp_path)["1"]["state"] == "scoring"
        result = cli.run(args)
        assert result.returncode == 0, result.stderr
        assert [(s["assignment_id"], s["status"]) for s in sim.submissions()] == [(1, "completed")]
        assert len(sim.state()["assignments"]) == 1
    row = journal_rows(tmp_path)["1"]
    assert (row["state"], row["attempts"]) == ("submitted", 2)


def test_rejected_api_key_exits_3(tmp_path, cli):
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path, api_key="the-right-key-123") as sim:
        result = cli.run(cli.args(sim.api_url, "1"))
    assert result.returncode == 3
    assert "refused the API key (HTTP 401" in result.stderr


def test_secrets_are_absent_from_all_logs_in_debug(tmp_path, cli):
    tasks = [task(1, ["ok/a", "broken/b"]), task(2, ["flaky/c"])]
    with Simulator({"tasks": tasks}, tmp_path, api_key=API_KEY) as sim:
        result = cli.run(cli.args(sim.api_url, "1,2", "--max-assignments", "3", "--debug"))
        assert result.returncode == 0, result.stderr
        assert len(sim.submissions()) == 3
    assert "DEBUG" in result.stderr
    sim_log = (tmp_path / "simulator.log").read_text()
    assert "request-validation-assignment" in sim_log
    journal_bytes = (tmp_path / "state" / "journal.sqlite3").read_bytes()
    for secret in (API_KEY, HF_TOKEN):
        assert secret not in result.stdout
        assert secret not in result.stderr
        assert secret not in sim_log
        assert secret.encode() not in journal_bytes
