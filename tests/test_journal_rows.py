"""Damaged journal rows: the schema refuses each kind of damage; a row
damaged past it anyway is set aside when read (kept as it was in the `quarantine` table, one
line), a scored row without metrics is scored again, and the others are read as before. The
validator end to end against the simulator: tests/faults/test_damaged_rows.py and
test_untrusted_rows.py."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from validator.state.entry import UNDECIDED, UNSUBMITTED, State
from validator.state.journal import Journal

# column, value written over a scored row's, what the reason says
DAMAGE = [
    ("metrics", '{"loss": ', "metrics is not valid JSON"),
    ("metrics", "[1, 2]", "metrics is list, not a JSON object"),
    ("input", "NaN", "input is float, not a JSON object"),
    ("input", b"\xff\xfe", "input is bytes, not JSON text"),
    ("attempts", "three", "attempts: Input should be a valid integer"),
    ("received_at", "yesterday", "received_at: Input should be a valid number"),
    ("state", "half-done", "state: Input should be"),
    ("outcome", "maybe", "outcome: Input should be"),
    ("id", "", "id: String should have at least 1 character"),
]
COLUMNS = ["id", "module", "task_id", "state", "input", "metrics", "outcome", "error"]
COLUMNS += ["attempts", "not_before", "received_at", "updated_at", "maybe_taken"]


def scored_rows(state_dir: Path) -> Journal:
    journal = Journal(state_dir)
    for assignment_id in ("1", "2"):
        entry = journal.receive(assignment_id, "lora", "7", {"hg_repo_id": f"u/{assignment_id}"})
        journal.scored(journal.begin_scoring(entry), {"loss": 0.5})
    return journal


def damage(state_dir: Path, column: str, value: object, *, past_checks: bool) -> None:
    with sqlite3.connect(state_dir / "journal.sqlite3") as db:
        # As an operator's sqlite3 shell can: CHECK constraints off for this connection.
        db.execute(f"PRAGMA ignore_check_constraints = {int(past_checks)}")
        db.execute(f"UPDATE assignments SET {column} = ? WHERE id = '1'", (value,))
    db.close()


def set_aside(state_dir: Path) -> list[tuple]:
    with sqlite3.connect(state_dir / "journal.sqlite3") as db:
        rows = db.execute("SELECT * FROM quarantine").fetchall()
    db.close()
    return rows


REFUSED = [(c, v) for c, v, _ in DAMAGE if c not in ("metrics", "input")]
REFUSED += [("id", None), ("metrics", None), ("input", b"{}")]


@pytest.mark.parametrize(("column", "value"), REFUSED, ids=[f"{c}={v!r}" for c, v in REFUSED])
def test_the_schema_refuses_a_row_the_validator_never_writes(tmp_path, column, value):
    journal = scored_rows(tmp_path / "state")
    journal.close()
    with pytest.raises(sqlite3.IntegrityError):
        damage(tmp_path / "state", column, value, past_checks=False)


@pytest.mark.parametrize(("column", "value", "reason"), DAMAGE, ids=[d[2] for d in DAMAGE])
def test_a_row_damaged_past_the_checks_is_set_aside_when_read(
    tmp_path, caplog, column, value, reason
):
    state_dir = tmp_path / "state"
    journal = scored_rows(state_dir)
    damage(state_dir, column, value, past_checks=True)
    try:
        assert [entry.id for entry in journal.pending("lora", UNSUBMITTED)] == ["2"]
        assert journal.get("1") is None
        [row] = set_aside(state_dir)
        assert reason in row[len(COLUMNS)], row
        assert row[COLUMNS.index(column)] == value  # kept as it was
        assert row[COLUMNS.index("state")] == ("half-done" if column == "state" else "scored")
        expected = [value if column == "id" else "1"]
        assert journal.quarantined() == expected == journal.quarantined_now
        # Told once, in one line that names it; read again, nothing more.
        assert journal.pending("lora", UNSUBMITTED)[0].id == "2"
        told = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
        assert len(told) == 1 and f"assignment {expected[0]} (" in told[0], told
        assert "\n" not in told[0]
    finally:
        journal.close()
    # The next process finds it set aside, and leaves it so.
    journal = Journal(state_dir)
    try:
        assert [entry.id for entry in journal.pending("lora", UNSUBMITTED)] == ["2"]
        assert journal.quarantined() == expected and journal.quarantined_now == []
        # Handed out again, it is not taken up: it is the operator's.
        if column != "id":
            assert journal.receive("1", "lora", "7", {"hg_repo_id": "u/1"}) is None
            assert journal.pending("lora", UNDECIDED) == []
    finally:
        journal.close()


def test_a_scored_row_without_metrics_is_scored_again_not_submitted(tmp_path, caplog):
    state_dir = tmp_path / "state"
    journal = scored_rows(state_dir)
    entry = journal.begin_scoring(journal.get("1"))  # a second attempt: scored again from 0
    journal.scored(entry, {"loss": 0.5})
    damage(state_dir, "metrics", None, past_checks=True)
    try:
        assert [entry.id for entry in journal.pending("lora", UNSUBMITTED)] == ["2"]
        [entry] = journal.pending("lora", UNDECIDED)
        assert (entry.id, entry.state, entry.metrics, entry.attempts) == (
            "1",
            State.RECEIVED,
            None,
            0,
        )
        assert "scored again" in (entry.error or "")
        assert set_aside(state_dir) == []
        told = [r.getMessage() for r in caplog.records if "metrics are missing" in r.getMessage()]
        assert len(told) == 1 and "assignment 1 " in told[0], told
    finally:
        journal.close()


def test_an_unknown_state_is_told_when_the_pending_rows_are_read(tmp_path, caplog):
    """It used to be passed over without a word: no query asked for its state."""
    state_dir = tmp_path / "state"
    journal = scored_rows(state_dir)
    damage(state_dir, "state", "half-done", past_checks=True)
    try:
        assert journal.pending("lora", UNDECIDED) == []
        assert journal.quarantined() == ["1"]
        told = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
        assert len(told) == 1 and "assignment 1 (half-done)" in told[0], told
    finally:
        journal.close()
