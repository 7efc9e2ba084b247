"""Running a submission's code-like inputs (an ONNX policy, a chat template, a tokenizer) in a
child process that the validator can always bound and stop. For modules: `run_child(script,
args, cwd=..., limits=...)` runs `script` as `__main__` in a child forked from a pre-imported
server (child_server.py) or, where none can run, in a fresh `python -I`: no secrets, its own
process group, confined by Landlock and seccomp, its limits armed, killed at its wall clock.
What each guarantee is and why: docs/internals.md, "The bounded child".
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

from validator.sandbox import child_landlock, child_seccomp, child_server, protocol
from validator.sandbox.child_bounds import refused
from validator.sandbox.child_files import (
    RECORD_PREFIX,
    RECORD_SUFFIX,
    discard,
    kill_group,
    open_stderr,
    tail,
    write_new,
    write_record,
)
from validator.sandbox.child_result import ChildLimits as ChildLimits
from validator.sandbox.child_result import ChildOutcome as ChildOutcome
from validator.sandbox.child_result import ChildResult, judge

T = TypeVar("T")
Heartbeat = Callable[[], None]

POLL_SECONDS = 0.05
HEARTBEAT_SECONDS = 5.0
STDERR_TAIL = 2000
# How long the server may take to fork a child beyond its wall clock, and to kill one; how long
# the fresh path's first process may take to kill the script's and what it left.
START_GRACE = 30.0
KILL_WAIT_SECONDS = 30.0
STOP_WAIT_SECONDS = 5.0
# What a child may write besides what lies beneath its own folder (its request, answer and
# temporary files): a parser exploit must not reach the journal, the HF cache (the base's files:
# later submissions' scores) or another submission's folder. No TCP (it fetches nothing), and
# no signal to its parent (what cleans up after it) or the validator, nor an abstract socket.
CHILD_WRITABLE_FILES = ("/dev/null",)
CHILD_NO_TCP = True
CHILD_SCOPED = True
# What the seccomp filter (validator/sandbox/child_seccomp.py) leaves a child, on any kernel:
# sockets of these families only (no UDP, no MPTCP, which Landlock's TCP rule does not see), no new
# process (threads only: RLIMIT_AS then bounds all its memory, and no fork bomb), and no change of a
# file's mode, owner, times or extended attributes (Landlock does not cover them).
CHILD_SOCKET_FAMILIES = (socket.AF_UNIX,)
# No connection of any family: a Unix socket bound to a path, the Docker engine's
# among them, answers a connect that Landlock lets through. A child talks to its parent through
# files in its folder and inherits no socket, so it needs none.
CHILD_NO_CONNECT = True
CHILD_NO_PROCESSES = True
CHILD_NO_METADATA = True
# No call that acts on another process (limits, priority, scheduling, signals, pidfds, another's
# memory): a child of the validator's user could otherwise cut the validator's open-file or CPU
# limit, renice it or pin it to one CPU for good. Its own process still takes them.
CHILD_NO_OTHERS = True


def run_child(
    script: Path,
    args: list[str],
    *,
    cwd: Path,
    limits: ChildLimits,
    env: dict[str, str] | None = None,
    preload: tuple[str, ...] = (),
) -> ChildResult:
    """Runs `python -I script *args` in `cwd` under `limits` (see the module's docstring) and
    returns how it ended. Raises only what interrupts the wait (a stop signal's exception),
    after killing the child."""
    # Here: the child side imports nothing of ours.
    from validator.scope import current_scope  # noqa: PLC0415

    heartbeat = current_scope().heartbeat
    cwd.mkdir(parents=True, exist_ok=True)
    cwd = cwd.resolve()
    # Its HOME and temporary files in its folder: the one place it may write.
    home = {"HOME": str(cwd), "TMPDIR": str(cwd)}
    child_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **home, **(env or {})}
    server = child_server.server_for(preload, env or {}, heartbeat, HEARTBEAT_SECONDS)
    if server is not None:
        try:
            return _run_served(server, script, args, cwd, limits, child_env, heartbeat)
        except child_server.ServerGone as exc:
            child_server.report_gone(server, str(exc))  # the one warning line; then afresh
    return _run_fresh(script, args, cwd, limits, child_env, preload, heartbeat)


def confinement(cwd: Path) -> protocol.Confinement | None:
    """The child's Landlock rules, which validator/sandbox/child_entry.py applies before it runs the
    script; None where there is no Landlock (one warning line per process)."""
    return child_landlock.rules([str(cwd)], list(CHILD_WRITABLE_FILES), CHILD_NO_TCP, CHILD_SCOPED)


def syscall_filter() -> protocol.SyscallRules | None:
    """The child's seccomp filter, which validator/sandbox/child_entry.py installs right after the
    Landlock rules; None where seccomp is not available (one warning line per process)."""
    return child_seccomp.rules(
        CHILD_SOCKET_FAMILIES,
        CHILD_NO_PROCESSES,
        CHILD_NO_METADATA,
        CHILD_NO_CONNECT,
        CHILD_NO_OTHERS,
    )


def _paths(cwd: Path) -> tuple[str, Path, Path]:
    token = uuid.uuid4().hex
    record = cwd / f"{RECORD_PREFIX}{token}{RECORD_SUFFIX}"
    return token, record, cwd / f"{RECORD_PREFIX}{token}.stderr"


def _request(script: Path, args: list[str], cwd: Path, limits: ChildLimits) -> protocol.Request:
    """What the child's side (child_entry.py) is told on either path: the script, the Landlock
    rules and seccomp filter it applies, and the limits it arms."""
    return protocol.Request(
        script=str(script),
        args=[str(a) for a in args],
        confine=confinement(cwd),
        syscalls=syscall_filter(),
        cpu_seconds=limits.cpu_seconds,
        memory_bytes=limits.memory_bytes,
        file_bytes=limits.file_bytes,
    )


def _wait(deadline: float, heartbeat: Heartbeat, look: Callable[[float], T | None]) -> T | None:
    """What `look(seconds)` gives, asked again until it gives something (each time it may wait
    that long, at most POLL_SECONDS); None at `deadline`. The heartbeat is beaten every
    HEARTBEAT_SECONDS meanwhile. A signal handler's exception ends the wait in `look`."""
    beat = time.monotonic() + HEARTBEAT_SECONDS
    while True:
        found = look(max(0.0, min(POLL_SECONDS, deadline - time.monotonic())))
        if found is not None:
            return found
        now = time.monotonic()
        if now >= deadline:
            return None
        if now >= beat:
            heartbeat()
            beat = now + HEARTBEAT_SECONDS


def _run_served(
    server: child_server.ChildServer,
    script: Path,
    args: list[str],
    cwd: Path,
    limits: ChildLimits,
    child_env: dict[str, str],
    heartbeat: Heartbeat,
) -> ChildResult:
    """The child forked from `server`. ServerGone when the server could not take it or died
    before the child's end was known (the child died with it: nothing ran to its end)."""
    token, record, stderr_path = _paths(cwd)
    request = protocol.ServedRequest(
        **_request(script, args, cwd, limits), cwd=str(cwd), env=child_env, token=token
    )
    began = time.monotonic()
    stderr = open_stderr(stderr_path)
    try:
        conn = server.start_child(request, stderr)
        with conn:
            started = _receive(conn, began + limits.wall_seconds + START_GRACE, heartbeat)
            if started is None or "pid" not in started:
                raise child_server.ServerGone(f"no child started: {started}")
            pid = started["pid"]
            ended: protocol.Reply | None = None
            timed_out = False
            try:
                write_record(record, pid, token)  # ChildFileRefused if the child raced it
                ended = _receive(conn, began + limits.wall_seconds, heartbeat)
                timed_out = ended is None
            finally:
                if ended is None:
                    # Over time, or a stop signal: the server kills the group and reaps.
                    ended = _kill_served(conn, pid)
                discard(record)
            if ended is None or "code" not in ended:
                if timed_out:
                    ended = protocol.Ended(code=-signal.SIGKILL, cpu=0.0)
                else:
                    raise child_server.ServerGone("it ended while the child ran")
        last = tail(stderr, STDERR_TAIL)
    finally:
        os.close(stderr)
        discard(stderr_path)
    if "refused" in ended:
        raise refused(ended["refused"])
    code, cpu = ended["code"], ended["cpu"]
    return ChildResult(judge(code, last, timed_out, cpu, limits), code, last, limits)


def _receive(conn: socket.socket, deadline: float, heartbeat: Heartbeat) -> protocol.Reply | None:
    """The server's next reply; None at `deadline`. ServerGone when the server is gone, or
    says what is not a reply."""

    def look(seconds: float) -> protocol.Reply | None:
        readable, _, _ = select.select([conn], [], [], seconds)
        if not readable:
            return None
        try:
            message = conn.recv(protocol.MAX_REPLY_BYTES + 1)
        except OSError:
            message = b""
        if not message:
            raise child_server.ServerGone("it ended while the child ran")
        try:
            return protocol.decode_reply(message)
        except protocol.ProtocolError as exc:
            raise child_server.ServerGone(f"it answered {exc}") from None

    # The cast: a type checker joins the union of replies into an empty TypedDict.
    return cast("protocol.Reply | None", _wait(deadline, heartbeat, look))


def _kill_served(conn: socket.socket, pid: int) -> protocol.Reply | None:
    """Has the server kill the child's group; returns its end, or None if the server is gone
    (then the group is killed from here: its leader died with the server)."""
    try:
        conn.send(protocol.KILL)
        return _receive(conn, time.monotonic() + KILL_WAIT_SECONDS, lambda: None)
    except (OSError, child_server.ServerGone):
        kill_group(pid)
        return None


def _run_fresh(
    script: Path,
    args: list[str],
    cwd: Path,
    limits: ChildLimits,
    child_env: dict[str, str],
    preload: tuple[str, ...],
    heartbeat: Heartbeat,
) -> ChildResult:
    """The path without a server: a fresh `python -I` that imports the preloads itself."""
    token, record, stderr_path = _paths(cwd)
    spec_path = cwd / f"{RECORD_PREFIX}{token}.json"
    # The set-up's word on its limits (child_limits.arm_and_tell): the script never holds it.
    status, status_w = os.pipe()
    os.set_blocking(status, False)
    request = protocol.FreshRequest(
        **_request(script, args, cwd, limits),
        parent=os.getpid(),
        preload=list(preload),
        status=status_w,
    )
    command = [sys.executable, "-I", str(child_server.ENTRY), "run", str(spec_path), token]
    try:
        write_new(spec_path, protocol.encode(request))
        stderr = open_stderr(stderr_path)
        try:
            process = subprocess.Popen(
                command, cwd=cwd, env=child_env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
                close_fds=True, pass_fds=(status_w,),
            )  # fmt: skip
        except BaseException:
            os.close(stderr)
            raise
        finally:
            os.close(status_w)
        ended: tuple[int, float] | None = None
        try:
            write_record(record, process.pid, token)
            ended = _wait(time.monotonic() + limits.wall_seconds, heartbeat, _reaped(process.pid))
        finally:
            code, last = _end_fresh(process, ended, stderr, (record, spec_path, stderr_path))
        said = _said(status)
    finally:
        os.close(status)
    if said.startswith(protocol.REFUSED):
        raise refused(protocol.reason(said[1:].decode("utf-8", "replace")))
    timed_out, cpu = ended is None, ended[1] if ended is not None else 0.0
    return ChildResult(judge(code, last, timed_out, cpu, limits), code, last, limits)


def _said(status: int) -> bytes:
    """What the fresh child's set-up wrote on its status pipe (b"" if it died before)."""
    try:
        return os.read(status, 4096)
    except BlockingIOError:
        return b""


def _reaped(pid: int) -> Callable[[float], tuple[int, float] | None]:
    """A look (`_wait`) at child `pid`: its wait status and CPU seconds once it ended (reaped)."""

    def look(seconds: float) -> tuple[int, float] | None:
        ended, status, usage = os.wait4(pid, os.WNOHANG)
        if ended:
            return status, usage.ru_utime + usage.ru_stime
        time.sleep(seconds)
        return None

    return look


def _end_fresh(
    process: subprocess.Popen, ended: tuple[int, float] | None, stderr: int, files: tuple[Path, ...]
) -> tuple[int, str]:
    """Whatever happened (done, over time, a stop signal): nothing of the child outlives the
    call. Stopped: its first process kills the script's and what that left, then ends. The
    leader is reaped; other members of its group, if any, are killed. Its exit code and the
    tail of its stderr."""
    status = ended[0] if ended is not None else None
    try:
        if status is None:
            status = _stop_fresh(process.pid)
    finally:
        kill_group(process.pid)
        if status is None:
            _, status, _ = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        for path in files:
            discard(path)
        try:
            last = tail(stderr, STDERR_TAIL)
        finally:
            os.close(stderr)
    return process.returncode, last


def _stop_fresh(pid: int) -> int | None:
    """SIGTERM to the fresh path's first process (child_reaper.stay_as_reaper); its wait
    status once it ended, None if it took longer than STOP_WAIT_SECONDS (then SIGKILL)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass  # ended meanwhile, not yet reaped
    ended = _wait(time.monotonic() + STOP_WAIT_SECONDS, lambda: None, _reaped(pid))
    return ended[0] if ended is not None else None
