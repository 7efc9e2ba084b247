"""Migrating a journal of an earlier version to this one (validator/state/store.py), in the
transaction that opens it: `upgrade()`.

Version 1 (or 0: written before the version was stored) to version 2's constraints: `to_v2`,
which makes the current tables at once.

Every row is read whole as an entry (validator/state/entry.py) and copied; a row that is not
one, or that a constraint refuses, is set aside (validator/state/quarantine.py) rather than
lost; a scored row without metrics goes back to be scored. Version 1 marked a damaged row
`quarantined` in place: such a row is set aside with the reason it holds. The events are kept.
Version 1 wrote what an earlier submit try may have had taken into the error's text; it is read
out once, here, into the `maybe_taken` column.

Version 2 to 3: the penalty's columns are added in place. Whatever the version, a result
submitted as failed before version 3 gets its reason from the journal's event of the failure
(its `error` may since hold a submit try's words); its kind stays empty: not recorded then.
"""

from __future__ import annotations

import sqlite3

from validator.state.entry import V1_COLUMNS
from validator.state.quarantine import ROW_KEY, SetAside, set_aside, sift

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
    db.execute(FAILED_REASONS)
    return notes


def to_v2(db: sqlite3.Connection, schema: str) -> list[SetAside]:
    """Run inside an open transaction; returns what was set aside or scored again. `schema`
    makes the current tables: version 1's columns are copied, later ones left empty."""
    db.execute(f"ALTER TABLE assignments RENAME TO {OLD}")
    for statement in schema.split(";"):
        if statement.strip():
            db.execute(statement)
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
