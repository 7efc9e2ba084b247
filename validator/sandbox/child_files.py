"""The validator's file I/O in a folder a bounded child controls. For modules. The child may plant
symlinks, hard links and FIFOs there, so the parent never follows a link nor reads anything but
a plain file of the folder's own: `write_new` creates a new file (never through a link),
`read_child_file` takes a bounded regular file with one link, and the child's stderr is read
through the descriptor the parent made (docs/internals.md, "The child's folder").
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
from pathlib import Path

from validator.errors import SubmissionRejected

RECORD_PREFIX = ".child-"
RECORD_SUFFIX = ".pid"
MAX_RECORD_BYTES = 4096
TOKEN = re.compile(r"[0-9a-f]{32}")


class ChildFileRefused(SubmissionRejected):
    """A file in a child's folder that is not a plain file of its own: a link, a FIFO, one too
    large, or one that appeared while the parent wrote it. The child's (the submission's) doing."""


def write_new(path: Path, data: bytes) -> None:
    """`data` in a new file at `path` (0o600), whatever a child had put there before."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        raise ChildFileRefused(f"{path.name}: a folder where a file was to be written") from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise ChildFileRefused(f"{path.name}: a file appeared there as it was written") from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def read_child_file(path: Path, max_bytes: int) -> bytes:
    """The bytes of the plain file at `path` in a child's folder (see the module's docstring)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ChildFileRefused(f"{path.name}: not a plain file ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise ChildFileRefused(f"{path.name}: not a plain file of the child's own")
        if info.st_dev != os.stat(path.parent).st_dev:
            raise ChildFileRefused(f"{path.name}: a file of another file system")
        if info.st_size > max_bytes:
            raise ChildFileRefused(f"{path.name}: {info.st_size} bytes, over {max_bytes}")
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:  # grown since the fstat
        raise ChildFileRefused(f"{path.name}: over {max_bytes} bytes")
    return data


def open_stderr(path: Path) -> int:
    """A new file at `path` for the child's stderr, readable and writable through the returned
    descriptor, which the parent keeps until it has read the tail."""
    path.unlink(missing_ok=True)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, 0o600)


def tail(fd: int, size: int) -> str:
    """The last `size` bytes of the file open at `fd`, as text."""
    end = os.fstat(fd).st_size
    return os.pread(fd, size, max(0, end - size)).decode(errors="replace")


def write_record(path: Path, pid: int, token: str) -> None:
    write_new(path, json.dumps({"pid": pid, "token": token}).encode())


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # gone already (a reaped leader and no other member)


def kill_strays(folder: Path) -> int:
    """Kills the children recorded under `folder` (an abandoned work folder, whose owner is
    dead) that are still running; returns how many. A record is a child's claim (the child may
    write it): only a 32-hex token, the one its name carries, that the process's command line
    holds as a whole argument, names a child of run_child's; a pid whose command line lacks it
    is another process (pids are reused) and is left alone."""
    killed = 0
    for record in folder.rglob(f"{RECORD_PREFIX}*{RECORD_SUFFIX}"):
        named = record.name[len(RECORD_PREFIX) : -len(RECORD_SUFFIX)]
        try:
            data = json.loads(read_child_file(record, MAX_RECORD_BYTES))
            pid, token = int(data["pid"]), str(data["token"])
            if not TOKEN.fullmatch(token) or token != named or pid <= 1:
                continue
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, KeyError, TypeError):
            continue  # no such process any more, or not a record of ours
        if token.encode() in cmdline.split(b"\0"):
            kill_group(pid)
            try:
                os.kill(pid, signal.SIGKILL)  # a leader that left its group
            except (ProcessLookupError, PermissionError):
                pass
            killed += 1
    return killed


def discard(path: Path) -> None:
    """Removes the name `path` (never what a link there points at); what cannot be removed (a
    folder the child made there) is left for the work folder's sweep."""
    try:
        path.unlink()
    except OSError:
        pass
