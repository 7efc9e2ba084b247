"""Moves one state dir's journal into another: run inside the module's image, whose validator
will run the journal, by launcher/fleet/volumes.py (this file's text, as `python -c`), so that it
imports only the standard library and the validator's journal.

`python -c SOURCE OLD NEW OLD_NAME MODULE` prints one JSON line (`Outcome`). Every step can be
cut short and done again, so a move that dies at any point finishes on the next start:

- the old state dir is copied into a folder of the new one, compared byte for byte, and opened
  there by the validator's own journal (`Journal`: its start checks, a migration, damaged rows
  set aside), every row read whole; the old state dir is only ever read;
- into a new state dir without a journal, a copy that opened whole is placed file by file, the
  journal last, so that one there is whole;
- otherwise (the new state dir holds a journal of its own, or the old one cannot be opened
  whole) each readable row is merged into the new journal by assignment id, through the
  journal's own transitions: a row there keeps its state unless the old one is further on, and
  a result submitted or dropped in either, or maybe taken by the API in either, stays so;
- `moved/OLD_NAME.json` in the new state dir records the move and the digest of the old journal
  it took: that journal, unchanged, is a finished move, and its rows are never merged again.
"""

from __future__ import annotations

import filecmp
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from validator.errors import ExitCode, OperatorError
from validator.state import store
from validator.state.entry import UNDECIDED, UNSUBMITTED, DamagedRow, Entry, NoMetrics, State
from validator.state.journal import Journal
from validator.state.store import DEFAULT_LOCK_TIMEOUT_S

JOURNAL = "journal.sqlite3"
MOVED = "moved"
STAGE_PREFIX = ".moving-"
# The fault suite's hook (launcher/engine/fault_hook.py): the move dies at this step, as a host
# does.
KILL_AT_ENV = "FLOCK_FAULT_KILL_AT"
ROW_ID = "_rowid"
MAX_PADDED = 16 << 30  # a header asking for more is not a journal's
HEADER = b"SQLite format 3\0"
PAGE_SIZE, PAGE_COUNT = slice(16, 18), slice(28, 32)  # where the header holds them
# What the journal's readers call the kind of a penalty that has none (validator/observe/
# telemetry.py; this file imports only the journal).
UNRECORDED = "unrecorded"
DECIDED = frozenset({State.SCORED, State.FAILED, State.SUBMITTED, State.DROPPED})


@dataclass
class Outcome:
    # moved: placed whole; merged: rows merged into a journal there; finished: done before;
    # kept: the old journal cannot be opened whole, its readable rows merged
    outcome: str
    to_submit: int = 0  # results scored or failed in the new journal, not yet submitted
    to_score: int = 0
    rows: int = 0  # rows of the old journal read whole
    problem: str | None = None  # why the old journal cannot be opened whole


def kill_point(step: str) -> None:
    if os.environ.get(KILL_AT_ENV) == f"move:{step}":
        os._exit(128 + signal.SIGKILL)  # as abrupt as a SIGKILL: nothing flushed or closed


def move(old: Path, new: Path, name: str, module: str) -> Outcome:
    marker = new / MOVED / f"{name}.json"
    source = journal_digest(old)
    done = _read_marker(marker)
    if done.get("source") == source and (new / JOURNAL).exists():
        return Outcome("finished", rows=done.get("rows", 0), problem=done.get("problem"))
    stage = new / f"{STAGE_PREFIX}{name}"
    _stage(old, stage)
    kill_point("staged")
    rows, problem = _open_whole(stage)
    merged: list[str] = []
    if problem is None and not (new / JOURNAL).exists():
        outcome = _place(stage, new, module, rows)
        kill_point("placed")
    else:
        # A row merged by an earlier start from this damaged journal stays merged: the new
        # journal may have dropped it since (retention), and it must not come back.
        skip = set(done.get("ids", [])) if problem is not None else set()
        outcome = _merge(stage / JOURNAL, new, skip, merged, name, module)
        outcome.problem = problem
        outcome.outcome = "kept" if problem is not None else "merged"
        merged += sorted(skip)
    _write_marker(marker, {"source": source, "ids": merged, **asdict(outcome)})
    shutil.rmtree(stage, ignore_errors=True)
    return outcome


