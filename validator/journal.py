"""A SQLite journal of assignments, so that no result is lost to a crash or an API outage.

An assignment moves received -> scoring -> scored | failed -> submitted, or -> dropped when the
API will never take it. `scored` and `failed` are decided but not yet submitted; `received` and
`scoring` are not yet decided. Whatever is not final when the process dies is picked up by the
next process on the same state directory.
"""

from __future__ import annotations

import fcntl
import json
import sqlite3
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from validator.exceptions import ConfigError

SCHEMA = """
CREATE TABLE IF NOT EXISTS assignments (
    id TEXT PRIMARY KEY,
    module TEXT NOT NULL,
    task_id TEXT NOT NULL,
    state TEXT NOT NULL,
    input TEXT NOT NULL,
    metrics TEXT,
    outcome TEXT,
    error TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    not_before REAL NOT NULL DEFAULT 0,
    received_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    assignment_id TEXT NOT NULL,
    time REAL NOT NULL,
    state TEXT NOT NULL,
    note TEXT
);
"""


class State(str, Enum):
    RECEIVED = "received"
    SCORING = "scoring"
    SCORED = "scored"
    FAILED = "failed"
    SUBMITTED = "submitted"
    DROPPED = "dropped"


UNDECIDED = (State.RECEIVED, State.SCORING)
UNSUBMITTED = (State.SCORED, State.FAILED)


@dataclass(frozen=True)
class Entry:
    id: str
    module: str
    task_id: str
    state: State
    input: dict[str, Any]
    metrics: dict[str, Any] | None
    outcome: str | None
    error: str | None
    attempts: int
    not_before: float
    received_at: float

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Entry:
        return cls(
            id=row["id"],
            module=row["module"],
            task_id=row["task_id"],
            state=State(row["state"]),
            input=json.loads(row["input"]),
            metrics=json.loads(row["metrics"]) if row["metrics"] is not None else None,
            outcome=row["outcome"],
            error=row["error"],
            attempts=row["attempts"],
            not_before=row["not_before"],
            received_at=row["received_at"],
        )


class Journal:
    """One process at a time owns a state directory (an exclusive lock file)."""

    def __init__(self, state_dir: Path) -> None:
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            self._lock = open(state_dir / "validator.lock", "w")  # noqa: SIM115 - held for life
        except OSError as exc:
            raise ConfigError(f"state directory {state_dir} is not writable: {exc}") from exc
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self._lock.close()
            raise ConfigError(
                f"state directory {state_dir} is in use by another validator process; "
                "give each validator its own --state-dir"
            ) from exc
        self.path = state_dir / "journal.sqlite3"
        self._db = sqlite3.connect(self.path)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        self._db.close()
        self._lock.close()

    def get(self, assignment_id: str) -> Entry | None:
        row = self._db.execute(
            "SELECT * FROM assignments WHERE id = ?", (assignment_id,)
        ).fetchone()
        return Entry.from_row(row) if row else None

    def receive(self, assignment_id: str, module: str, task_id: str, data: dict) -> Entry:
        """Record a new assignment; an id seen before keeps its recorded state."""
        now = time.time()
        with self._db:
            inserted = self._db.execute(
                "INSERT OR IGNORE INTO assignments (id, module, task_id, state, input,"
                " received_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (assignment_id, module, task_id, State.RECEIVED.value, json.dumps(data), now, now),
            ).rowcount
            if inserted:
                self._event(assignment_id, State.RECEIVED, f"task {task_id}", now)
        entry = self.get(assignment_id)
        assert entry is not None
        return entry

    def begin_scoring(self, assignment_id: str) -> Entry:
        self._move(assignment_id, State.SCORING, attempts_delta=1)
        entry = self.get(assignment_id)
        assert entry is not None
        return entry

    def scored(self, assignment_id: str, metrics: dict[str, Any]) -> None:
        self._move(assignment_id, State.SCORED, metrics=json.dumps(metrics), error=None)

    def failed(self, assignment_id: str, reason: str) -> None:
        self._move(assignment_id, State.FAILED, error=reason)

    def postpone(self, assignment_id: str, reason: str, not_before: float) -> None:
        """Back to `received` for a later retry; this attempt does not count as a crash."""
        self._move(
            assignment_id,
            State.RECEIVED,
            error=reason,
            not_before=not_before,
            attempts_delta=-1,
        )

    def defer_submit(self, assignment_id: str, reason: str, not_before: float) -> None:
        with self._db:
            self._db.execute(
                "UPDATE assignments SET error = ?, not_before = ?, updated_at = ? WHERE id = ?",
                (reason, not_before, time.time(), assignment_id),
            )

    def submitted(self, assignment_id: str) -> None:
        entry = self.get(assignment_id)
        outcome = "completed" if entry and entry.state is State.SCORED else "failed"
        self._move(assignment_id, State.SUBMITTED, outcome=outcome, note=outcome)

    def dropped(self, assignment_id: str, reason: str) -> None:
        self._move(assignment_id, State.DROPPED, error=reason)

    def pending(self, module: str, states: tuple[State, ...]) -> list[Entry]:
        """Entries of `module` in `states`, oldest first, whether due or not."""
        marks = ",".join("?" * len(states))
        rows = self._db.execute(
            f"SELECT * FROM assignments WHERE module = ? AND state IN ({marks})"
            " ORDER BY received_at, id",
            (module, *(s.value for s in states)),
        ).fetchall()
        return [Entry.from_row(row) for row in rows]

    def events(self, assignment_id: str) -> list[tuple[str, str | None]]:
        rows = self._db.execute(
            "SELECT state, note FROM events WHERE assignment_id = ? ORDER BY rowid",
            (assignment_id,),
        ).fetchall()
        return [(row["state"], row["note"]) for row in rows]

    def _move(
        self,
        assignment_id: str,
        state: State,
        *,
        note: str | None = None,
        attempts_delta: int = 0,
        **columns: Any,
    ) -> None:
        now = time.time()
        sets = ["state = ?", "updated_at = ?", "attempts = MAX(attempts + ?, 0)"]
        params: list[Any] = [state.value, now, attempts_delta]
        for column, value in columns.items():
            sets.append(f"{column} = ?")
            params.append(value)
        if state in (State.SCORING, State.SCORED, State.FAILED, State.SUBMITTED):
            sets.append("not_before = 0")
        with self._db:
            self._db.execute(
                f"UPDATE assignments SET {', '.join(sets)} WHERE id = ?", (*params, assignment_id)
            )
            self._event(assignment_id, state, note or columns.get("error"), now)

    def _event(self, assignment_id: str, state: State, note: str | None, now: float) -> None:
        self._db.execute(
            "INSERT INTO events (assignment_id, time, state, note) VALUES (?, ?, ?, ?)",
            (assignment_id, now, state.value, note),
        )
