"""Migrating a journal of an earlier version to this one (validator/state/store.py), in the
transaction that opens it: `upgrade()`. Each version's step, and why each costs what the journal
holds, not its square: docs/internals.md, "The journal's migrations".
"""

from __future__ import annotations

import json
import sqlite3

from validator.state.entry import V1_COLUMNS, score_of
from validator.state.quarantine import ROW_KEY, SetAside, set_aside, sift
from validator.state.schema import V4_STATEMENTS

OLD = "assignments_v1"
_COLUMNS = ", ".join(V1_COLUMNS)
# How version 1's error of a kept result started when a submit try may have reached the API,
# and what it appended for each later try.
V1_MAYBE_TAKEN = "submit, maybe taken by the API: "
V1_LATER = "; then: "


V3_ASSIGNMENT_COLUMNS = (
    "penalty_kind TEXT CHECK (penalty_kind IS NULL OR typeof(penalty_kind) = 'text')",
    "penalty TEXT CHECK (penalty IS NULL OR typeof(penalty) = 'text')",
)
V3_QUARANTINE_COLUMNS = ("penalty_kind", "penalty")
V4_ASSIGNMENT_COLUMNS = (
    "metric TEXT CHECK (metric IS NULL OR typeof(metric) = 'text')",
    "score REAL CHECK (score IS NULL OR typeof(score) = 'real')",
)
V4_QUARANTINE_COLUMNS = ("metric", "score")
# The main metric and its value of every row with metrics, by the journal's own rule (score_of).
FILL_SCORES = """
UPDATE assignments SET metric = main_metric(metrics), score = main_score(metrics)
WHERE metrics IS NOT NULL
"""
# The reason of a failure, from its event: the journal writes it there as it fails the result.
FAILED_REASONS = """
UPDATE assignments SET penalty = (
    SELECT note FROM events
    WHERE events.assignment_id = assignments.id AND events.state = 'failed'
    ORDER BY events.rowid DESC LIMIT 1
)
WHERE penalty IS NULL AND (state = 'failed' OR (state = 'submitted' AND outcome = 'failed'))
"""


def upgrade(db: sqlite3.Connection, version: int, schema: str) -> list[SetAside]:
    """A journal of `version` to this one's `schema`, inside an open transaction; returns what
    was set aside or scored again."""
    notes = to_v2(db, schema) if version < 2 else []
    if version == 2:
        for column in V3_ASSIGNMENT_COLUMNS:
            db.execute(f"ALTER TABLE assignments ADD COLUMN {column}")
        for column in V3_QUARANTINE_COLUMNS:
            db.execute(f"ALTER TABLE quarantine ADD COLUMN {column}")
    if version in (2, 3):
        for column in V4_ASSIGNMENT_COLUMNS:
            db.execute(f"ALTER TABLE assignments ADD COLUMN {column}")
        for column in V4_QUARANTINE_COLUMNS:
            db.execute(f"ALTER TABLE quarantine ADD COLUMN {column}")
    run_script(db, V4_STATEMENTS)  # the events' index first: FAILED_REASONS looks them up by it
    if version < 3:
        db.execute(FAILED_REASONS)
    register_scores(db)
    db.execute(FILL_SCORES)
    return notes


def run_script(db: sqlite3.Connection, script: str) -> None:
    """Each statement of `script` in the open transaction (executescript would commit it)."""
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def register_scores(db: sqlite3.Connection) -> None:
    """main_metric(metrics) and main_score(metrics) in `db`'s SQL: the journal's score_of on a
    metrics column's text (NULL where it is not a JSON object with a number)."""

    def parsed(text: object) -> tuple[str | None, float | None]:
        try:
            metrics = json.loads(text) if isinstance(text, str) else None
        except (ValueError, RecursionError):
            return None, None
        return score_of(metrics) if isinstance(metrics, dict) else (None, None)

    db.create_function("main_metric", 1, lambda text: parsed(text)[0], deterministic=True)
    db.create_function("main_score", 1, lambda text: parsed(text)[1], deterministic=True)


def to_v2(db: sqlite3.Connection, schema: str) -> list[SetAside]:
    """Run inside an open transaction; returns what was set aside or scored again. `schema`
    makes the current tables: version 1's columns are copied, later ones left empty."""
    db.execute(f"ALTER TABLE assignments RENAME TO {OLD}")
    run_script(db, schema)
    notes: list[SetAside] = []
    rows = db.execute(
        f"SELECT rowid AS {ROW_KEY}, * FROM {OLD} ORDER BY received_at, rowid"
    ).fetchall()
    for row in rows:
        if row["state"] == "quarantined":
            reason = row["error"] if isinstance(row["error"], str) else "quarantined"
            notes.append(set_aside(db, OLD, row, reason, told=True))
            continue
        found = sift(db, OLD, row)
        if isinstance(found, SetAside):
            notes.append(found)
            if not found.scored_again:
                continue
        db.execute("SAVEPOINT copy")
        try:
            db.execute(
                f"INSERT INTO assignments ({_COLUMNS}) SELECT {_COLUMNS} FROM {OLD}"
                " WHERE rowid = ?",
                (row[ROW_KEY],),
            )
        except sqlite3.IntegrityError as exc:
            # What the model let through and a constraint did not: kept all the same.
            db.execute("ROLLBACK TO copy")
            notes.append(set_aside(db, OLD, row, f"a damaged journal row: {exc}"))
        db.execute("RELEASE copy")
    for assignment_id, error in db.execute(
        "SELECT id, error FROM assignments WHERE substr(error, 1, ?) = ?",
        (len(V1_MAYBE_TAKEN), V1_MAYBE_TAKEN),
    ).fetchall():
        taken = error[len(V1_MAYBE_TAKEN) :].split(V1_LATER)[0]
        db.execute("UPDATE assignments SET maybe_taken = ? WHERE id = ?", (taken, assignment_id))
    db.execute(f"DROP TABLE {OLD}")
    return notes
