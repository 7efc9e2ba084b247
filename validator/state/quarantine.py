"""Setting a damaged journal row aside, and sending a scored row without metrics back to be
scored: the two things the journal does with a row that is not an entry
(validator/state/entry.py), when it reads one and when it migrates an older store.

A set-aside row moves, as it was (SQLite copies the values, types and all), to the
`quarantine` table with the reason, in the same transaction that deletes it from
`assignments`: it is never scored or submitted, and `assignments` holds only rows the
validator can read.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass

from validator.state.entry import STORED_COLUMNS, DamagedRow, Entry, NoMetrics, State
from validator.text import bounded, one_line

ROW_KEY = "row_key"  # each SELECT of rows names SQLite's rowid so: an id may be NULL
SCORE_AGAIN = "scored without metrics in the journal: scored again"


@dataclass(frozen=True)
class SetAside:
    """What happened to a row that is not an entry, for one log line."""

    id: str  # as text, "None" for a NULL id
    was: str  # its state, as text
    reason: str
    scored_again: bool = False
    told_before: bool = False  # set aside by an earlier validator (version 1's mark)
    entry: Entry | None = None  # the entry of a row sent back to be scored, as it now is


def sift(db: sqlite3.Connection, table: str, row: sqlite3.Row) -> Entry | SetAside:
    """The row's entry; or, for a row that is not one, what was done with it (set aside, or
    sent back to be scored, in `db`'s open transaction)."""
    try:
        return Entry.from_row(row)
    except NoMetrics as exc:
        return score_again(db, table, row, exc.entry)
    except DamagedRow as exc:
        return set_aside(db, table, row, f"a damaged journal row: {exc}")


def set_aside(
    db: sqlite3.Connection, table: str, row: sqlite3.Row, reason: str, *, told: bool = False
) -> SetAside:
    now = time.time()
    was = _text(row["state"], 40)
    columns = ", ".join(c for c in STORED_COLUMNS if c in row.keys())  # earlier versions: fewer
    db.execute(
        f"INSERT INTO quarantine ({columns}, reason, set_aside_at)"
        f" SELECT {columns}, ?, ? FROM {table} WHERE rowid = ?",
        (reason, now, row[ROW_KEY]),
    )
    db.execute(f"DELETE FROM {table} WHERE rowid = ?", (row[ROW_KEY],))
    if isinstance(row["id"], str) and row["id"]:
        note = one_line(bounded(f"set aside: {reason}; it was {was}", 1000))
        _event(db, row["id"], "quarantined", note, now)
    return SetAside(_text(row["id"], 100), was, reason, told_before=told)


def score_again(db: sqlite3.Connection, table: str, row: sqlite3.Row, entry: Entry) -> SetAside:
    """Back to `received`, its attempts from 0: what was scored is lost, not the assignment.
    `entry` is the rest of the row, read as `received`."""
    now = time.time()
    db.execute(
        f"UPDATE {table} SET state = ?, metrics = NULL, attempts = 0, not_before = 0,"
        " error = ?, updated_at = ? WHERE rowid = ?",
        (State.RECEIVED.value, SCORE_AGAIN, now, row[ROW_KEY]),
    )
    _event(db, row["id"], State.RECEIVED.value, SCORE_AGAIN, now)
    changes = {"attempts": 0, "not_before": 0.0, "error": SCORE_AGAIN, "updated_at": now}
    again = entry.model_copy(update=changes)
    return SetAside(entry.id, State.SCORED.value, SCORE_AGAIN, scored_again=True, entry=again)


def _event(db: sqlite3.Connection, assignment_id: str, state: str, note: str, now: float) -> None:
    db.execute(
        "INSERT INTO events (assignment_id, time, state, note) VALUES (?, ?, ?, ?)",
        (assignment_id, now, state, note),
    )


def _text(value: object, limit: int) -> str:
    return one_line(bounded(value if isinstance(value, str) else str(value), limit))
