"""Folders for a submission's files: one per assignment, removed after it, and swept at
start-up when a killed process could not remove its own.

Each folder holds a lock file that its process keeps locked (`flock`) while the folder is in
use. A lock the kernel released is a dead owner, whatever its pid was: containers reuse pids,
so a pid file would not tell.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from validator.sandbox.child_files import kill_strays

log = logging.getLogger(__name__)

ROOT_NAME = "flock-validator-work"
LOCK_NAME = ".in-use"
# A folder without its lock file yet may be one another process is creating this instant.
UNLOCKED_GRACE_SECONDS = 60.0


class WorkArea:
    """A module's assignment folders under `<parent or the temp dir>/flock-validator-work`."""

    def __init__(self, module: str, parent: str | None = None) -> None:
        self.module = module
        self.root = Path(parent or tempfile.gettempdir()) / ROOT_NAME
        self.root.mkdir(parents=True, exist_ok=True)
        self.current: Path | None = None
        self._lock: int | None = None
        swept = sweep(self.root)
        if swept:
            log.info("removed %d work folders left by stopped processes in %s", swept, self.root)

    def new(self) -> Path:
        """A fresh folder for one assignment (the previous one is removed first)."""
        self.clean()
        folder = Path(tempfile.mkdtemp(prefix=f"{self.module}-", dir=self.root))
        self._lock = _hold(folder / LOCK_NAME)
        self.current = folder
        return folder

    def clean(self) -> None:
        if self.current is not None:
            shutil.rmtree(self.current, ignore_errors=True)
            self.current = None
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def sweep(root: Path) -> int:
    """Removes the folders under `root` whose owner is gone; returns how many."""
    removed = 0
    for folder in sorted(root.iterdir()):
        try:
            abandoned = folder.is_dir() and not folder.is_symlink() and _abandoned(folder)
        except FileNotFoundError:  # another process's sweep, or its owner, removed it meanwhile
            continue
        if abandoned:
            # Its owner was killed: so is any child process it left (child_process.py).
            strays = kill_strays(folder)
            if strays:
                log.info("killed %d child processes left running in %s", strays, folder)
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


def _hold(lock_path: Path) -> int:
    fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _abandoned(folder: Path) -> bool:
    lock_path = folder / LOCK_NAME
    if not lock_path.exists():
        return time.time() - folder.stat().st_mtime > UNLOCKED_GRACE_SECONDS
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # a live process holds it
    finally:
        os.close(fd)
    return True
