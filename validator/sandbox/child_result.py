"""What a bounded child (validator/sandbox/child_process.py) is given and how it ended: its
limits, its outcome (which limit it ran into, for the caller to word the rejection), its result.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import Enum

from validator.sandbox import child_bounds
from validator.sandbox.child_entry import EXIT_MEMORY

# What a child killed by a signal (an abort) wrote last when an allocation failed at its memory
# limit: Python, C++, glibc, and Rust's "memory allocation of N bytes failed" (tokenizers).
MEMORY_MARKS = ("MemoryError", "bad_alloc", "Cannot allocate", "memory allocation of")


class ChildOutcome(Enum):
    OK = "finished"
    OVER_CPU = "exceeded its CPU time limit"
    OVER_MEMORY = "exceeded its memory limit"
    OVER_TIME = "exceeded its wall-clock limit"
    CRASHED = "crashed"


@dataclass(frozen=True)
class ChildLimits:
    wall_seconds: float  # the parent kills the group after this long
    cpu_seconds: float | None = None  # CPU time after the preload imports
    memory_bytes: int | None = None  # address space after the preload imports
    file_bytes: int | None = None  # the largest file the child may write (its stderr too)

    def check_fits(self, source: str, lower: str | None = None) -> None:
        """ChildBoundUnfit (an OperatorError: exit 3) when this process's hard limits, which a
        child inherits and cannot raise, leave no room for these limits: one line naming
        `source` (what sets them), the limit, and what to set (`lower`: the setting that lowers
        them, if the operator has one)."""
        child_bounds.check_fits(self, source, lower)


@dataclass(frozen=True)
class ChildResult:
    outcome: ChildOutcome
    exit_code: int  # negative: the signal that ended it
    stderr_tail: str  # the last characters of its stderr (child_process.STDERR_TAIL)
    limits: ChildLimits

    def describe(self) -> str:
        """The outcome in words, with the limit it hit: "exceeded its CPU time limit (60 s)"."""
        if self.outcome is ChildOutcome.CRASHED:
            last = self.stderr_tail.strip().splitlines()[-1:] or ["no error output"]
            return f"crashed (exit {self.exit_code}): {last[0][-300:]}"
        limit = {
            ChildOutcome.OVER_CPU: self.limits.cpu_seconds,
            ChildOutcome.OVER_TIME: self.limits.wall_seconds,
            ChildOutcome.OVER_MEMORY: self.limits.memory_bytes,
        }.get(self.outcome)
        if limit is None:
            return self.outcome.value
        if self.outcome is ChildOutcome.OVER_MEMORY:
            return f"{self.outcome.value} ({limit} bytes)"
        return f"{self.outcome.value} ({limit:g} s)"


def judge(code: int, tail: str, timed_out: bool, cpu: float, limits: ChildLimits) -> ChildOutcome:
    """How a child ended, from its exit code, its stderr's tail, whether the parent killed it at
    its wall clock, and the CPU seconds it used."""
    if timed_out:
        return ChildOutcome.OVER_TIME
    if code == 0:
        return ChildOutcome.OK
    over_cpu = limits.cpu_seconds is not None and cpu >= limits.cpu_seconds
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and over_cpu):
        return ChildOutcome.OVER_CPU  # SIGKILL: RLIMIT_CPU's hard limit, if SIGXCPU was survived
    if code == EXIT_MEMORY or code == -signal.SIGKILL:
        # SIGKILL that the parent did not send, under the CPU limit: the kernel's OOM killer.
        return ChildOutcome.OVER_MEMORY
    if code < 0 and any(mark in tail for mark in MEMORY_MARKS):
        return ChildOutcome.OVER_MEMORY
    if code == 1 and tail.rstrip().endswith("MemoryError"):
        return ChildOutcome.OVER_MEMORY
    return ChildOutcome.CRASHED
