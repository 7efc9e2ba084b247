"""The real CLI as a subprocess against the Fed Ledger simulator as a separate process."""

from __future__ import annotations

import signal
import sqlite3

import pytest

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import (
    API_KEY,
    HF_TOKEN,
    loop_args,
    run_validator,
    start_validator,
    validator_env,
    wait_for,
    write_config,
)
from tests.faults import ledger


def journal_rows(tmp_path) -> dict[str, dict]:
    return ledger.journal_rows(tmp_path / "state")


def by_repo(sim: Simulator) -> dict[str, dict]:
    """Submitted results keyed by the submission's repo id."""
    repo_of = {
        a["id"]: a["task_submission"]["data"]["hg_repo_id"] for a in sim.state()["assignments"]
    }
    return {repo_of[s["assignment_id"]]: s for s in sim.submissions()}


@pytest.fixture
def env(tmp_path):
    return validator_env(tmp_path)


def test_happy_path_over_several_tasks_round_robin(tmp_path, env):
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
        result = run_validator(
            loop_args("fixture", sim.api_url, "1,2,3", "--max-assignments", "5"), env
        )
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


def test_no_submissions_and_rate_limit_never_busy_loop(tmp_path, env):
    # The server allows one lookup per task per second; the validator is set to try every 0.2 s.
    with Simulator({"tasks": [task(1, []), task(2, [])]}, tmp_path, rate_limit_seconds=1) as sim:
        process = start_validator(loop_args("fixture", sim.api_url, "1,2"), env, tmp_path / "v.log")
        wait_for(lambda: len(sim.lookups()) >= 10, 20, "ten lookups")
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
        lookups = sim.lookups()
    statuses = {lookup["status"] for lookup in lookups}
    assert statuses == {400, 429}
    for task_id in ("1", "2"):
        times = [lk["time"] for lk in lookups if lk["path"].endswith(f"/{task_id}")]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert gaps and min(gaps) >= 0.18, gaps
    span = lookups[-1]["time"] - lookups[0]["time"]
    assert len(lookups) <= 2 * (span / 0.2 + 1) + 2
    assert "stopped by signal" in (tmp_path / "v.log").read_text()


def test_unexpected_answers_sleep_time_sleep(tmp_path, env):
    fault = {"endpoint": "request", "kind": "non_json", "status": 418, "count": None}
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path, faults=[fault]) as sim:
        args = loop_args("fixture", sim.api_url, "1")
        args[args.index("--time-sleep") + 1] = "1.0"
        process = start_validator(args, env, tmp_path / "v.log")
        wait_for(lambda: len(sim.lookups()) >= 2, 20, "two lookups")
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
        times = [lookup["time"] for lookup in sim.lookups()]
    assert min(b - a for a, b in zip(times, times[1:], strict=False)) >= 0.95
    assert "unexpected answer HTTP 418: <html>" in (tmp_path / "v.log").read_text()


def test_plain_exception_marks_the_assignment_failed(tmp_path, env):
    with Simulator({"tasks": [task(1, ["broken/x", "ok/y"])]}, tmp_path) as sim:
        result = run_validator(
            loop_args("fixture", sim.api_url, "1", "--max-assignments", "2"), env
        )
        assert result.returncode == 0, result.stderr
        submitted = by_repo(sim)
    assert submitted["broken/x"]["status"] == "failed"
    assert submitted["ok/y"]["status"] == "completed"
    assert "submitted as failed (rejected): ValueError: cannot load broken/x" in result.stderr


def test_submission_rejected_is_failed_at_once(tmp_path, env):
    with Simulator({"tasks": [task(1, ["rejected/x"])]}, tmp_path) as sim:
        result = run_validator(
            loop_args("fixture", sim.api_url, "1", "--max-assignments", "1"), env
        )
        assert result.returncode == 0, result.stderr
        assert [s["status"] for s in sim.submissions()] == ["failed"]
    row = journal_rows(tmp_path)["1"]
    assert (row["outcome"], row["attempts"]) == ("failed", 1)
    assert row["error"] == "SubmissionRejected: rejected/x has no adapter"
    assert "Traceback" not in result.stderr  # the submission's fault, not a bug


