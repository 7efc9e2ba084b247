"""The validator's side of the pre-imported child servers (validator/sandbox/child_entry.py): one
server per preload tuple and child environment, started on first use, shared by every thread
of the validator, shut down at exit. A child then costs a fork of a process that has already
imported transformers, not a fresh interpreter importing it (seconds each).

- The server is a fresh `python -I` started with the child's clean environment (PATH, a HOME of
  its own, the caller's variables, one thread for the numeric libraries): it never held a
  secret, so a child forked from it finds none in the memory or the environment it inherits.
- It is started from one long-lived thread of ours: its parent-death signal follows the thread
  that started it, and a runner thread that ends must not take the server along.
- It gets its own session, and the parent-death signal: the validator's death ends it, and
  its own ends its children.
- Each request travels with its own connection (a socket pair, one end passed to the server),
  so threads never share a reply stream; only the sending of requests is serialised.
- A server that cannot start, or dies, is reported in one warning line; the caller then runs
  today's fresh process. A preload tuple whose server failed MAX_STARTS times keeps the fresh
  path for the rest of the process.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import os
import queue
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from validator.sandbox import child_entry, protocol

log = logging.getLogger(__name__)

ENTRY = Path(child_entry.__file__).resolve()
# The numeric libraries read these when they load (in the server): one thread, as a fork
# copies only the thread that forks. A caller's own value wins.
THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
START_SECONDS = 180.0  # the imports, on a busy machine
MAX_STARTS = 3
POLL_SECONDS = 0.05
HOME_PREFIX = "flock-child-server-"  # then the validator's pid

Key = tuple[tuple[str, ...], tuple[tuple[str, str], ...]]


class ServerGone(Exception):
    """The server could not take the request, or died before the child's end was known."""


