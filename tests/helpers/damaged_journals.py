"""Journals damaged as the fault suite damages them, in place: each damage and what the
journal's refusal of it says (tests/test_journal_move.py, tests/faults/test_moves.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from validator.state.store import SCHEMA_VERSION


def truncated(journal: Path) -> None:
    """Cut to half its length, as a journal that has worked a while is: its history (events)
    fills the pages after its schema, so the cut takes some of those. (A journal just created
    ends with its schema's last pages: any cut there leaves nothing SQLite can read.)"""
    with sqlite3.connect(journal) as db:
        (assignment,) = db.execute("SELECT id FROM assignments LIMIT 1").fetchone()
        db.executemany(
            "INSERT INTO events (assignment_id, time, state, note) VALUES (?, 0, 'received', ?)",
            [(assignment, "x" * 1000)] * 200,
        )
    db.close()
    data = journal.read_bytes()
    journal.write_bytes(data[: len(data) // 2])


def newer_schema(journal: Path) -> None:
    with sqlite3.connect(journal) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()


def null_id(journal: Path) -> None:
    """A row with a NULL id in a journal of this schema, which refuses one: written with the
    column's constraint taken out of the schema for the insert, then put back."""
    with sqlite3.connect(journal) as db:
        sql = db.execute("SELECT sql FROM sqlite_master WHERE name = 'assignments'").fetchone()[0]
        loose = sql.replace(
            "id TEXT PRIMARY KEY NOT NULL CHECK (typeof(id) = 'text' AND id <> '')",
            "id TEXT PRIMARY KEY",
        )
        assert loose != sql
        db.execute("PRAGMA writable_schema = ON")
        db.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'assignments'", (loose,))
    db.close()
    with sqlite3.connect(journal) as db:
        db.execute(
            "INSERT INTO assignments (id, module, task_id, state, input, metrics, received_at,"
            " updated_at) VALUES (NULL, 'fixture', '1', 'scored', '{}', '{}', 1.0, 1.0)"
        )
        db.execute("PRAGMA writable_schema = ON")
        db.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'assignments'", (sql,))
    db.close()


DAMAGES = {
    "truncated": (truncated, "malformed"),
    "newer schema": (newer_schema, f"schema version {SCHEMA_VERSION + 1} is newer"),
    "NULL id": (null_id, "NULL value in assignments.id"),
}
