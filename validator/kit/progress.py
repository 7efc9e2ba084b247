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

from validator._moved import moved_name
from validator.scope import EVERY_SECONDS, current_scope

log = logging.getLogger(__name__)


# With a known total, a line also each time another tenth has arrived; the folder is looked at
# this often (a directory walk: cheap beside a download).
LOOK_SECONDS = 1.0
STEPS = 10


@contextmanager
def watch_bytes(
    folder: Path, what: str, every: float = EVERY_SECONDS, total: int | None = None
) -> Iterator[None]:
    """While the block runs (a download into `folder`), logs the bytes that arrived every
    `every` seconds; with the `total` expected (from the Hub's listing), also at every tenth of
    it, with the share and an estimate of the time left. Bytes already in `folder` when the block
    starts (a cache's other revisions) do not count."""
    done = threading.Event()
    beat = current_scope().heartbeat  # the watching thread does not see the scope itself
    before = _size(folder)  # here, before the block writes anything

    def watch() -> None:
        started = last = time.monotonic()
        step = 1
        while not done.wait(min(every, LOOK_SECONDS)):
            now = time.monotonic()
            arrived = max(_size(folder) - before, 0)
            tenth = total is not None and total > 0 and arrived * STEPS >= step * total
            if now - last < every and not tenth:
                continue
            last = now
            if tenth and total:
                step = arrived * STEPS // total + 1
            log.info("%s: %s", what, _bytes_line(arrived, total, now - started))
            beat()

    thread = threading.Thread(target=watch, name="download-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)


def _bytes_line(arrived: int, total: int | None, elapsed: float) -> str:
    rate = arrived / 2**20 / elapsed if elapsed > 0 else 0.0
    if not total:
        return f"{arrived / 2**20:.1f} MiB so far in {elapsed:.0f} s ({rate:.1f} MiB/s)"
    share = min(arrived / total, 1.0)
    left = (total - arrived) / 2**20 / rate if rate > 0 else None
    eta = f"about {left:.0f} s left" if left is not None else "time left unknown"
    return (
        f"{arrived / 2**20:.1f} of {total / 2**20:.1f} MiB ({share:.0%}) in {elapsed:.0f} s, "
        f"{rate:.1f} MiB/s, {eta}"
    )


def _size(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*") if folder.exists() else []:
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:
            continue  # a file renamed or removed meanwhile
    return total


def __getattr__(name: str) -> object:
    return moved_name(__name__, name)  # Progress, which `validator.progress` gave
