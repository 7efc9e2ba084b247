"""The journal's upkeep inside a live validator: once at the first idle moment of a process and
then once a day, the whole-file check, the compaction of what is older than the retention
window (validator/state/compaction.py), and the space it freed given back.

The runner calls `step()` only when nothing is due (no scoring, submit or lookup): each call does
one bounded piece (the check, one compaction step of at most compaction.STEP_ROWS rows, or one
give-back step) and returns, so a lookup that comes due waits for one piece at most, never for a
whole run. A damaged file stops the validator with exit 3 (JournalBroken), as at start.

Space: a journal made by this version gives free pages back bit by bit (auto_vacuum=INCREMENTAL).
One made before keeps them for its next rows until it is written anew once (VACUUM), which the
upkeep does when the free pages are most of the file and there is room for it: what the rows use,
in SQLite's temporary directory and again in the state dir above --min-free-mb; otherwise it says
so once and the file keeps its size (its free pages are reused).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from validator.disk import MIB, free_bytes
from validator.options import DEFAULT_JOURNAL_KEEP_DAYS
from validator.state import compaction, store
from validator.state.journal import Journal

log = logging.getLogger(__name__)

DAY = 24 * 3600.0
GIVE_BACK_PAGES = 2048  # per step: 8 MiB of 4 KiB pages
# A file made before this version is written anew when its free pages are at least this share.
REWRITE_SHARE = 0.5


class Upkeep:
    """The upkeep of one process's journal; `keep_days` 0 keeps every row (no compaction)."""

    def __init__(
        self,
        journal: Journal,
        keep_days: float = DEFAULT_JOURNAL_KEEP_DAYS,
        every: float = DAY,
        step_rows: int = compaction.STEP_ROWS,
    ) -> None:
        self.journal = journal
        self.keep_days = keep_days
        self.every = every
        self.step_rows = step_rows
        self.next_at = 0.0  # the runner's clock: the first idle moment
        self._pieces: Iterator[None] | None = None

    def step(self, now: float) -> bool:
        """One bounded piece of the upkeep when one is due; False when none was (the runner
        then waits)."""
        if self._pieces is None:
            if now < self.next_at:
                return False
            self._pieces = self._run(now)
        try:
            next(self._pieces)
        except StopIteration:
            self._pieces = None
            self.next_at = now + self.every
            return False
        return True

    def _run(self, now: float) -> Iterator[None]:
        # SQLite's check of every page (seconds for a million assignments); a damaged file is
        # JournalBroken, as at start.
        problem = self.journal.maintain(store.pages_problem)
        if problem is not None:
            raise store.damaged(self.journal.path, problem)
        yield
        if self.keep_days > 0:
            yield from self._compact(now - self.keep_days * DAY)
        yield from self._give_back()

    def _compact(self, cutoff: float) -> Iterator[None]:
        started, compacted, after = time.monotonic(), 0, 0
        while True:
            work = partial(compaction.step, cutoff=cutoff, after=after, limit=self.step_rows)
            done = self.journal.maintain(work)
            compacted, after = compacted + done.compacted, done.after
            if done.done:
                break
            yield
        if compacted:
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(cutoff))
            log.info(
                "journal %s: %d assignments finished before %s compacted into its history "
                "(%.1f s)", self.journal.path, compacted, when, time.monotonic() - started,
            )  # fmt: skip

    def _give_back(self) -> Iterator[None]:
        space = self.journal.maintain(compaction.space)
        if space.incremental:
            while space.free_pages > 0:
                yield
                if not self._try(partial(compaction.give_back, pages=GIVE_BACK_PAGES)):
                    return
                space = self.journal.maintain(compaction.space)
                if space.free_pages == 0:
                    self._try(compaction.cut_log)
        elif space.free_pages >= REWRITE_SHARE * space.pages and space.free_pages > 0:
            yield
            self._rewrite(space)

    def _rewrite(self, space: compaction.Space) -> None:
        state_dir, temp_dir = self.journal.state_dir, sqlite_temp_dir()
        need = space.used_bytes
        floor = self.journal.disk.min_free_mb * MIB
        short = [
            f"{where} {path} has {free / MIB:.0f} MiB free, {needs / MIB:.0f} MiB needed"
            for where, path, needs in (
                ("the state dir", state_dir, need + floor),
                ("SQLite's temporary directory", temp_dir, need),
            )
            if (free := _free(path)) < needs
        ]
        wasted = space.free_pages * space.page_size / MIB
        if short:
            log.warning(
                "journal %s: %.0f MiB of it are free pages, kept for its next rows: giving "
                "them back writes it anew, and %s; free room there (or stop the validator and "
                "run sqlite3 %s 'PRAGMA auto_vacuum=INCREMENTAL; VACUUM')",
                self.journal.path, wasted, "; ".join(short), self.journal.path,
            )  # fmt: skip
            return
        started = time.monotonic()
        if self._try(compaction.rewrite):
            log.info(
                "journal %s: written anew, %.0f MiB given back (%.1f s); from now on freed "
                "space is given back as it is freed",
                self.journal.path, wasted, time.monotonic() - started,
            )  # fmt: skip

    def _try(self, work: Callable[[sqlite3.Connection], object]) -> bool:
        """Give-back work, whose failure (a lock held past the bound, no room after all) loses
        nothing: told, and tried again at the next upkeep."""
        try:
            self.journal.maintain(work, translate=False)
        except (sqlite3.Error, OSError) as exc:
            log.warning("journal %s: giving free space back: %s", self.journal.path, exc)
            return False
        return True


def sqlite_temp_dir() -> Path:
    """Where SQLite (on Unix) writes its temporary files, VACUUM's copy included: the first
    usable of $SQLITE_TMPDIR, $TMPDIR, /var/tmp, /usr/tmp, /tmp, the working directory."""
    candidates = [os.environ.get("SQLITE_TMPDIR"), os.environ.get("TMPDIR")]
    for candidate in [*candidates, "/var/tmp", "/usr/tmp", "/tmp"]:
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return Path(candidate)
    return Path.cwd()


def _free(path: Path) -> int:
    try:
        return free_bytes(path)
    except OSError:
        return 0