def test_an_unexpected_error_is_rescored_then_failed_after_three_attempts(tmp_path, env):
    # A bug in the module (a TypeError) must neither stop the validator nor fail the submission
    # at once: it is logged with its traceback, the validator scores other assignments, and
    # the assignment is scored again after --time-sleep, then failed on the third attempt.
    bug = f"bug/{API_KEY}"  # the traceback carries the message: secrets are redacted there too
    tasks = [task(1, [bug, "ok/a"]), task(2, ["ok/b"])]
    with Simulator({"tasks": tasks}, tmp_path) as sim:
        args = loop_args("fixture", sim.api_url, "1,2", "--max-assignments", "3")
        args[args.index("--time-sleep") + 1] = "1.0"
        result = run_validator(args, env)
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


def test_an_honest_submission_hit_once_by_a_bug_is_completed(tmp_path, env):
    with Simulator({"tasks": [task(1, ["glitch/x"])]}, tmp_path) as sim:
        result = run_validator(
            loop_args("fixture", sim.api_url, "1", "--max-assignments", "1"), env
        )
        assert result.returncode == 0, result.stderr
        assert [s["status"] for s in sim.submissions()] == ["completed"]
    row = journal_rows(tmp_path)["1"]
    assert (row["state"], row["outcome"], row["attempts"]) == ("submitted", "completed", 2)
    assert "unexpected error in the module (attempt 1 of 3, scoring it again in 0.3s)" in (
        result.stderr
    )


def test_recoverable_exception_exits_3_and_is_kept_for_after_the_fix(tmp_path, env):
    with Simulator({"tasks": [task(1, ["operator/x"])]}, tmp_path) as sim:
        args = loop_args("fixture", sim.api_url, "1", "--max-assignments", "1")
        result = run_validator(args, env)
        assert result.returncode == 3
        assert "disk full" in result.stderr
        assert sim.submissions() == []
        assert [a["status"] for a in sim.state()["assignments"]] == ["validating"]

        write_config(tmp_path, "fixture", {"operator_fixed": True})
        lookups_before = len(sim.lookups())
        result = run_validator(args, env)
        assert result.returncode == 0, result.stderr
        assert [s["status"] for s in sim.submissions()] == ["completed"]
        assert len(sim.lookups()) == lookups_before  # scored from the journal, not looked up again


def test_a_module_that_cannot_start_exits_3_and_fails_nothing(tmp_path, env):
    # __init__ sees no submission: a bug there must not count against the assignments.
    write_config(tmp_path, "fixture", {"broken_init": True})
    with Simulator({"tasks": [task(1, ["ok/x"])]}, tmp_path) as sim:
        args = loop_args("fixture", sim.api_url, "1", "--max-assignments", "1")
        result = run_validator(args, env)
        assert result.returncode == 3, result.stderr
        assert "module fixture cannot start: AttributeError: 'FixtureConfig'" in result.stderr
        assert "Traceback (most recent call last)" in result.stderr
        assert sim.submissions() == []
        row = journal_rows(tmp_path)["1"]
        assert (row["state"], row["attempts"]) == ("received", 0)  # kept, no attempt counted
        write_config(tmp_path, "fixture", {})
        result = run_validator(args, env)
        assert result.returncode == 0, result.stderr
        assert [s["status"] for s in sim.submissions()] == ["completed"]


def test_invalid_config_exits_2_before_any_api_call(tmp_path, env):
    path = write_config(tmp_path, "fixture", {"scael": 2}, task_id="1")
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path) as sim:
        result = run_validator(loop_args("fixture", sim.api_url, "1"), env)
        assert result.returncode == 2
        assert f"{path}: unknown key 'scael'" in result.stderr
        assert sim.state()["requests"] == []


def test_api_down_during_submit_then_back_submits_once(tmp_path, env):
    down = {"endpoint": "update", "kind": "status", "status": 503, "count": None}
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path, faults=[down]) as sim:
        process = start_validator(
            loop_args("fixture", sim.api_url, "1", "--max-assignments", "1"),
            env,
            tmp_path / "v.log",
        )
        wait_for(lambda: _faulted_updates(sim) >= 2, 20, "failed submits")
        assert journal_rows(tmp_path)["1"]["state"] == "scored"
        sim.clear_faults()
        assert process.wait(20) == 0
        assert [s["status"] for s in sim.submissions()] == ["completed"]
    assert journal_rows(tmp_path)["1"]["state"] == "submitted"


