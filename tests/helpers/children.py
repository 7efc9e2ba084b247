"""Watching the child processes that validator/sandbox/child_process.py starts, from tests: its pid
record, whether a pid still runs that child, and stopping a parent with repeated SIGTERMs.
Every wait is for a state, bounded by a generous timeout."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from validator.sandbox import child_server
from validator.sandbox.child_files import RECORD_PREFIX, RECORD_SUFFIX
from validator.sandbox.child_process import ChildLimits, ChildOutcome, run_child

PR_CAPBSET_DROP = 24


def drop_capabilities() -> None:
    """In a stand-in validator before it starts (a root test run; a `preexec_fn`): no
    capability survives its exec, as in the module image (uid 10001, none)."""
    libc = ctypes.CDLL(None, use_errno=True)
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            os._exit(99)  # the test then fails on the exit code


def alive(pid: int, token: str | None = None) -> bool:
    """Running (not a zombie), and carrying `token` on its command line if one is given."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and (token is None or token.encode() in cmdline)


def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def record_in(folder: Path, timeout: float = 60.0) -> dict:
    """The pid record (`pid`, `token`) of the child running in `folder`, once it exists."""
    pattern = f"{RECORD_PREFIX}*{RECORD_SUFFIX}"
    assert wait_until(lambda: any(p.stat().st_size for p in folder.glob(pattern)), timeout), (
        f"no child started in {folder}"
    )
    return json.loads(next(p for p in folder.glob(pattern) if p.stat().st_size).read_text())


def gone(record: dict, timeout: float = 60.0) -> bool:
    return wait_until(lambda: not alive(record["pid"], record["token"]), timeout)


def stop_again_until_it_ends(process: subprocess.Popen, tries: int = 60) -> None:
    """SIGTERM, once a second, until `process` ends: two signals sent at once may reach the
    validator's handler as one, so the second stop is repeated rather than sent in a burst."""
    for _ in range(tries):
        process.send_signal(signal.SIGTERM)
        if wait_until(lambda: process.poll() is not None, timeout=1):
            return


def parent_of(pid: int) -> int:
    """The parent pid of `pid` (from /proc), 0 when it has ended."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def is_child_server(pid: int) -> bool:
    """Whether `pid` is one of validator/sandbox/child_server.py's servers."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"serve" in cmdline and any(part.endswith(b"child_entry.py") for part in cmdline)


# The start of a probe child's script: `attempt(action)` runs one action and gives its
# outcome, "done" or the name of the OSError it met. The probe writes what it saw to seen.json.
PROBE_ATTEMPT = """
import json, os, socket, sys, threading
def attempt(action):
    try:
        action()
        return "done"
    except OSError as exc:
        return type(exc).__name__
"""


def run_probe(tmp_path: Path, monkeypatch, path: str, script: str, args: list[str]):
    """Runs `script` through the kit on the `path` ("served" or "fresh") in tmp_path/work; it
    must end OK. Returns what it wrote to seen.json, and its folder."""
    if path == "fresh":
        monkeypatch.setattr(child_server, "server_for", lambda *_args, **_kwargs: None)
    child, work = tmp_path / "child.py", tmp_path / "work"
    child.write_text(script)
    result = run_child(child, args, cwd=work, limits=ChildLimits(60), preload=("json",))
    assert result.outcome is ChildOutcome.OK, result
    return json.loads((work / "seen.json").read_text()), work
