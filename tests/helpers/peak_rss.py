"""The peak memory of a process, as the kernel counts it, for tests that bound what an answer
from outside can cost the validator (issue 40): a command's whole life (`run_measured`, the
rusage of that one child, os.wait4), or one stretch of a child's own life (`reset_peak` then
`peak_bytes`, the kernel's VmHWM: written for a child script to import)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

POLL_S = 0.05


@dataclass(frozen=True)
class Measured:
    returncode: int
    stdout: str
    stderr: str
    peak_bytes: int  # the process's peak resident set (ru_maxrss)


def run_measured(
    command: list[str], env: dict[str, str], cwd: Path, folder: Path, timeout: float = 120
) -> Measured:
    """`command` run to its end, with its output (through files in `folder`) and the peak
    resident set of that process alone (not the test's, not another child's)."""
    folder.mkdir(parents=True, exist_ok=True)
    out_path, err_path = folder / "stdout", folder / "stderr"
    with out_path.open("w") as out, err_path.open("w") as err:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=err, text=True)
    end = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > end:
            process.send_signal(signal.SIGKILL)
            os.wait4(process.pid, 0)
            raise AssertionError(f"{command[:4]} still running after {timeout} s")
        time.sleep(POLL_S)
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    return Measured(
        process.returncode,
        out_path.read_text(errors="replace"),
        err_path.read_text(errors="replace"),
        usage.ru_maxrss * 1024,  # kilobytes on Linux
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