def test_unsubmitted_result_is_submitted_after_a_restart(tmp_path, env):
    down = {"endpoint": "update", "kind": "drop", "count": None}
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path, faults=[down]) as sim:
        args = loop_args("fixture", sim.api_url, "1", "--max-assignments", "1")
        process = start_validator(args, env, tmp_path / "v1.log")
        wait_for(lambda: _faulted_updates(sim) >= 1, 20, "a failed submit")
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
        assert sim.submissions() == []
        sim.clear_faults()
        lookups_before = len(sim.lookups())
        result = run_validator(args, env)
        assert result.returncode == 0, result.stderr
        assert [s["status"] for s in sim.submissions()] == ["completed"]
        assert len(sim.lookups()) == lookups_before


def test_kill_9_during_scoring_then_restart_scores_and_submits_once(tmp_path, env):
    write_config(tmp_path, "fixture", {"slow_seconds": 1.0, "marker_dir": str(tmp_path)})
    with Simulator({"tasks": [task(1, ["slow/a"])]}, tmp_path) as sim:
        args = loop_args("fixture", sim.api_url, "1", "--max-assignments", "1")
        process = start_validator(args, env, tmp_path / "v1.log")
        wait_for(lambda: (tmp_path / "slow_a.started").exists(), 20, "scoring to start")
        process.kill()
        process.wait(10)
        assert journal_rows(tmp_path)["1"]["state"] == "scoring"
        result = run_validator(args, env)
        assert result.returncode == 0, result.stderr
        assert [(s["assignment_id"], s["status"]) for s in sim.submissions()] == [(1, "completed")]
        assert len(sim.state()["assignments"]) == 1
    row = journal_rows(tmp_path)["1"]
    assert (row["state"], row["attempts"]) == ("submitted", 2)


def test_device_fault_exits_100_and_fails_after_three_attempts(tmp_path, env):
    with Simulator({"tasks": [task(1, ["cuda/x"])]}, tmp_path) as sim:
        args = loop_args("fixture", sim.api_url, "1", "--max-assignments", "1")
        for attempt in (1, 2, 3):
            result = run_validator(args, env)
            assert result.returncode == 100, result.stderr
            assert "device-side assert" in result.stderr
            assert journal_rows(tmp_path)["1"]["attempts"] == attempt
        assert sim.submissions() == []
        result = run_validator(args, env)
        assert result.returncode == 0, result.stderr
        assert [s["status"] for s in sim.submissions()] == ["failed"]


def test_transient_fault_is_retried_not_failed(tmp_path, env):
    with Simulator({"tasks": [task(1, ["flaky/x"])]}, tmp_path) as sim:
        result = run_validator(
            loop_args("fixture", sim.api_url, "1", "--max-assignments", "1"), env
        )
        assert result.returncode == 0, result.stderr
        assert [s["status"] for s in sim.submissions()] == ["completed"]
    assert "transient fault" in result.stderr


def test_late_submit_is_dropped_not_retried(tmp_path, env):
    write_config(tmp_path, "fixture", {"slow_seconds": 1.0, "marker_dir": str(tmp_path)})
    with Simulator({"tasks": [task(1, ["slow/a"])]}, tmp_path, assignment_ttl_seconds=0.3) as sim:
        result = run_validator(
            loop_args("fixture", sim.api_url, "1", "--max-assignments", "1"), env
        )
        assert result.returncode == 0, result.stderr
        assert sim.submissions() == []
        updates = [r for r in sim.state()["requests"] if "update-validation" in r["path"]]
        assert len(updates) == 1
    assert "not in validating status" in result.stderr
    assert journal_rows(tmp_path)["1"]["state"] == "dropped"


def test_rejected_api_key_exits_3(tmp_path, env):
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path, api_key="the-right-key-123") as sim:
        result = run_validator(loop_args("fixture", sim.api_url, "1"), env)
    assert result.returncode == 3
    assert "refused the API key (HTTP 401" in result.stderr


def test_secrets_are_absent_from_all_logs_in_debug(tmp_path, env):
    tasks = [task(1, ["ok/a", "broken/b"]), task(2, ["flaky/c"])]
    with Simulator({"tasks": tasks}, tmp_path, api_key=API_KEY) as sim:
        result = run_validator(
            loop_args("fixture", sim.api_url, "1,2", "--max-assignments", "3", "--debug"), env
        )
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


def _faulted_updates(sim: Simulator) -> int:
    return sum(
        1 for r in sim.state()["requests"] if "update-validation" in r["path"] and r["fault"]
    )
