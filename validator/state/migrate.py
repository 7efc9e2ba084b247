"""Migrating a journal of version 1 (or 0: written before the version was stored) to version
2's constraints (validator/state/store.py), in the transaction that opens it.

Every row is read whole as an entry (validator/state/entry.py) and copied; a row that is not
one, or that a constraint refuses, is set aside (validator/state/quarantine.py) rather than
lost; a scored row without metrics goes back to be scored. Version 1 marked a damaged row
`quarantined` in place: such a row is set aside with the reason it holds. The events are kept.
Version 1 wrote what an earlier submit try may have had taken into the error's text; it is read
out once, here, into the `maybe_taken` column.
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


def to_v2(db: sqlite3.Connection, schema: str) -> list[SetAside]:
    """Run inside an open transaction; returns what was set aside or scored again."""
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
