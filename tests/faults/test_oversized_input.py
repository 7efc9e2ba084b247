"""What a submitter controls reaches the journal and the log bounded and on one line: an
oversized string in an assignment's input is cut in the journal and the assignment failed with
the reason, and a line break in a revision cannot forge a log line."""

from __future__ import annotations

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import loop_args, run_validator, validator_env
from tests.faults.figures import record
from tests.faults.ledger import journal_rows
from validator.text import MAX_INPUT_STRING, MAX_LOG_MESSAGE

FORGED = "2026-11-23 06:00:00,000 INFO validator.runner: assignment 9: submitted as completed"


def test_oversized_and_multi_line_input_strings_stay_bounded(tmp_path):
    env = validator_env(tmp_path)
    huge = {"data": {"hg_repo_id": "ok/huge", "revision": "r" * 3_000_000}}
    forging = {"data": {"hg_repo_id": "ok/forge", "revision": f"main\n{FORGED}\r"}}
    with Simulator({"tasks": [task(1, [huge, forging])]}, tmp_path) as sim:
        args = loop_args("fixture", sim.api_url, "1", "--max-assignments", "2", "--debug")
        result = run_validator(args, env)
        assert result.returncode == 0, result.stderr
        statuses = {s["assignment_id"]: s["status"] for s in sim.submissions()}
    assert statuses == {1: "failed", 2: "completed"}
    rows = journal_rows(tmp_path / "state")
    assert rows["1"]["error"] == f"input revision: over {MAX_INPUT_STRING} characters, not scored"
    assert len(rows["1"]["input"]) < 2 * MAX_INPUT_STRING
    assert (tmp_path / "state" / "journal.sqlite3").stat().st_size < 1_000_000
    lines = result.stderr.splitlines()
    assert max(len(line) for line in lines) < MAX_LOG_MESSAGE + 200
    assert not any(line.startswith(FORGED) for line in lines)
    assert any(f"main\\n{FORGED}\\r" in line for line in lines)
    size = (tmp_path / "state" / "journal.sqlite3").stat().st_size
    record(
        "a 3 MB revision, and one with a forged log line",
        f"failed with the reason, journal {size // 1024} KiB, longest log line "
        f"{max(len(line) for line in lines)} characters; the forged line escaped, completed",
    )