def journal_digest(state: Path) -> str:
    """What a journal holds, as bytes: its file and its write-ahead log."""
    digest = hashlib.sha256()
    for suffix in ("", "-wal"):
        path = state / f"{JOURNAL}{suffix}"
        digest.update(f"{suffix}:{path.stat().st_size if path.exists() else -1}:".encode())
        if path.exists():
            with path.open("rb") as file:
                for block in iter(lambda: file.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def _stage(old: Path, stage: Path) -> None:
    """A copy of the old state dir, every file compared with what it was copied from."""
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(old, stage)
    files = [p.relative_to(old) for p in old.rglob("*") if p.is_file()]
    if not all(filecmp.cmp(old / f, stage / f, shallow=False) for f in files):
        raise MoveFailed("the copy differs from what it was copied from")


def _open_whole(stage: Path) -> tuple[int, str | None]:
    """How many rows of the copy read whole, and why it cannot be opened whole (None: it can).
    Opened first by the validator's journal, which migrates it and sets damaged rows aside,
    then read row by row, so that damage past the journal's start checks is found too."""
    problem = None
    try:
        # Whole: every page, as a copy is relied on in full once its old volume is removed.
        store.check(stage / JOURNAL, DEFAULT_LOCK_TIMEOUT_S, whole=True)
        Journal(stage).close()
    except OperatorError as exc:  # broken, of a newer schema, not a file
        problem = _said(str(exc), stage / JOURNAL)
        _pad(stage / JOURNAL)
    rows, unread = scan(stage / JOURNAL, lambda _: None)
    return rows, problem or unread


def _pad(path: Path) -> None:
    """A copy cut short (a truncated file) made as long as its header says, with zeros: SQLite
    then reads its schema and the rows in the pages that survived, and refuses only the rest."""
    try:
        with path.open("r+b") as file:
            header = file.read(len(HEADER))
            if not header.startswith(HEADER):
                return
            header += file.read(PAGE_COUNT.stop - len(header))
            page_size = int.from_bytes(header[PAGE_SIZE], "big")
            page_size = 65536 if page_size == 1 else page_size
            wanted = page_size * int.from_bytes(header[PAGE_COUNT], "big")
            size = file.seek(0, os.SEEK_END)
            if size < wanted <= MAX_PADDED:
                file.truncate(wanted)  # zeros, and no memory for them
    except OSError:
        pass  # read as it is


def _said(message: str, path: Path) -> str:
    """The journal's refusal without the staged copy's path and the advice meant for a state
    dir: what is wrong with the journal."""
    message = message.split(". It is left as it is", 1)[0]
    return message.split(" is broken: ", 1)[-1].replace(str(path), JOURNAL)


def scan(path: Path, visit: Callable[[Entry], None]) -> tuple[int, str | None]:
    """`visit` each row of the journal at `path` that reads as an entry (one scored without
    its metrics as received: it is scored again), forwards, then, past a row that cannot be
    read, backwards down to it; the rows visited, and what could not be read."""
    reading = _Scan(path, visit)
    problem = reading.rows("ASC")
    if problem is not None:
        reading.rows("DESC")
    said = [f"{reading.damaged} rows are not rows this validator writes"]
    said = said if reading.damaged else []
    return reading.visited, "; ".join([*said, *([problem] if problem else [])]) or None


class _Scan:
    def __init__(self, path: Path, visit: Callable[[Entry], None]) -> None:
        self.path, self.visit = path, visit
        self.visited = self.damaged = 0
        self.last: int | None = None  # the last rowid read forwards

    def rows(self, order: str) -> str | None:
        query = f"SELECT rowid AS {ROW_ID}, * FROM assignments"
        if order == "DESC" and self.last is not None:
            query += f" WHERE rowid > {int(self.last)}"
        try:
            db = sqlite3.connect(self.path)
        except sqlite3.Error as exc:
            return f"SQLite cannot open it: {exc}"
        db.row_factory = sqlite3.Row
        try:
            for row in iter(db.execute(f"{query} ORDER BY rowid {order}").fetchone, None):
                if order == "ASC":
                    self.last = row[ROW_ID]
                entry = _entry(row)
                self.damaged += entry is None
                if entry is not None:
                    self.visit(entry)
                    self.visited += 1
        except sqlite3.Error as exc:
            return f"SQLite cannot read all its rows: {exc}"
        finally:
            db.close()
        return None


def _entry(row: sqlite3.Row) -> Entry | None:
    try:
        return Entry.from_row(row)
    except NoMetrics as exc:
        return exc.entry
    except DamagedRow:
        return None


def _place(stage: Path, new: Path, module: str, rows: int) -> Outcome:
    """The copy, opened whole, made the new state dir's: the journal placed last."""
    outcome = _counted(stage, module, Outcome("moved", rows=rows))
    for stale in (f"{JOURNAL}-wal", f"{JOURNAL}-shm"):  # beside no journal: an earlier try's
        (new / stale).unlink(missing_ok=True)
    _move_tree(stage, new, keep_last=stage / JOURNAL)
    os.replace(stage / JOURNAL, new / JOURNAL)
    return outcome


def _move_tree(source: Path, target: Path, keep_last: Path) -> None:
    target.mkdir(exist_ok=True)
    for item in sorted(source.iterdir()):
        if item == keep_last:
            continue
        if item.is_dir() and (target / item.name).is_dir():
            _move_tree(item, target / item.name, keep_last)
        else:
            os.replace(item, target / item.name)


def _counted(state: Path, module: str, outcome: Outcome) -> Outcome:
    journal = Journal(state)
    try:
        pending = journal.pending(module, UNDECIDED + UNSUBMITTED)
    finally:
        journal.close()
    outcome.to_score = sum(entry.state in UNDECIDED for entry in pending)
    outcome.to_submit = len(pending) - outcome.to_score
    return outcome


def _merge(
    copy: Path, new: Path, skip: set[str], merged: list[str], name: str, module: str
) -> Outcome:
    """Each row of `copy` that reads whole into the new state dir's journal (made if it has
    none), by id; `merged` gets their ids."""
    journal = Journal(new)

    def visit(entry: Entry) -> None:
        if entry.id not in skip:
            merge_entry(journal, entry, f"the journal of {name}")
            merged.append(entry.id)
            kill_point("merging")

    try:
        rows, _ = scan(copy, visit)
    finally:
        journal.close()
    return _counted(new, module, Outcome("merged", rows=rows))


def merge_entry(journal: Journal, old: Entry, where: str) -> Entry | None:
    """`old`'s decision and its submission carried into `journal`'s row of the same id, which
    keeps its own where it is as far on: a row is never taken back, and a result submitted,
    dropped or maybe taken in either journal is never sent again. None for an id set aside
    in `journal` (left to its operator, as any set-aside row)."""
    ours = journal.get(old.id) or journal.receive(old.id, old.module, old.task_id, old.input)
    if ours is None:
        return None
    if ours.state in UNDECIDED and old.state in DECIDED:
        if old.metrics is not None and old.outcome != "failed" and old.state is not State.FAILED:
            ours = journal.scored(ours, old.metrics, _penalty(old))
        else:
            reason = old.penalty or old.error or f"failed in {where}"
            ours = journal.failed(ours, reason, old.penalty_kind)
    if ours.state in UNSUBMITTED and old.state is State.SUBMITTED:
        return journal.submitted(ours, f"submitted by {where}")
    if ours.state in UNSUBMITTED and old.state is State.DROPPED:
        return journal.dropped(ours, old.error or f"dropped in {where}")
    if ours.state in UNSUBMITTED and old.maybe_taken and not ours.maybe_taken:
        reason = ours.error or f"a submit try of {where} may have been taken"
        return journal.defer_submit(ours, reason, ours.not_before, old.maybe_taken)
    return ours


def _penalty(entry: Entry) -> tuple[str, str] | None:
    """`entry`'s penalty (kind, reason), as `Journal.scored` takes it. A penalty is its reason,
    for every reader of a journal: a kind alone is none, and a reason without its kind is an
    `unrecorded` one (the journal makes neither for a scored row; a failure's reason without
    its kind is carried by `Journal.failed`)."""
    if entry.penalty is None:
        return None
    return (entry.penalty_kind or UNRECORDED, entry.penalty)


def _read_marker(marker: Path) -> dict:
    try:
        found = json.loads(marker.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _write_marker(marker: Path, record: dict) -> None:
    marker.parent.mkdir(exist_ok=True)
    partial = marker.with_suffix(".partial")
    partial.write_text(json.dumps(record))
    os.replace(partial, marker)


class MoveFailed(Exception):
    """A move that cannot go on; nothing of the old state dir was touched."""


def main(argv: list[str]) -> int:
    old, new, name, module = argv
    try:
        outcome = move(Path(old), Path(new), name, module)
    except (MoveFailed, OperatorError, OSError, sqlite3.Error) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        print(json.dumps({"outcome": "failed", "problem": first}), flush=True)
        return ExitCode.OPERATOR
    print(json.dumps(asdict(outcome)), flush=True)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(int(main(sys.argv[1:])))
