"""The peak memory of a process, as the kernel counts it, for tests that bound what an answer
from outside can cost the validator: a command's whole life (`run_measured`, its
rusage, taken by a small wrapper process), or one stretch of a process's own life
(`reset_peak` then `peak_bytes`, the kernel's VmHWM: for a child script to import)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Measured:
    returncode: int
    stdout: str
    stderr: str
    peak_bytes: int  # the process's peak resident set (ru_maxrss)


# Runs the command and writes its peak (ru_maxrss, kB) to the file argv[1]. The command is
# started from this small interpreter, not from the test's: a forked child's peak counts the
# pages it shares with its parent until it execs, and a test process may hold gigabytes.
WRAPPER = """
import resource, subprocess, sys
code = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "w") as out:
    out.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(code)
"""


def run_measured(
    command: list[str], env: dict[str, str], cwd: Path, folder: Path, timeout: float = 120
) -> Measured:
    """`command` run to its end, with its output (through files in `folder`) and the peak
    resident set of that process alone (not the test's, not another child's)."""
    folder.mkdir(parents=True, exist_ok=True)
    out_path, err_path, peak_path = folder / "stdout", folder / "stderr", folder / "peak"
    wrapped = [sys.executable, "-c", WRAPPER, str(peak_path), *command]
    with out_path.open("w") as out, err_path.open("w") as err:
        process = subprocess.Popen(
            wrapped, cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True
        )
    try:
        returncode = process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the wrapper and the command
        process.wait()
        raise AssertionError(f"{command[:4]} still running after {timeout} s") from None
    return Measured(
        returncode,
        out_path.read_text(errors="replace"),
        err_path.read_text(errors="replace"),
        int(peak_path.read_text()) * 1024,  # kilobytes on Linux
    )


def peak_bytes() -> int:
    """This process's peak resident set since it started or since `reset_peak` (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def reset_peak() -> None:
    """Starts the peak afresh from the current resident set (`echo 5 > clear_refs`)."""
    Path("/proc/self/clear_refs").write_text("5")
