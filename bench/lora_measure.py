"""Timing and memory measurement for the lora benchmark."""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

# --- measuring ---------------------------------------------------------------------------------


def reset_peak_rss() -> bool:
    """Resets the kernel's peak-RSS mark of this process (Linux >= 4.0); False if it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def rss_bytes(key: str = "VmHWM") -> int:
    """Peak (VmHWM) or current (VmRSS) resident memory; the lifetime peak where /proc is absent."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class MemoryMark:
    """This process's resident memory from now on: where it started, and its peak."""

    def __init__(self) -> None:
        self.exact = reset_peak_rss()
        self.start = rss_bytes("VmRSS")

    def read(self) -> tuple[int, int, bool]:
        """(RSS at the mark, peak RSS since, whether the peak was reset at the mark)."""
        return self.start, rss_bytes(), self.exact


@dataclass
class Phases:
    """Wall-clock seconds per named phase of one assignment, in the order they ran."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


@dataclass
class Assignment:
    adapter: str
    phases: Phases
    eval_loss: float
    bpc: float


@dataclass
class SideResult:
    """One implementation's assignments, in order (the first is cold), and its process's memory."""

    name: str
    assignments: list[Assignment]
    rss_start: int
    rss_peak: int
    rss_exact: bool  # False: the peak is the process's lifetime peak, not since rss_start

    @property
    def steady(self) -> list[Assignment]:
        return self.assignments[1:] or self.assignments

    def steady_seconds(self) -> float:
        return statistics.median(a.phases.total for a in self.steady)

    def steady_phase(self, name: str) -> float:
        return statistics.median(a.phases.seconds.get(name, 0.0) for a in self.steady)
