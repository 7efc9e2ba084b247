"""A SQLite journal of assignments, so that no result is lost to a crash or an API outage:
received -> scoring -> scored | failed -> submitted, or -> dropped. What a full disk, a broken
file, a damaged row and a migration do to it: docs/internals.md, "The journal".
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from validator.disk import DEFAULT_MIN_FREE_MB, DiskGuard
from validator.errors import SQLITE_IOERR, JournalUnwritable, disk_full, sqlite_result
from validator.state import store
from validator.state.entry import UNDECIDED, UNFINISHED, UNSUBMITTED, Entry, State, score_of
from validator.state.owner import StateDirLock
from validator.state.quarantine import ROW_KEY, SetAside, sift
from validator.state.store import DEFAULT_LOCK_TIMEOUT_S
from validator.text import bounded, one_line

log = logging.getLogger(__name__)
T = TypeVar("T")

RESERVE_NAME = "journal.reserve"
PROBE_NAME = "journal.probe"


class Journal:
    """The journal of one state directory, whose lock (validator/state/owner.py) it holds from
    opening to close()."""

    def __init__(
        self,
        state_dir: Path,
        min_free_mb: int = DEFAULT_MIN_FREE_MB,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S,
        redact: Callable[[str], str] | None = None,
    ) -> None:
        self.state_dir = state_dir
        # The log's secret redactor (validator/observe/logs.py), for reasons and notes: a reason
        # quotes errors, and the journal feeds the records, the report and the status page.
        self._redact = redact or (lambda text: text)
        self.disk = DiskGuard(
            state_dir,
            min_free_mb,
            where="state dir",
            what="journal writes",
            reserve_name=RESERVE_NAME,
            probe_name=PROBE_NAME,
            error=JournalUnwritable,
        )
        self.lock_timeout = lock_timeout
        self.quarantined_now: list[str] = []  # ids this process set aside
        self.path = state_dir / "journal.sqlite3"
        with self._full_disk_stops("cannot create files"):
            self._owner = StateDirLock(state_dir)
        try:
            with self._full_disk_stops("cannot open the journal"):
                plan = store.check(self.path, lock_timeout)
                self._db, notes = store.connect(self.path, lock_timeout, plan)
        except BaseException:
            self._owner.release()
            raise
        if plan == "migrate":
            log.info("journal %s: migrated to schema version %d", self.path, store.SCHEMA_VERSION)
        for note in notes:
            self._tell(note)

    def close(self) -> None:
        try:
            self._db.close()
        except sqlite3.Error as exc:
            # What was committed is in the WAL; a checkpoint that found no room is redone on open.
            log.warning("journal %s: closing: %s", self.path, exc)
        self._owner.release()

    # --- room to write -----------------------------------------------------------------

    def ensure_writable(self, *, floor: bool = True) -> None:
        """Raise JournalUnwritable unless the journal can record the next step: the disk guard's
        check (the floor skipped with floor=False), then the write lock."""
        self.disk.check(floor=floor)
        # A step whose record would then wait on another program's lock, and fail, must not
        # start: a lookup's assignment would be lost.
        with self._full_disk_stops("the journal's write lock"):
            store.probe_lock(self._db, self.path, self.lock_timeout)

    def _is_full(self, exc: BaseException) -> bool:
        if disk_full(exc):
            return True
        io_error = sqlite_result(exc, (SQLITE_IOERR,), ("disk I/O error",))
        return io_error and self.disk.short_of_space()

    @contextmanager
    def _full_disk_stops(self, what: str) -> Iterator[None]:
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            if not self._is_full(exc):
                self._raise_known(exc)
                raise
            raise self.disk.refusal(f"{what}: {exc}") from exc

    def _raise_known(self, exc: BaseException) -> None:
        """Raise a locked or broken journal as the operator's error that it is."""
        if store.busy(exc):
            raise store.locked(self.path, self.lock_timeout) from exc
        if store.broken(exc):
            raise store.damaged(self.path, str(exc)) from exc
        if store.read_only(exc):
            raise self.disk.refusal(f"the journal is read-only: {exc}") from exc
        if store.unopenable(exc):
            raise store.cannot_open(self.path, exc) from exc

    def _run(self, work: Callable[[], T]) -> T:
        """`work` in one transaction. On a full disk the reserve is given up for one retry, so
        that the step in progress is recorded all the same; the next ensure_writable() stops."""
        try:
            with self._db:
                return work()
        except (sqlite3.Error, OSError) as exc:
            if not self._is_full(exc):
                self._raise_known(exc)
                raise
            if not self.disk.give_up_reserve():
                raise self.disk.refusal(f"journal write: {exc}") from exc
            log.warning("journal %s: disk full (%s); giving up the reserve", self.path, exc)
        with self._full_disk_stops("journal write, even after giving up the reserve"):
            with self._db:
                return work()

    # --- upkeep (validator/state/upkeep.py) ----------------------------------------------

    def maintain(self, work: Callable[[sqlite3.Connection], T], *, translate: bool = True) -> T:
        """`work` on the journal's connection in one transaction, as the upkeep does it: never
        paid for with the reserve, which is kept for an assignment's record. Its errors are the
        journal's (a full disk, a lock, a broken file); with `translate` False SQLite's own, for
        work whose failure loses nothing (giving space back)."""
        if not translate:
            with self._db:
                return work(self._db)
        with self._full_disk_stops("the journal's upkeep"):
            with self._db:
                return work(self._db)

    # --- assignments -------------------------------------------------------------------

    def get(self, assignment_id: str) -> Entry | None:
        """The assignment's entry; None if there is none, or if its row is not one (set aside
        now or by an earlier process)."""
        rows = self._select("id = ?", (assignment_id,))
        return rows[0] if rows else None

    def quarantined(self) -> list[str]:
        """Ids of the rows set aside, oldest first ("None" for a NULL id)."""
        rows = self._run(
            lambda: self._db.execute(
                "SELECT id FROM quarantine ORDER BY set_aside_at, rowid"
            ).fetchall()
        )
        return [one_line(bounded(str(row["id"]), 100)) for row in rows]

    def _select(self, where: str, params: tuple[Any, ...]) -> list[Entry]:
        """The entries of the rows that match, each read whole; a row that is not an entry is
        set aside, or sent back to be scored, in the same transaction, and told in one line."""
        found: list[Entry | SetAside] = []

        def read() -> None:
            found.clear()
            rows = self._db.execute(
                f"SELECT rowid AS {ROW_KEY}, * FROM assignments WHERE {where}"
                " ORDER BY received_at, id",
                params,
            ).fetchall()
            found.extend(sift(self._db, "assignments", row) for row in rows)

        self._run(read)
        entries = []
        for item in found:
            if isinstance(item, Entry):
                entries.append(item)
                continue
            self._tell(item)
            if item.entry is not None:  # scored again: kept, as `received`
                entries.append(item.entry)
        return entries

    def _tell(self, note: SetAside) -> None:
        if note.scored_again:
            log.warning(
                "journal %s: assignment %s was scored but its metrics are missing; it is "
                "scored again (never submitted without them)",
                self.path,
                note.id,
            )
            return
        if note.told_before:
            return  # an earlier validator's mark: the start's reminder names it
        self.quarantined_now.append(note.id)
        log.error(
            "journal %s: assignment %s (%s) set aside, %s; kept as it was in the table "
            "quarantine, neither scored nor submitted: repair it there with sqlite3 and insert "
            "it back into assignments to have it picked up",
            self.path,
            note.id,
            note.was,
            note.reason,
        )

    def receive(self, assignment_id: str, module: str, task_id: str, data: dict) -> Entry | None:
        """Record a new assignment; an id seen before keeps its recorded state. None for an id
        whose row is set aside: handed out again, it is left to the operator as well."""
        now = time.time()

        def insert() -> None:
            aside = self._db.execute(
                "SELECT 1 FROM quarantine WHERE id = ?", (assignment_id,)
            ).fetchone()
            if aside:
                return
            inserted = self._db.execute(
                "INSERT OR IGNORE INTO assignments (id, module, task_id, state, input,"
                " received_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (assignment_id, module, task_id, State.RECEIVED.value, json.dumps(data), now, now),
            ).rowcount
            if inserted:
                self._event(assignment_id, State.RECEIVED, f"task {task_id}", now)

        self._run(insert)
        return self.get(assignment_id)

    # Each transition takes the entry its caller holds and returns the new one: the caller
    # goes on with what it was given, and nothing reads back what it just wrote.

    def begin_scoring(self, entry: Entry) -> Entry:
        return self._move(entry, State.SCORING, attempts=entry.attempts + 1)

    def scored(
        self, entry: Entry, metrics: dict[str, Any], penalty: tuple[str, str] | None = None
    ) -> Entry:
        """Scored: `metrics` to submit, and with `penalty` (kind, reason) why they are the
        network's penalty rather than a score (the module said so: Scope.penalty)."""
        kind, reason = penalty or (None, None)
        metric, score = score_of(metrics)
        return self._move(
            entry,
            State.SCORED,
            derived={"metric": metric, "score": score},
            metrics=metrics,
            error=None,
            penalty_kind=kind,
            penalty=reason,
        )

    def failed(self, entry: Entry, reason: str, kind: str | None = None) -> Entry:
        """Decided as failed for `reason`, of `kind` (the runner's FAILED_KINDS)."""
        return self._move(entry, State.FAILED, error=reason, penalty_kind=kind, penalty=reason)

    def postpone(self, entry: Entry, reason: str, not_before: float) -> Entry:
        """Back to `received` for a later retry; this attempt does not count towards the limit."""
        attempts = max(entry.attempts - 1, 0)
        return self._move(
            entry, State.RECEIVED, error=reason, not_before=not_before, attempts=attempts
        )

    def retry_later(self, entry: Entry, reason: str, not_before: float) -> Entry:
        """Back to `received` for a later retry; this attempt counts towards the limit."""
        return self._move(entry, State.RECEIVED, error=reason, not_before=not_before)

    def defer_submit(
        self, entry: Entry, reason: str, not_before: float, maybe_taken: str | None
    ) -> Entry:
        """Kept for a later submit try, with what a try met that the API may have taken (None:
        none did); no event: the state does not change."""
        return self._move(
            entry,
            entry.state,
            event=False,
            error=reason,
            not_before=not_before,
            maybe_taken=maybe_taken,
        )

    def submitted(self, entry: Entry, note: str | None = None) -> Entry:
        outcome = "completed" if entry.state is State.SCORED else "failed"
        # A note tells how the submission is known to have gone out, when it is not certain.
        full = f"{outcome}; {note}" if note else outcome
        return self._move(entry, State.SUBMITTED, outcome=outcome, note=full)

    def dropped(self, entry: Entry, reason: str) -> Entry:
        return self._move(entry, State.DROPPED, error=reason)

    def pending(self, module: str, states: tuple[State, ...]) -> list[Entry]:
        """Entries of `module` in `states`, oldest first, whether due or not. Every row not
        final is read, so that one in a state this validator never writes is set aside and
        told, not passed over without a word; through the index of those rows alone (the
        condition written as the index's: entry.UNFINISHED), so a pass costs the backlog."""
        entries = self._select(f"module = ? AND {UNFINISHED}", (module,))
        return [entry for entry in entries if entry.state in states]

    def report_backlog(self, module: str) -> None:
        """At start-up, one line for what an earlier process left to do, and one for the rows
        an earlier process quarantined (this one's had their own line each)."""
        pending = self.pending(module, UNDECIDED + UNSUBMITTED)
        undecided = sum(entry.state in UNDECIDED for entry in pending)
        if pending:
            log.info(
                "journal %s: %d assignments to (re)score, %d results to submit",
                self.path,
                undecided,
                len(pending) - undecided,
            )
        ids = [i for i in self.quarantined() if i not in self.quarantined_now]
        if ids:
            more = f" and {len(ids) - 10} more" if len(ids) > 10 else ""
            log.warning(
                "journal %s: damaged rows quarantined, kept for you to repair or remove: "
                "assignments %s%s (python -m validator report lists them)",
                self.path,
                one_line(", ".join(ids[:10])),
                more,
            )

    def events(self, assignment_id: str) -> list[tuple[str, str | None]]:
        rows = self._run(
            lambda: self._db.execute(
                "SELECT state, note FROM events WHERE assignment_id = ? ORDER BY rowid",
                (assignment_id,),
            ).fetchall()
        )
        return [(row["state"], row["note"]) for row in rows]

    def _move(
        self,
        entry: Entry,
        state: State,
        *,
        note: str | None = None,
        event: bool = True,
        derived: dict[str, Any] | None = None,
        **changes: Any,
    ) -> Entry:
        """`changes` to the entry, and `derived` columns the entry does not carry (its score's)."""
        now = time.time()
        for column in ("error", "penalty"):
            if isinstance(changes.get(column), str):
                changes[column] = self._redact(changes[column])
        if note is not None:
            note = self._redact(note)
        changes = {"state": state, "updated_at": now, **changes}
        if state in (State.SCORING, State.SCORED, State.FAILED, State.SUBMITTED):
            changes.setdefault("not_before", 0.0)
        # Validated as any entry is: a transition cannot make one the journal would not read.
        new = Entry.model_validate({**entry.model_dump(), **changes})
        params = {column: _column_value(new, column) for column in changes}
        params.update(derived or {})
        sets = ", ".join(f"{column} = ?" for column in params)

        def update() -> None:
            values = (*params.values(), entry.id)
            self._db.execute(f"UPDATE assignments SET {sets} WHERE id = ?", values)
            if event:
                self._event(entry.id, state, note or changes.get("error"), now)

        self._run(update)
        return new

    def _event(self, assignment_id: str, state: State, note: str | None, now: float) -> None:
        self._db.execute(
            "INSERT INTO events (assignment_id, time, state, note) VALUES (?, ?, ?, ?)",
            (assignment_id, now, state.value, note),
        )


def _column_value(entry: Entry, column: str) -> Any:
    value = getattr(entry, column)
    if column == "metrics" and value is not None:
        return json.dumps(value)
    return value.value if isinstance(value, State) else value
