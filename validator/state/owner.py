"""The one lock on a state directory: one validator process at a time owns it.

An exclusive `flock` on the directory itself, taken once when the journal opens (before any API
call) and held until it closes; everything else in the state dir (the journal, records, phase
marks) relies on it. The directory, not a file in it: no cleanup that deletes files there (the
journal included) lets a second validator in, and the lock is no descriptor of the journal's
database file, whose closing would drop the POSIX record locks SQLite holds on that file.
`flock` and those record locks do not conflict (on local file systems), so readers such as the
`sqlite3` shell still get in.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import NoReturn

from validator.errors import ConfigError, JournalUnwritable, disk_full


class StateDirLock:
    """Held from construction until release(). Raises ConfigError (exit 2) when another process
    holds it, JournalUnwritable when the directory cannot be made or opened, and the OSError
    itself for a full disk, for the caller's disk guard to name."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            _raise_unusable(state_dir, exc)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise ConfigError(
                f"state directory {state_dir} is in use by another validator process; "
                "give each validator its own --state-dir"
            ) from exc
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _raise_unusable(state_dir: Path, exc: OSError) -> NoReturn:
    """A full disk as it is, for the caller's disk guard to name; anything else (a file in the
    directory's place, a read-only mount, no permission) as the operator's to fix."""
    if disk_full(exc):
        raise exc
    raise JournalUnwritable(
        f"state directory {state_dir} cannot be used: {exc.strerror or exc} "
        f"({exc.filename or state_dir}); give --state-dir a directory the validator can write, "
        "then rerun"
    ) from exc
