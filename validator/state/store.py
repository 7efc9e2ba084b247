"""Opening the journal's SQLite file: one owner, checked before any lookup, never overwritten.

A journal that SQLite cannot read (not a database, truncated, malformed) or whose schema is not
this validator's stops the process with exit code 3 and a message that names the file and says
what to do; the file is only read until it has passed the checks, so that what it still holds
can be recovered by hand. The checks at start cost the same whatever the journal holds (its
header, its tables' columns, its version); SQLite's check of every page (`whole=True`) is the
doctor's, the daily upkeep's (validator/state/upkeep.py) and a caller's that is handed a journal.
A lock held by another program (an `sqlite3` shell in a write transaction) is waited for, up to
a bound, before the process gives up with exit code 3; no assignment is looked up meanwhile.

One process at a time owns a journal: the lock on its state dir (validator/state/owner.py).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Literal, TypeVar

from validator.errors import (
    SQLITE_BUSY,
    SQLITE_CANTOPEN,
    SQLITE_CORRUPT,
    SQLITE_LOCKED,
    SQLITE_NOTADB,
    SQLITE_READONLY,
    ConfigError,
    JournalBroken,
    JournalLocked,
    JournalUnwritable,
    sqlite_result,
)
from validator.state import migrate
from validator.state.quarantine import SetAside
from validator.state.schema import V4_STATEMENTS

T = TypeVar("T")

# Version 2's tables. Since version 2, a row that does not hold what this validator writes is
# refused by SQLite itself (NOT NULL, CHECK); the JSON columns' contents are checked when read
# (validator/state/entry.py: metrics may hold NaN and Infinity, as the network submits them,
# which SQLite's JSON is not). A row damaged past these anyway (an operator's PRAGMA
# ignore_check_constraints) is still set aside when read. `quarantine` keeps set-aside rows as
# they were, without types or constraints. A later version adds its columns at {assignments}
# and {quarantine}, the tables' ends, where migrating adds them in place (validator/state/
# migrate.py); it never edits these, which are version 2's as journals of version 2 hold them.
_V2_TABLES = """
CREATE TABLE IF NOT EXISTS assignments (
    id TEXT PRIMARY KEY NOT NULL CHECK (typeof(id) = 'text' AND id <> ''),
    module TEXT NOT NULL CHECK (typeof(module) = 'text'),
    task_id TEXT NOT NULL CHECK (typeof(task_id) = 'text'),
    state TEXT NOT NULL
        CHECK (state IN ('received', 'scoring', 'scored', 'failed', 'submitted', 'dropped')),
    input TEXT NOT NULL CHECK (typeof(input) = 'text'),
    metrics TEXT CHECK (metrics IS NULL OR typeof(metrics) = 'text'),
    outcome TEXT CHECK (outcome IS NULL OR outcome IN ('completed', 'failed')),
    error TEXT CHECK (error IS NULL OR typeof(error) = 'text'),
    attempts INTEGER NOT NULL DEFAULT 0 CHECK (typeof(attempts) = 'integer' AND attempts >= 0),
    not_before REAL NOT NULL DEFAULT 0 CHECK (typeof(not_before) = 'real'),
    received_at REAL NOT NULL CHECK (typeof(received_at) = 'real'),
    updated_at REAL NOT NULL CHECK (typeof(updated_at) = 'real'),
    -- what an earlier submit try met that the API may have taken, its answer lost
    maybe_taken TEXT CHECK (maybe_taken IS NULL OR typeof(maybe_taken) = 'text'),
{assignments}    CHECK (state <> 'scored' OR metrics IS NOT NULL)
);
CREATE TABLE IF NOT EXISTS events (
    assignment_id TEXT NOT NULL,
    time REAL NOT NULL,
    state TEXT NOT NULL,
    note TEXT
);
CREATE TABLE IF NOT EXISTS quarantine (
    id, module, task_id, state, input, metrics, outcome, error, attempts, not_before,
    received_at, updated_at, maybe_taken,
    reason TEXT NOT NULL,
    set_aside_at REAL NOT NULL{quarantine}
);
"""
SCHEMA_V2 = _V2_TABLES.format(assignments="", quarantine="")
# Version 3: version 2's, and why a result is a penalty (its kind and reason): the columns its
# migration adds, so that a new journal and a migrated one have the same tables.
_V3_COLUMNS = "    -- why the result is a penalty rather than a score (version 3)\n" + "".join(
    f"    {column},\n" for column in migrate.V3_ASSIGNMENT_COLUMNS
)
SCHEMA_V3 = _V2_TABLES.format(
    assignments=_V3_COLUMNS,
    quarantine=",\n    " + ", ".join(migrate.V3_QUARANTINE_COLUMNS),
)
# Version 4: version 3's, the main score as a column (what the report aggregates in SQL), the
# indexes that make a loop pass cost the backlog rather than the history, and the compacted
# history (validator/state/compaction.py); the same statements migrate a version 3 journal.
SCHEMA = (
    _V2_TABLES.format(
        assignments=_V3_COLUMNS
        + "    -- the main metric and its value, for the report's SQL (version 4)\n"
        + "".join(f"    {column},\n" for column in migrate.V4_ASSIGNMENT_COLUMNS),
        quarantine=",\n    "
        + ", ".join((*migrate.V3_QUARANTINE_COLUMNS, *migrate.V4_QUARANTINE_COLUMNS)),
    )
    + V4_STATEMENTS
)
# Every journal before version 2 (user_version 1, or 0 before it was stored): no constraints;
# a damaged row was marked `quarantined` in place. Migrated on open (validator/state/migrate.py).
SCHEMA_V1 = """
CREATE TABLE assignments (
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
CREATE TABLE events (
    assignment_id TEXT NOT NULL,
    time REAL NOT NULL,
    state TEXT NOT NULL,
    note TEXT
);
"""
# Stored in the file's user_version, so that a later validator can tell this schema apart and
# migrate it.
SCHEMA_VERSION = 4

DEFAULT_LOCK_TIMEOUT_S = 30.0
LOCK_TIMEOUT_ENV = "VALIDATOR_JOURNAL_LOCK_TIMEOUT"
RETRY_PAUSE_S = 0.1

# SQLite's messages for the result codes below, which stand in on Python 3.10 (sqlite_result).
BUSY_MESSAGES = ("database is locked", "database table is locked", "database is busy")
BROKEN_MESSAGES = ("file is not a database", "database disk image is malformed")


def lock_timeout_from_env() -> float:
    """Seconds to wait for another program's lock on the journal ($VALIDATOR_JOURNAL_LOCK_TIMEOUT,
    for tests and for operators whose backups lock it longer)."""
    raw = os.environ.get(LOCK_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_LOCK_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ConfigError(f"{LOCK_TIMEOUT_ENV}={raw!r} is not a number of seconds >= 0")
    return seconds


Plan = Literal["create", "migrate", "ready"]


def check(path: Path, lock_timeout: float, *, whole: bool = False) -> Plan:
    """Raise JournalBroken unless `path` is a sound journal of this schema or of an earlier
    one, or an empty database; return what opening it has to do. A read-only connection: a
    broken file is never written to, not even by the checkpoint that closing a connection runs.
    By default the checks cost the same at any size: the header (a file cut short), the tables'
    columns, the version; `whole` adds SQLite's quick_check of every page, which takes seconds
    for a million assignments (check a journal whole before relying on all of it: a copy)."""
    if not path.exists():
        return "create"  # by connect(), which may write
    # A directory (or a FIFO, whose open would block) in the journal's place is the operator's.
    if not path.is_file():
        raise not_a_file(path, "the journal")
    db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=lock_timeout)
    try:
        found = _until_unlocked(path, lock_timeout, lambda: _inspect(db, whole))
    except sqlite3.DatabaseError as exc:
        if not broken(exc):
            raise
        raise damaged(path, f"SQLite cannot read it: {exc}") from exc
    finally:
        db.close()
    if found is None:
        return "create"
    problem = _schema_problem(*found) or _cut_short(path)
    if problem is not None:
        raise damaged(path, problem)
    return "ready" if found[2] == SCHEMA_VERSION else "migrate"


def pages_problem(db: sqlite3.Connection) -> str | None:
    """SQLite's quick_check of every page of `db` (seconds for a million assignments): what it
    finds, or None for a sound file."""
    try:
        report = [row[0] for row in db.execute("PRAGMA quick_check(5)")]
    except sqlite3.DatabaseError as exc:  # a page it cannot even walk
        if not broken(exc):
            raise
        report = [str(exc)]
    if report == ["ok"]:
        return None
    return "SQLite's quick_check finds it damaged: " + "; ".join(report)


def _cut_short(path: Path) -> str | None:
    """The file is shorter than its header says it is: cut short (a copy that stopped, a disk
    that filled). Only where no write-ahead log is beside it, whose pages a sound file may not
    hold yet; the header's size is SQLite's only where its change counter says it is valid."""
    wal = path.with_name(f"{path.name}-wal")
    if wal.is_file() and wal.stat().st_size > 0:
        return None
    with path.open("rb") as file:
        header = file.read(100)
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        return None  # SQLite has said what it is
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    if pages == 0 or header[24:28] != header[92:96]:
        return None
    size = path.stat().st_size
    if size >= pages * page_size:
        return None
    return (
        "SQLite cannot read it: database disk image is malformed (its header counts "
        f"{pages} pages of {page_size} bytes, the file holds {size} bytes: cut short)"
    )


def connect(
    path: Path, lock_timeout: float, plan: Plan
) -> tuple[sqlite3.Connection, list[SetAside]]:
    """The journal's connection, after a real write in a transaction: a lock that outlasts
    the bound raises JournalLocked here, before anything is looked up. With it, what a
    migration set aside or sent back to be scored, for the caller to tell."""
    db = sqlite3.connect(path, timeout=lock_timeout)
    try:
        db.row_factory = sqlite3.Row
        notes = _until_unlocked(path, lock_timeout, lambda: _prepare(db, plan))
    except BaseException:
        db.close()
        raise
    return db, notes


def probe_lock(db: sqlite3.Connection, path: Path, lock_timeout: float) -> None:
    """Take the write lock and give it back: raise JournalLocked if another program holds it
    for longer than the bound."""

    def take() -> None:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ROLLBACK")

    _until_unlocked(path, lock_timeout, take)


def _prepare(db: sqlite3.Connection, plan: Plan) -> list[SetAside]:
    if db.in_transaction:  # a retry after a busy COMMIT
        db.execute("ROLLBACK")
    if plan == "create":
        # A new file gives the space of compacted rows back bit by bit (upkeep.py); SQLite
        # takes this only before the first table, and before the WAL mode.
        db.execute("PRAGMA auto_vacuum = INCREMENTAL")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("BEGIN IMMEDIATE")
    notes: list[SetAside] = []
    try:
        if plan == "migrate":
            version = db.execute("PRAGMA user_version").fetchone()[0]
            notes = migrate.upgrade(db, version, SCHEMA)
        else:
            migrate.run_script(db, SCHEMA)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return notes


def _inspect(
    db: sqlite3.Connection, whole: bool
) -> tuple[str | None, dict[str, list[tuple]], int] | None:
    """What the file holds: what the whole-file check found (with `whole`), its tables'
    columns and its schema version; None for a database with no tables at all (a new journal)."""
    problem = pages_problem(db) if whole else None
    tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    if problem is None and not tables:
        return None
    columns = {table: _columns(db, table) for table in tables}
    version = db.execute("PRAGMA user_version").fetchone()[0]
    return problem, columns, version


def _columns(db: sqlite3.Connection, table: str) -> list[tuple]:
    # name, declared type, not null, default, primary key
    return [tuple(row[1:]) for row in db.execute(f"PRAGMA table_info({_quoted(table)})")]


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _expected_columns(schema: str) -> dict[str, list[tuple]]:
    with closing(sqlite3.connect(":memory:")) as db:
        db.executescript(schema)
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {table: _columns(db, table) for table in tables}


def _schema_problem(pages: str | None, columns: dict[str, list[tuple]], version: int) -> str | None:
    if pages is not None:
        return pages
    if version > SCHEMA_VERSION:
        return f"its schema version {version} is newer than this validator's {SCHEMA_VERSION}"
    # An earlier version is migrated: it must be that version's schema (version 0 stored none,
    # and is version 1's).
    schemas = {SCHEMA_VERSION: SCHEMA, 3: SCHEMA_V3, 2: SCHEMA_V2}
    expected = _expected_columns(schemas.get(version, SCHEMA_V1))
    for table, wanted in expected.items():
        if table not in columns:
            return f"it has no table {table!r}: not a journal of this validator"
        theirs = {column[0]: column for column in columns[table]}
        ours = {column[0]: column for column in wanted}
        differences = [
            ("lacks", [name for name in ours if name not in theirs]),
            ("has unknown columns", [name for name in theirs if name not in ours]),
            ("declares differently", [n for n in ours if n in theirs and theirs[n] != ours[n]]),
        ]
        found = [f"{what} {', '.join(names)}" for what, names in differences if names]
        if found:
            return f"an unknown schema, not migrated: table {table!r} {'; '.join(found)}"
    return None


def damaged(path: Path, problem: str) -> JournalBroken:
    return JournalBroken(
        f"journal {path} is broken: {problem}. It is left as it is: move it out of the state "
        f"dir, with any {path.name}-wal and {path.name}-shm beside it, then rerun to start a "
        "new journal (results it holds that were not submitted are lost to this validator)"
    )


def not_a_file(path: Path, what: str) -> JournalUnwritable:
    return JournalUnwritable(
        f"{path} is not a file ({what} should be one there): move it out of the state dir, "
        "then rerun"
    )


def cannot_open(path: Path, exc: BaseException) -> JournalUnwritable:
    """SQLite cannot open the journal or the files beside it (-wal, -shm): one in the way as a
    directory, no permission."""
    beside = (path.with_name(f"{path.name}{suffix}") for suffix in ("-wal", "-shm"))
    odd = [str(p) for p in beside if p.exists() and not p.is_file()]
    where = f"; not a file: {', '.join(odd)}" if odd else ""
    return JournalUnwritable(
        f"journal {path}: SQLite cannot open it ({exc}{where}): check that the validator can "
        "write the state dir and that the journal's files there are files, then rerun"
    )


def locked(path: Path, lock_timeout: float) -> JournalLocked:
    return JournalLocked(
        f"journal {path} stayed locked by another program for {lock_timeout:g} s (e.g. an "
        "sqlite3 shell or a backup in a write transaction): end that program's transaction, "
        f"then rerun ({LOCK_TIMEOUT_ENV} sets the wait)"
    )


def busy(exc: BaseException) -> bool:
    return sqlite_result(exc, (SQLITE_BUSY, SQLITE_LOCKED), BUSY_MESSAGES)


def broken(exc: BaseException) -> bool:
    return sqlite_result(exc, (SQLITE_CORRUPT, SQLITE_NOTADB), BROKEN_MESSAGES)


def unopenable(exc: BaseException) -> bool:
    return sqlite_result(exc, (SQLITE_CANTOPEN,), ("unable to open database file",))


def read_only(exc: BaseException) -> bool:
    return sqlite_result(exc, (SQLITE_READONLY,), ("attempt to write a readonly database",))


def _until_unlocked(path: Path, lock_timeout: float, work: Callable[[], T]) -> T:
    """`work()`, retried while SQLite answers busy until `lock_timeout` has passed. The busy
    timeout does most of the waiting; some busy answers (a WAL being recovered, a snapshot gone
    stale) come back at once, without it."""
    deadline = time.monotonic() + lock_timeout
    while True:
        try:
            return work()
        except sqlite3.Error as exc:
            if not busy(exc):
                raise
            if time.monotonic() >= deadline:
                raise locked(path, lock_timeout) from exc
            time.sleep(RETRY_PAUSE_S)