class ChildServer:
    def __init__(self, key: Key) -> None:
        self.key = key
        _sweep_homes()
        self.home = Path(tempfile.mkdtemp(prefix=f"{HOME_PREFIX}{os.getpid()}-"))
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        preload, env = key
        command = [
            sys.executable,
            "-I",
            str(ENTRY),
            "serve",
            str(theirs.fileno()),
            str(os.getpid()),
            child_entry.PLACEHOLDER,
            *preload,
        ]
        server_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            **THREAD_ENV,
            **dict(env),
        }
        stderr = open(self.home / "server.stderr", "wb")  # noqa: SIM115 - the child keeps it
        try:
            self.process: subprocess.Popen = _keeper_call(
                lambda: subprocess.Popen(
                    command,
                    cwd=self.home,
                    env=server_env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    pass_fds=[theirs.fileno()],
                    start_new_session=True,
                )
            )
        finally:
            stderr.close()
            theirs.close()
        self.send_lock = threading.Lock()
        self.read_lock = threading.Lock()
        self.ready = threading.Event()
        self.failure: str | None = None

    def wait_ready(self, beat: Callable[[], None], beat_every: float) -> None:
        """Waits for the server's `ready` (its imports done), beating the heartbeat; ServerGone
        if it says anything else, ends, or takes longer than START_SECONDS."""
        deadline = time.monotonic() + START_SECONDS
        next_beat = time.monotonic() + beat_every
        while not self.ready.is_set():
            if self.failure is not None:
                raise ServerGone(self.failure)
            if self.read_lock.acquire(blocking=False):
                try:
                    self._read_ready()
                finally:
                    self.read_lock.release()
            else:
                self.ready.wait(POLL_SECONDS)
            now = time.monotonic()
            if not self.ready.is_set() and self.failure is None and now >= deadline:
                self.failure = f"not ready after {START_SECONDS:g} s"
            if now >= next_beat:
                beat()
                next_beat = now + beat_every

    def _read_ready(self) -> None:
        if self.ready.is_set() or self.failure is not None:
            return
        readable, _, _ = select.select([self.control], [], [], POLL_SECONDS)
        if readable:
            message = self.control.recv(protocol.MAX_REPLY_BYTES)
            if message == protocol.READY:
                self.ready.set()
            else:
                self.failure = protocol.reason(message.decode(errors="replace")) or self._ended()
        elif self.process.poll() is not None:
            self.failure = self._ended()

    def _ended(self) -> str:
        code = self.process.poll()
        try:
            tail = (self.home / "server.stderr").read_text(errors="replace").strip()
        except OSError:
            tail = ""
        last = tail.splitlines()[-1:] or ["no error output"]
        return f"ended (exit {code}): {last[0][-300:]}"

    def alive(self) -> bool:
        return self.failure is None and self.process.poll() is None

    def start_child(self, request: protocol.ServedRequest, stderr_fd: int) -> socket.socket:
        """Asks for one child; returns the connection on which its pid, then its end, come."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self.send_lock:
                socket.send_fds(
                    self.control, [protocol.encode(request)], [theirs.fileno(), stderr_fd]
                )
        except OSError as exc:
            ours.close()
            raise ServerGone(f"the request did not reach it: {exc}") from exc
        finally:
            theirs.close()
        return ours

    def stop(self) -> None:
        """Closes the control socket (the server kills its children and exits), then waits."""
        self.control.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.home, ignore_errors=True)


def _sweep_homes() -> None:
    """Removes the homes of servers whose validator is gone (one killed leaves its server's)."""
    for home in Path(tempfile.gettempdir()).glob(f"{HOME_PREFIX}*-*"):
        owner = home.name[len(HOME_PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            shutil.rmtree(home, ignore_errors=True)


# --- the servers of this process ----------------------------------------------------------------

_lock = threading.Lock()
_servers: dict[Key, ChildServer] = {}
_starts: dict[Key, int] = {}
_keeper: tuple[int, queue.SimpleQueue] | None = None
_at_exit = False


def server_for(
    preload: tuple[str, ...], env: dict[str, str], beat: Callable[[], None], beat_every: float
) -> ChildServer | None:
    """The ready server for `preload` and `env` (started if need be), or None: the caller runs
    a fresh process (one warning line said why, when a server failed)."""
    global _at_exit
    key: Key = (tuple(preload), tuple(sorted(env.items())))
    with _lock:
        server = _servers.get(key)
        if server is not None and not server.alive() and server.ready.is_set():
            _retire(key, server, "ended")
            server = None
        if server is None:
            if _starts.get(key, 0) >= MAX_STARTS:
                return None
            _starts[key] = _starts.get(key, 0) + 1
            try:
                server = ChildServer(key)
            except OSError as exc:
                log.warning("child server for preload %s could not start: %s", preload, exc)
                return None
            _servers[key] = server
            if not _at_exit:
                atexit.register(shutdown)
                _at_exit = True
    try:
        server.wait_ready(beat, beat_every)
    except ServerGone as exc:
        with _lock:
            if _servers.get(key) is server:
                _retire(key, server, str(exc))
        return None
    return server


def report_gone(server: ChildServer, why: str) -> None:
    """A server that died under a child: retired with one warning line."""
    with _lock:
        if _servers.get(server.key) is server:
            _retire(server.key, server, why)


def _retire(key: Key, server: ChildServer, why: str) -> None:
    del _servers[key]
    log.warning(
        "child server for preload %s failed (%s); children start as fresh processes%s",
        key[0],
        why,
        " from now on" if _starts.get(key, 0) >= MAX_STARTS else " until it restarts",
    )
    server.failure = server.failure or why
    threading.Thread(target=server.stop, daemon=True).start()


def shutdown() -> None:
    """Stops every server (at exit): each kills the children it still runs."""
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.stop()


def _keeper_call(start: Callable[[], subprocess.Popen]) -> subprocess.Popen:
    """Runs `start` on the keeper thread, which lives as long as the process."""
    global _keeper
    with _keeper_lock:
        if _keeper is None or _keeper[0] != os.getpid():
            jobs: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_keep, args=(jobs,), name="child-servers", daemon=True).start()
            _keeper = (os.getpid(), jobs)
        jobs = _keeper[1]
    future: concurrent.futures.Future = concurrent.futures.Future()
    jobs.put((start, future))
    return future.result()


_keeper_lock = threading.Lock()


def _keep(jobs: queue.SimpleQueue) -> None:
    while True:
        start, future = jobs.get()
        try:
            future.set_result(start())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            future.set_exception(exc)


def _forget_after_fork() -> None:
    """A forked copy of the validator starts its own servers (the sockets are the parent's)."""
    global _lock, _keeper_lock
    _lock, _keeper_lock = threading.Lock(), threading.Lock()
    _servers.clear()
    _starts.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
