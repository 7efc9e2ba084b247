"""Compacting the journal: finished rows older than the retention window become the counts and
scores the report needs (the `history` table), and leave `assignments` with their events.

A row is compacted only when it is final (submitted or dropped) and finished before the cutoff:
an unfinished row is never read here, whatever its age. Each step is one transaction of at most
STEP_ROWS rows read (validator/state/upkeep.py runs it): a crash keeps either the rows or their
counts, never both or neither. Rows are read in the order they were written (rowid), each step
from where the last one stopped, to the table's end: a run reads what it compacts and the window
it keeps, never a row twice.

`history` holds, per hour of the finish, task, outcome (completed, failed, dropped), penalty
kind ('' none, 'unrecorded' for a failure journaled before kinds were) and main metric ('' for
no score): the count, and the scores' count, sum, min and max; `history_totals` the same for all
hours (what the report adds up, a few rows). What they do not keep: each assignment's id, input,
metrics, reason and events.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

from validator.state.schema import HISTORY_KEY, HOUR, IS_SCORE

STEP_ROWS = 1000
# The outcome as the report names it (validator/state/records.py outcome_label), for final rows.
OUTCOME = "CASE WHEN state = 'submitted' THEN coalesce(outcome, 'submitted') ELSE state END"
KIND = "CASE WHEN penalty IS NULL THEN '' ELSE coalesce(penalty_kind, 'unrecorded') END"


def _roll_up(table: str, hour: bool) -> str:
    """The upsert of a step's rows into `table`: `history` by hour, `history_totals` without."""
    key = f"hour, {HISTORY_KEY}" if hour else HISTORY_KEY
    return f"""
INSERT INTO {table} ({key}, count, scores, score_sum, score_min, score_max)
SELECT {f"{HOUR}, " if hour else ""}coalesce(CAST(task_id AS TEXT), '?'), {OUTCOME}, {KIND},
    CASE WHEN {IS_SCORE} THEN coalesce(metric, '') ELSE '' END,
    count(*), count(CASE WHEN {IS_SCORE} THEN score END),
    total(CASE WHEN {IS_SCORE} THEN score END),
    min(CASE WHEN {IS_SCORE} THEN score END), max(CASE WHEN {IS_SCORE} THEN score END)
FROM assignments WHERE rowid IN (SELECT value FROM json_each(:rows))
GROUP BY {", ".join(str(i) for i in range(1, 6 if hour else 5))}
ON CONFLICT ({key}) DO UPDATE SET
    count = count + excluded.count,
    scores = scores + excluded.scores,
    score_sum = score_sum + excluded.score_sum,
    score_min = coalesce(min(score_min, excluded.score_min), score_min, excluded.score_min),
    score_max = coalesce(max(score_max, excluded.score_max), score_max, excluded.score_max)
"""


_ROLL_UPS = (_roll_up("history", hour=True), _roll_up("history_totals", hour=False))
_EVENTS = """
DELETE FROM events WHERE assignment_id IN (
    SELECT id FROM assignments WHERE rowid IN (SELECT value FROM json_each(:rows))
)
"""
_ROWS = "DELETE FROM assignments WHERE rowid IN (SELECT value FROM json_each(:rows))"


@dataclass(frozen=True)
class Step:
    compacted: int
    after: int  # the last rowid read: the next step starts after it
    done: bool  # the run reached the table's end


def step(db: sqlite3.Connection, cutoff: float, after: int, limit: int = STEP_ROWS) -> Step:
    """One step, in `db`'s open transaction: the final rows finished before `cutoff` among the
    next `limit` rows after rowid `after`, rolled up into `history` and deleted with their
    events."""
    if not db.in_transaction:
        db.execute("BEGIN IMMEDIATE")  # what is read is what is deleted
    rows = db.execute(
        "SELECT rowid, state, updated_at FROM assignments WHERE rowid > ? ORDER BY rowid LIMIT ?",
        (after, limit),
    ).fetchall()
    chosen = [
        rowid
        for rowid, state, updated_at in rows
        if state in ("submitted", "dropped") and _time(updated_at) < cutoff
    ]
    if chosen:
        marks = {"rows": json.dumps(chosen)}
        for roll_up in _ROLL_UPS:
            db.execute(roll_up, marks)
        db.execute(_EVENTS, marks)
        db.execute(_ROWS, marks)
    return Step(len(chosen), rows[-1][0] if rows else after, len(rows) < limit)


def _time(value: object) -> float:
    """A time column as a number; a damaged one (text, NULL) as NaN, which is never before the
    cutoff: its row is left alone."""
    return float(value) if isinstance(value, (int, float)) else float("nan")


@dataclass(frozen=True)
class Space:
    page_size: int
    pages: int
    free_pages: int  # pages the file holds that no row uses (SQLite's freelist)
    incremental: bool  # auto_vacuum=INCREMENTAL: free pages can be given back bit by bit

    @property
    def used_bytes(self) -> int:
        return (self.pages - self.free_pages) * self.page_size


def space(db: sqlite3.Connection) -> Space:
    def pragma(name: str) -> int:
        return int(db.execute(f"PRAGMA {name}").fetchone()[0])

    return Space(
        pragma("page_size"), pragma("page_count"), pragma("freelist_count"),
        pragma("auto_vacuum") == 2,
    )  # fmt: skip


def give_back(db: sqlite3.Connection, pages: int) -> None:
    """Up to `pages` free pages given back to the file system (the file truncated): a file made
    with auto_vacuum=INCREMENTAL, in a bounded step. As a script: Python's sqlite3 steps a
    statement without result columns once, which frees one page."""
    db.executescript(f"PRAGMA incremental_vacuum({int(pages)});")


def cut_log(db: sqlite3.Connection) -> None:
    """The write-ahead log, which a run's steps grew, cut back to nothing where no reader holds
    it (a reader's snapshot keeps it until the next checkpoint)."""
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


def rewrite(db: sqlite3.Connection) -> None:
    """The whole file written anew without its free pages (VACUUM), as one that gives them back
    bit by bit from then on; the write-ahead log it grew to is cut back. Outside a transaction:
    SQLite's VACUUM takes none. Needs free room for what the rows use, twice: the copy SQLite
    makes in its temporary directory and the log in the state dir (upkeep.py checks both)."""
    db.execute("PRAGMA auto_vacuum = INCREMENTAL")
    db.execute("VACUUM")
    cut_log(db)
