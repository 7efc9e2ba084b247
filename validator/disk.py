"""The one disk guard: the free space a directory must keep, the reserve that pays for the last
record when the disk fills, and the one line that names the directory when there is no room.

Every free-space check and every "no room" error of the validator is made here: the journal's,
before each lookup, scoring and submit (validator/state/journal.py, docs/journal.md: statvfs at
each, a synced test write near the floor or hourly); the
doctor's disk rows (validator/doctor/checks.py); a validation set or a Hub file that
found its disk full (validator/kit/downloads.py, validator/kit/hub.py). Whether an error is a
full disk is decided by its errno or SQLite's code alone (validator.errors.disk_full), never by
its text.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from validator.errors import OperatorError, disk_full, exception_chain
from validator.text import bounded, one_line

DEFAULT_MIN_FREE_MB = 64  # --min-free-mb, the journal's floor
MIB = 1024 * 1024
# Room for the few pages that recording one step takes (one step writes about 20 KiB).
RESERVE_BYTES = 256 * 1024
PROBE_BYTES = 64 * 1024
# The test write is what sees a quota or a file system that refuses writes while statvfs shows
# room; it writes and syncs PROBE_BYTES, so it is made at every check only when the free space
# is within this much of the floor, and elsewhere once every PROBE_EVERY_S: a quota filled in
# between costs the one step in progress the reserve, then the next check stops the work.
NEAR_FLOOR_BYTES = 256 * MIB
PROBE_EVERY_S = 3600.0
MAX_REASON = 500  # a reason quotes an error, whose file name a submission may have chosen


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on `path`'s file system (quotas are invisible
    here: only a write tells); for a path not created yet, its nearest existing parent's."""
    where = path
    while not where.exists() and where != where.parent:
        where = where.parent
    stats = os.statvfs(where)
    return stats.f_bavail * stats.f_frsize


def no_room(
    where: str,
    directory: Path,
    reason: str,
    *,
    what: str = "writes",
    min_free_mb: int | None = None,
    error: type[OperatorError] = OperatorError,
) -> OperatorError:
    """The one line for a directory that cannot take `what`: which directory (`where` says
    what it is to the operator), what is free there, the floor if there is one, why, and what
    to do. An operator's error: exit 3, the assignment kept."""
    try:
        free = f"{free_bytes(directory) / MIB:.1f} MiB free"
    except OSError as exc:
        free = f"free space unknown: {exc.strerror or exc}"
    if min_free_mb is not None:
        free += f", --min-free-mb {min_free_mb}"
    return error(
        one_line(
            f"{where} {directory} cannot take {what} ({free}): {bounded(reason, MAX_REASON)}; "
            "free space there, then rerun"
        )
    )


def raise_if_full(exc: BaseException, where: str, directory: Path, what: str) -> None:
    """Raise no_room() naming `directory` when `exc` (or what it was raised from) is a full disk
    or an exceeded quota; return otherwise, for the caller's own handling."""
    for err in exception_chain(exc):
        if isinstance(err, OSError) and disk_full(err):
            raise no_room(where, directory, err.strerror or str(err), what=what) from exc


class DiskGuard:
    """Room to write in one directory: free space of at least the floor (statvfs, at every
    check), a reserve file kept there and given up for the one write in progress when the disk
    fills, and a real write (the floor alone is not enough: quotas are invisible to statvfs, and
    with a floor of 0 only a write tells) near the floor, or once in a while."""

    def __init__(
        self,
        directory: Path,
        min_free_mb: int = DEFAULT_MIN_FREE_MB,
        *,
        where: str,
        what: str,
        reserve_name: str,
        probe_name: str,
        error: type[OperatorError] = OperatorError,
    ) -> None:
        self.directory = directory
        self.min_free_mb = min_free_mb
        self.where, self.what, self.error = where, what, error
        self.reserve = directory / reserve_name
        self.probe = directory / probe_name
        self._probed_at: float | None = None  # monotonic time of the last test write

    def refusal(self, reason: str) -> OperatorError:
        return no_room(
            self.where,
            self.directory,
            reason,
            what=self.what,
            min_free_mb=self.min_free_mb,
            error=self.error,
        )

    def check(self, *, floor: bool = True) -> None:
        """Raise refusal() unless the directory has room: the floor (skipped with floor=False),
        the reserve in place, and a test write when one is due (`_probe_due`)."""
        free = free_bytes(self.directory)
        if floor and free < self.min_free_mb * MIB:
            raise self.refusal("below the free-space floor")
        steps = []
        if not self.reserve.exists() or self.reserve.stat().st_size < RESERVE_BYTES:
            no_reserve = f"no room for the reserve {self.reserve.name}"
            steps.append((self.reserve, RESERVE_BYTES, True, no_reserve))
        if self._probe_due(free):
            steps.append((self.probe, PROBE_BYTES, False, "a test write failed"))
        for path, size, keep, failure in steps:
            try:
                _write_file(path, size, keep=keep)
            except OSError as exc:
                self._probed_at = None  # the next check writes again
                raise self.refusal(f"{failure}: {exc.strerror or exc}") from exc
        if steps:
            self._probed_at = time.monotonic()

    def _probe_due(self, free: int) -> bool:
        """A test write at the first check, near the floor, and once every PROBE_EVERY_S."""
        if self._probed_at is None or free < self.min_free_mb * MIB + NEAR_FLOOR_BYTES:
            return True
        return time.monotonic() - self._probed_at >= PROBE_EVERY_S

    def short_of_space(self) -> bool:
        """Whether an error that names no cause (SQLite's "disk I/O error") is more likely the
        disk being full than a fault: below the floor (or a test write's size), or a test
        write that finds it full."""
        try:
            if free_bytes(self.directory) < max(self.min_free_mb * MIB, PROBE_BYTES):
                return True
            _write_file(self.probe, PROBE_BYTES, keep=False)
        except OSError as exc:
            return disk_full(exc)
        return False

    def give_up_reserve(self) -> bool:
        """Delete the reserve, so that the write in progress finds room; False when it was
        given up already (the next check() stops the work)."""
        if not self.reserve.exists():
            return False
        self.reserve.unlink()
        return True


def _write_file(path: Path, size: int, *, keep: bool) -> None:
    """Write `size` bytes that no file system can compress or leave sparse, and sync them, so
    that the blocks are really taken; a partial file is removed either way."""
    done = False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            data = memoryview(os.urandom(size))
            while data:  # a nearly full disk takes part of a write before it refuses the rest
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        done = keep
    finally:
        if not done:
            path.unlink(missing_ok=True)
