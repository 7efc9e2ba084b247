"""Progress of long work (a scoring's batches, a model download): a log line at most every
`every` seconds instead of minutes of silence, and a heartbeat for /healthz, which would
otherwise take a long scoring for a stuck loop. `Progress` lives in scope.py (it beats the
scope's heart); this file watches downloads."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from validator.kit.scope import EVERY_SECONDS, Progress, current_scope

__all__ = ["Progress", "watch_bytes"]

log = logging.getLogger("validator.progress")


@contextmanager
def watch_bytes(folder: Path, what: str, every: float = EVERY_SECONDS) -> Iterator[None]:
    """While the block runs (a download into `folder`), logs how many bytes it holds every
    `every` seconds."""
    done = threading.Event()
    beat = current_scope().heartbeat  # the watching thread does not see the scope itself

    def watch() -> None:
        started = time.monotonic()
        while not done.wait(every):
            size = _size(folder)
            elapsed = time.monotonic() - started
            log.info(
                "%s: %.1f MiB so far in %.0f s (%.1f MiB/s)",
                what,
                size / 2**20,
                elapsed,
                size / 2**20 / elapsed,
            )
            beat()

    thread = threading.Thread(target=watch, name="download-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)


def _size(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*") if folder.exists() else []:
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:
            continue  # a file renamed or removed meanwhile
    return total
