"""The limits a bounded child arms on itself after its preloads (validator/sandbox/child_entry.py,
on both paths), and how its set-up tells its parent that one was refused: a child cannot raise
a hard limit it inherited from the validator (validator/sandbox/child_bounds.py checks them
before any child runs). Standard library only, as child_entry.py is.
"""

from __future__ import annotations

import os
import resource
import signal

from . import protocol

# The exit code of a set-up whose limit was refused (said on its status pipe, which decides).
EXIT_LIMITS = 88
# The most a refusal says on the status pipe: one write, below PIPE_BUF, arrives whole.
STATUS_BYTES = 2048
# A child past its CPU limit gets SIGXCPU; if it survives that, SIGKILL this much later.
CPU_HARD_MARGIN = 2


class LimitRefused(Exception):
    """A bound the child cannot take: its hard limit, inherited from the validator, is below."""


def arm_limits(spec: protocol.Bounds) -> None:
    """The child's limits (after the preloads); LimitRefused naming the one whose hard limit,
    the validator's own, is below what the child asks."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU's default action dumps core
    cpu_seconds, memory_bytes = spec["cpu_seconds"], spec["memory_bytes"]
    file_bytes = spec["file_bytes"]
    if cpu_seconds is not None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(usage.ru_utime + usage.ru_stime + cpu_seconds) + 1
        _set(resource.RLIMIT_CPU, "RLIMIT_CPU", soft, soft + CPU_HARD_MARGIN, "s")
    if memory_bytes is not None:
        size = address_space()
        limit = size + memory_bytes
        unit = f"bytes (its {size} after the preloads, and memory_bytes)"
        _set(resource.RLIMIT_AS, "RLIMIT_AS", limit, limit, unit)
    if file_bytes is not None:
        # Past it a write fails (SIGXFSZ is ignored, so the write raises instead).
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        limit = file_bytes
        _set(resource.RLIMIT_FSIZE, "RLIMIT_FSIZE", limit, limit, "bytes")


def _set(which: int, name: str, soft: int, hard: int, unit: str) -> None:
    try:
        resource.setrlimit(which, (soft, hard))
    except (ValueError, OSError) as exc:
        held = resource.getrlimit(which)[1]
        raise LimitRefused(
            f"{name} of {hard} {unit} is above the hard limit of {held} it inherited ({exc})"
        ) from exc


def arm_and_tell(spec: protocol.Bounds, status: int) -> None:
    """Arms the limits, then tells the parent on `status` (a pipe only the set-up holds, closed
    before the script runs) ARMED; or REFUSED and the refusal, and ends the process there. What
    the set-up says there, never what a script writes later, tells the validator that the host
    refused a bound."""
    try:
        arm_limits(spec)
    except LimitRefused as exc:
        os.write(status, protocol.REFUSED + str(exc).encode("utf-8", "replace")[:STATUS_BYTES])
        os._exit(EXIT_LIMITS)
    os.write(status, protocol.ARMED)
    os.close(status)


def address_space() -> int:
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0
