"""The loop's time and its waits, in one object: the runner and its lookups read the clock
only through it, so that a test drives the loop with a clock that moves at once
(tests/helpers/loop.py)."""

from __future__ import annotations

import threading
import time


class Clock:
    """Wall time (journal stamps, due times), monotonic time (durations) and a wait that a stop
    ends."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        return stop.wait(seconds)
