"""Progress of long work (a scoring's batches, a model download): a log line at most every
`every` seconds instead of minutes of silence, and a heartbeat for /healthz, which would
otherwise take a long scoring for a stuck loop."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from validator import phases

log = logging.getLogger("validator.progress")

EVERY_SECONDS = 30.0


class Progress:
    def __init__(
        self, what: str, total: int | None = None, unit: str = "", every: float = EVERY_SECONDS
    ) -> None:
        self.what, self.total, self.unit, self.every = what, total, unit, every
        self.done = 0
        self.started = self.last = time.monotonic()

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            log.info("%s: %s", self.what, self.describe(now))
            phases.heartbeat()

    def describe(self, now: float | None = None) -> str:
        elapsed = (now or time.monotonic()) - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        share = f" of {self.total} ({self.done / self.total:.0%})" if self.total else ""
        return f"{self.done}{share} {self.unit} in {elapsed:.0f} s, {rate:.2f}/s".replace("  ", " ")


@contextmanager
def watch_bytes(folder: Path, what: str, every: float = EVERY_SECONDS) -> Iterator[None]:
    """While the block runs (a download into `folder`), logs how many bytes it holds every
    `every` seconds."""
    done = threading.Event()

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
            phases.heartbeat()

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
