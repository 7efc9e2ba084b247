"""Big journals made fast, for tests and the soak bench (bench/soak.py): a seed of assignments
written through the journal's own code (validator/state/journal.py) in the outcomes the validator
writes, then copied by SQL as many times as asked, each copy earlier in time, so that a million
rows take seconds rather than the hours their writes would.

Only the journal's public calls and the columns the file holds are used: the same code builds a
journal of an earlier validator's version when run against its checkout (the bench's "before").
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from validator.state.journal import Journal

JOURNAL_FILE = "journal.sqlite3"
MODULE = "fixture"
# Of SEED_CYCLE seed assignments of a task, one is a penalty submitted (-999, cannot_load), two
# are failures submitted (rejected), one a result dropped as too late; the rest are scores.
SEED_CYCLE = 20
FINISH_S = 20.0  # from received to finished


def seed_outcome(index: int) -> str:
    return {16: "penalty", 17: "failed", 18: "failed", 19: "dropped"}.get(
        index % SEED_CYCLE, "completed"
    )


def write_seed(state_dir: Path, count: int, *, tasks: int = 20, module: str = MODULE) -> None:
    """`count` finished assignments through the journal, ids s0.. (tasks 1..`tasks` in turn)."""
    journal = Journal(state_dir, min_free_mb=0)
    try:
        for index in range(count):
            data = {"hg_repo_id": f"ok/seed-{index}", "revision": "main", "context_length": 0}
            entry = journal.receive(f"s{index}", module, str(1 + index % tasks), data)
            entry = journal.begin_scoring(entry)
            outcome = seed_outcome(index // tasks)
            loss = (index % 97) / 97
            metrics = {"loss": loss, "repo_length": 12, "context_length": 0}
            if outcome == "penalty":
                reason = "the model cannot be loaded: score -999"
                penalty = ("cannot_load", reason)
                entry = journal.scored(entry, {**metrics, "loss": -999.0}, penalty)
            elif outcome == "completed" or outcome == "dropped":
                entry = journal.scored(entry, metrics)
            else:
                entry = journal.failed(entry, "ValueError: no adapter_config.json", "rejected")
            if outcome == "dropped":
                journal.dropped(entry, "the API no longer validates it")
            else:
                journal.submitted(entry)
    finally:
        journal.close()


def spread(state_dir: Path, copies: int, span_s: float, end: float | None = None) -> int:
    """The seed's rows and events spread evenly over the first of `copies` slots of `span_s`
    seconds ending at `end` (now), then copied into each earlier slot by SQL (ids `s<i>.<k>`):
    every row finished, as many as the seed times `copies`. Returns the rows the journal holds."""
    end = time.time() if end is None else end
    slot = span_s / copies
    db = sqlite3.connect(state_dir / JOURNAL_FILE, isolation_level=None)
    try:
        db.execute("PRAGMA synchronous = OFF")
        db.execute("BEGIN IMMEDIATE")
        seed = [row[0] for row in db.execute("SELECT id FROM assignments ORDER BY rowid")]
        step = slot / max(len(seed), 1)
        for index, assignment_id in enumerate(seed):
            at = end - slot + index * step
            moves = (at, at + FINISH_S, assignment_id)
            db.execute("UPDATE assignments SET received_at = ?, updated_at = ? WHERE id = ?", moves)
            db.execute("UPDATE events SET time = ? WHERE assignment_id = ?", (at, assignment_id))
        _copy(db, copies, slot)
        db.execute("COMMIT")
        return int(db.execute("SELECT count(*) FROM assignments").fetchone()[0])
    finally:
        db.close()


def _copy(db: sqlite3.Connection, copies: int, slot: float) -> None:
    columns = [row[1] for row in db.execute("PRAGMA table_info(assignments)")]
    shifted = {
        "id": "id || '.' || :k",
        "received_at": "received_at - :shift",
        "updated_at": "updated_at - :shift",
    }
    names = ", ".join(columns)
    values = ", ".join(shifted.get(column, column) for column in columns)
    # The seed is the first rows of each table: copied by rowid range, never by a scan.
    last_row = db.execute("SELECT max(rowid) FROM assignments").fetchone()[0]
    last_event = db.execute("SELECT max(rowid) FROM events").fetchone()[0]
    rows = (
        f"INSERT INTO assignments ({names}) SELECT {values} FROM assignments WHERE rowid <= :rows"
    )
    events = (
        "INSERT INTO events (assignment_id, time, state, note) SELECT assignment_id || '.' || :k,"
        " time - :shift, state, note FROM events WHERE rowid <= :events"
    )
    for k in range(1, copies):
        marks = {"k": k, "shift": k * slot, "rows": last_row, "events": last_event}
        db.execute(rows, marks)
        db.execute(events, marks)


def file_bytes(state_dir: Path) -> int:
    """The journal's bytes on disk, its write-ahead log included."""
    path = state_dir / JOURNAL_FILE
    wal = path.with_name(f"{path.name}-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
