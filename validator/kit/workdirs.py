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
        # Another process sweeping the same root at once (several validators, or a test run
        # in parallel) may remove a folder under our feet: that folder is gone, which is the
        # point. The lock stays held while removing so that two sweeps never work on one.
        try:
            claim = _claim(folder) if folder.is_dir() and not folder.is_symlink() else None
        except FileNotFoundError:
            continue
        if claim is None:
            continue
        try:
            # Its owner was killed: so is any child process it left (child_process.py).
            strays = kill_strays(folder)
            if strays:
                log.info("killed %d child processes left running in %s", strays, folder)
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
        except FileNotFoundError:
            continue
        finally:
            if claim >= 0:
                os.close(claim)
    return removed


def _hold(lock_path: Path) -> int:
    fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _claim(folder: Path) -> int | None:
    """None while the folder is in use; else the descriptor of its lock, held, or -1 for a
    folder that never got a lock file and is older than the grace a creator needs."""
    lock_path = folder / LOCK_NAME
    if not lock_path.exists():
        return -1 if time.time() - folder.stat().st_mtime > UNLOCKED_GRACE_SECONDS else None
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        raise
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None  # a live process, or another sweep, holds it
    return fd
