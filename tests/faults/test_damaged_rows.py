"""One damaged row does not stop the validator, and bad state paths are the operator's to fix:
the real CLI against the Fed Ledger simulator.

A row whose `metrics` or `input` is no longer valid JSON (edited by hand, a bad restore) is
quarantined: set aside byte for byte in the journal's `quarantine` table, named with its id in
one log line and in `python -m validator report`, and the rest of the work goes on (each kind
of damaged row, on a store of the earlier schema: test_untrusted_rows.py). A directory
where the journal file should be, or a file where the state dir should be, stops the validator
with exit 3 and one line, no traceback, before any API call. (A journal the whole of which is
broken or locked: test_broken_journal.py.)
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import (
    REPO_ROOT,
    loop_args,
    run_validator,
    start_validator,
    validator_env,
    wait_for,
)
from tests.faults.figures import record
from tests.faults.ledger import journal_notes, journal_rows, quarantine_rows

NOT_JSON = '{"loss": 0.25, "accuracy"'
# Submits fail (not processed by the API) until cleared: results stay `scored` in the journal.
SUBMITS_FAIL = {"endpoint": "update", "kind": "status", "status": 503}


def the_one_error(output: str) -> str:
    errors = [line for line in output.splitlines() if " ERROR " in line]
    assert len(errors) == 1, output
    assert "Traceback" not in output
    return errors[0]


def scored_but_not_submitted(sim: Simulator, tmp_path: Path, count: int) -> dict[str, str]:
    """Runs the validator until `count` results wait in the journal as `scored`, then stops it;
    returns the assignment ids by repo."""
    state = tmp_path / "state"
    validator = start_validator(
        loop_args("fixture", sim.api_url, "1"), validator_env(tmp_path), tmp_path / "v1.log"
    )

    def all_scored() -> bool:
        try:
            return [r["state"] for r in journal_rows(state).values()] == ["scored"] * count
        except sqlite3.OperationalError:  # the journal's tables are not created yet
            return False

    try:
        wait_for(all_scored, 60, f"{count} scored results")
    finally:
        validator.send_signal(signal.SIGTERM)
        assert validator.wait(30) == 0, (tmp_path / "v1.log").read_text()
    assert sim.submissions() == []
    return {json.loads(r["input"])["hg_repo_id"]: i for i, r in journal_rows(state).items()}


@pytest.mark.parametrize("column", ["metrics", "input"])
def test_a_damaged_row_is_quarantined_and_the_rest_is_scored_and_submitted(tmp_path, column):
    state = tmp_path / "state"
    with Simulator({"tasks": [task(1, ["ok/a", "ok/b"])]}, tmp_path, faults=[SUBMITS_FAIL]) as sim:
        ids = scored_but_not_submitted(sim, tmp_path, 2)
        damaged = ids["ok/a"]
        with sqlite3.connect(state / "journal.sqlite3") as db:
            db.execute(f"UPDATE assignments SET {column} = ? WHERE id = ?", (NOT_JSON, damaged))
        db.close()
        before = journal_rows(state)[damaged]
        sim.clear_faults()
        sim.add_submission(1, {"hg_repo_id": "ok/c"})  # new work, looked up and scored

        args = loop_args("fixture", sim.api_url, "1", "--max-assignments", "2")
        result = run_validator(args, validator_env(tmp_path))
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        results = sim.results_by_repo()
        # The others: ok/b's kept result submitted, ok/c looked up, scored and submitted.
        assert sorted(results) == ["ok/b", "ok/c"], results
        assert {r["status"] for r in results.values()} == {"completed"}
        # The damaged row: set aside, every column as it was, explained.
        assert damaged not in journal_rows(state)
        [row] = quarantine_rows(state)
        assert {key: row[key] for key in before} == before
        assert row[column] == NOT_JSON
        assert f"{column} is not valid JSON" in row["reason"], row
        assert "it was scored" in journal_notes(state, damaged)[-1]
        told = [line for line in result.stderr.splitlines() if "set aside" in line]
        assert len(told) == 1 and f"assignment {damaged}" in told[0], result.stderr
        assert "\n" not in told[0]

        # A restart is not stopped either, and reminds the operator in one line.
        sim.add_submission(1, {"hg_repo_id": "ok/d"})
        args = loop_args("fixture", sim.api_url, "1", "--max-assignments", "1")
        again = run_validator(args, validator_env(tmp_path))
        assert again.returncode == 0, again.stderr
        assert "Traceback" not in again.stderr
        assert sorted(sim.results_by_repo()) == ["ok/b", "ok/c", "ok/d"]
        reminder = [line for line in again.stderr.splitlines() if "quarantined" in line]
        assert len(reminder) == 1 and damaged in reminder[0], again.stderr
        assert quarantine_rows(state)[0][column] == NOT_JSON
        assert len(sim.submissions()) == 3  # the damaged row's result never went out

    report = subprocess.run(
        [sys.executable, "-m", "validator", "report", "--state-dir", str(state)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode == 0, report.stderr
    assert "quarantined" in report.stdout
    assert f"assignment {damaged} (task 1): quarantined" in report.stdout, report.stdout
    record(
        f"a scored row's {column} made invalid JSON",
        "quarantined (kept, 1 log line, in the report); the other 3 scored and submitted, exit 0",
    )


def test_a_directory_in_place_of_the_journal_is_one_operator_error(tmp_path):
    (tmp_path / "state" / "journal.sqlite3").mkdir(parents=True)
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path) as sim:
        result = run_validator(loop_args("fixture", sim.api_url, "1"), validator_env(tmp_path))
        assert result.returncode == 3, result.stderr
        line = the_one_error(result.stderr)
        assert f"{tmp_path / 'state' / 'journal.sqlite3'} is not a file" in line, line
        assert sim.state()["requests"] == []  # not even the task list
    assert (tmp_path / "state" / "journal.sqlite3").is_dir()
    record("a directory in place of the journal", "exit 3, one line, 0 API calls")


def test_a_file_in_place_of_the_state_dir_is_one_operator_error(tmp_path):
    (tmp_path / "state").write_text("not a directory\n")
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path) as sim:
        result = run_validator(loop_args("fixture", sim.api_url, "1"), validator_env(tmp_path))
        assert result.returncode == 3, result.stderr
        line = the_one_error(result.stderr)
        assert f"state directory {tmp_path / 'state'} cannot be used" in line, line
        assert sim.state()["requests"] == []
    assert (tmp_path / "state").read_text() == "not a directory\n"
    record("a file in place of the state dir", "exit 3, one line, 0 API calls")


def test_a_directory_in_place_of_the_journals_wal_is_one_operator_error(tmp_path):
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path) as sim:
        args = loop_args("fixture", sim.api_url, "1", "--max-assignments", "1")
        assert run_validator(args, validator_env(tmp_path)).returncode == 0
        (tmp_path / "state" / "journal.sqlite3-wal").mkdir()
        calls = len(sim.state()["requests"])
        result = run_validator(loop_args("fixture", sim.api_url, "1"), validator_env(tmp_path))
        assert result.returncode == 3, result.stderr
        line = the_one_error(result.stderr)
        assert f"journal {tmp_path / 'state' / 'journal.sqlite3'}" in line, line
        assert len(sim.state()["requests"]) == calls
    record("a directory in place of the journal's -wal file", "exit 3, one line, 0 API calls")
