"""Damaged journal rows, each way a row can hold what the validator never writes: quarantined
(kept as they are, marked, explained), and the others read as before (issue 23, item 9). The
validator end to end against the simulator: tests/faults/test_damaged_rows.py."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from validator.state.journal import UNSUBMITTED, Journal, State

# column, value written over a scored row's, what the reason says
DAMAGE = [
    ("metrics", '{"loss": ', "metrics is not valid JSON"),
    ("metrics", "[1, 2]", "metrics is list, not a JSON object"),
    ("input", "NaN", "input is float, not a JSON object"),
    ("input", b"\xff\xfe", "input is not valid JSON"),
    ("attempts", "three", "attempts: Input should be a valid integer"),
    ("received_at", "yesterday", "received_at: Input should be a valid number"),
]


def scored_rows(state_dir: Path) -> Journal:
    journal = Journal(state_dir)
    for assignment_id in ("1", "2"):
        journal.receive(assignment_id, "lora", "7", {"hg_repo_id": f"u/{assignment_id}"})
        journal.begin_scoring(assignment_id)
        journal.scored(assignment_id, {"loss": 0.5})
    return journal


def raw_row(state_dir: Path, assignment_id: str) -> tuple:
    with sqlite3.connect(state_dir / "journal.sqlite3") as db:
        return db.execute("SELECT * FROM assignments WHERE id = ?", (assignment_id,)).fetchone()


@pytest.mark.parametrize(("column", "value", "reason"), DAMAGE, ids=[d[2] for d in DAMAGE])
def test_a_damaged_row_is_quarantined_and_kept(tmp_path, caplog, column, value, reason):
    state_dir = tmp_path / "state"
    journal = scored_rows(state_dir)
    with sqlite3.connect(state_dir / "journal.sqlite3") as db:
        db.execute(f"UPDATE assignments SET {column} = ? WHERE id = '1'", (value,))
    db.close()
    try:
        assert [entry.id for entry in journal.pending("lora", UNSUBMITTED)] == ["2"]
        entry = journal.get("1")
        assert entry is not None and entry.state is State.QUARANTINED
        assert reason in (entry.error or ""), entry.error
        assert journal.quarantined("lora") == ["1"] == journal.quarantined_now
        # Told once, in one line that names the id; read again, it is not quarantined again.
        assert journal.pending("lora", UNSUBMITTED)[0].id == "2"
        told = [r.getMessage() for r in caplog.records if "quarantined" in r.getMessage()]
        assert len(told) == 1 and "assignment 1 (scored)" in told[0], told
        assert "\n" not in told[0]
        row = raw_row(state_dir, "1")
        assert row[3] == "quarantined"
        columns = ["id", "module", "task_id", "state", "input", "metrics", "outcome", "error"]
        columns += ["attempts", "not_before", "received_at", "updated_at"]
        assert row[columns.index(column)] == value  # kept as it was
    finally:
        journal.close()
    # The next process finds it quarantined, and leaves it so.
    journal = Journal(state_dir)
    try:
        assert [entry.id for entry in journal.pending("lora", UNSUBMITTED)] == ["2"]
        assert journal.quarantined("lora") == ["1"] and journal.quarantined_now == []
    finally:
        journal.close()


def test_an_unknown_state_is_quarantined_when_the_row_is_read(tmp_path):
    state_dir = tmp_path / "state"
    journal = scored_rows(state_dir)
    try:
        with sqlite3.connect(state_dir / "journal.sqlite3") as db:
            db.execute("UPDATE assignments SET state = 'half-done' WHERE id = '1'")
        db.close()
        # The API hands it out again: the lookup's receive() reads the row.
        entry = journal.receive("1", "lora", "7", {"hg_repo_id": "u/1"})
        assert entry.state is State.QUARANTINED
        assert "state: Input should be" in (entry.error or "")
        assert journal.quarantined("lora") == ["1"]
    finally:
        journal.close()
