"""The one overall deadline for every outbound call, whatever library makes it: clients bound
each read, never a whole answer, and a server that sends a byte every few seconds would hold a
call for ever. `overall_deadline` records the sockets its thread connects, and a watcher shuts
them down at the deadline, or `stop_grace` after the stop event is set (`set_stop_event`); the
call then raises CallAbandoned, a TransientError. How and why: docs/internals.md, "The overall
deadline".
"""

from __future__ import annotations

import math
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from validator.errors import DeadlinePassed, TransientError

# A call in progress when the stop event is set gets this long to end by itself.
STOP_GRACE_S = 2.0
# How often a watcher looks at the stop event (an Event cannot be waited on with another).
POLL_S = 0.1
WATCHER_NAME = "outbound-deadline"


class CallAbandoned(TransientError):
    """An outbound call ended by its overall deadline, or by the stop event (`stopped`)."""

    def __init__(self, message: str, *, stopped: bool = False) -> None:
        super().__init__(message)
        self.stopped = stopped


class CallOverLimit(CallAbandoned):
    """An outbound call ended by its `guard` (overall_deadline): the caller decides whose fault
    that is; left uncaught it is transient, as any abandoned call."""


_NEVER = threading.Event()  # the stop event outside the validator's loop: never set
_process_stop = _NEVER


def set_stop_event(stop: threading.Event | None) -> None:
    """The event that ends every outbound call made without a `stop` of its own (the loop's
    signal handlers set it); None: none."""
    global _process_stop
    _process_stop = _NEVER if stop is None else stop


def stop_event() -> threading.Event:
    """The process's stop event (an event that is never set outside the validator's loop)."""
    return _process_stop


def wait_or_stop(seconds: float, what: str) -> None:
    """Waits `seconds` (a backoff before a retry), or raises CallAbandoned(stopped=True) as
    soon as the process's stop event is set."""
    if _process_stop.wait(max(seconds, 0.0)):
        raise CallAbandoned(f"{what}: not tried again: stopping", stopped=True)


@dataclass
class _Watch:
    what: str
    seconds: float
    outer: _Watch | None = None  # a deadline around this one: it covers these sockets too
    expired: bool = False
    stopped: bool = False  # expired by the stop event, not the deadline
    over: str | None = None  # expired by the guard, which said this
    # (socket object, its file descriptor, the address it connected to); see _shut.
    sockets: list[tuple[socket.socket, int, object]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, sock: socket.socket, address: object) -> None:
        with self.lock:
            if self.expired:
                raise DeadlinePassed(f"{self.what}: past its {self.seconds:g} s deadline")
            self.sockets.append((sock, sock.fileno(), address))
        if self.outer is not None:
            self.outer.add(sock, address)

    def expire(self, stopped: bool = False, over: str | None = None) -> None:
        with self.lock:
            self.expired, self.stopped, self.over = True, stopped, over
            for sock, fd, address in self.sockets:
                _shut(sock, fd, address)


_local = threading.local()
_hook_lock = threading.Lock()
_hook_installed = False


def _audit(event: str, args: tuple) -> None:
    # Called for every audit event of the process: the first comparison keeps it cheap.
    if event != "socket.connect":
        return
    watch: _Watch | None = getattr(_local, "watch", None)
    if watch is not None:
        watch.add(args[0], args[1])


def _install_hook() -> None:
    global _hook_installed
    with _hook_lock:
        if not _hook_installed:
            sys.addaudithook(_audit)  # cannot be removed; it does nothing outside a deadline
            _hook_installed = True


def _shut(sock: socket.socket, fd: int, address: object) -> None:
    """Ends every read and write on the connection. A TLS client hands the socket's descriptor
    to an SSLSocket (the recorded object then has none), so the descriptor is reached through a
    duplicate, after checking that it still leads to the same peer (descriptors are reused)."""
    try:
        if sock.fileno() != -1:
            sock.shutdown(socket.SHUT_RDWR)
            return
        with socket.socket(fileno=_dup(fd)) as twin:
            if _same_peer(twin, address):
                twin.shutdown(socket.SHUT_RDWR)  # acts on the connection, not the descriptor
    except OSError:
        pass  # closed already, or not connected: nothing to end


def _dup(fd: int) -> int:
    import os  # noqa: PLC0415 - only on this rare path

    return os.dup(fd)


def _same_peer(sock: socket.socket, address: object) -> bool:
    try:
        peer = sock.getpeername()
    except OSError:
        return False
    return isinstance(address, tuple) and tuple(peer[:2]) == tuple(address[:2])


def _watch_over(
    watch: _Watch,
    done: threading.Event,
    stop: threading.Event,
    grace: float,
    guard: Callable[[], str | None] | None = None,
) -> None:
    """The watcher: expires `watch` at its deadline, `grace` after `stop` is set, or as soon as
    `guard` (asked every POLL_S) gives a reason, unless the body is `done` first."""
    end = time.monotonic() + watch.seconds
    stop_by = math.inf
    while True:
        if guard is not None and (reason := guard()) is not None:
            watch.expire(over=reason)
            return
        now = time.monotonic()
        if stop_by == math.inf and stop.is_set():
            stop_by = now + grace
        by = min(end, stop_by)
        if now >= by:
            watch.expire(stopped=stop_by <= end)
            return
        # Until the stop event is set, it is looked at every POLL_S (unless it never can be).
        polled = guard is not None or (stop is not _NEVER and stop_by == math.inf)
        wait = min(by - now, POLL_S) if polled else by - now
        if done.wait(wait):
            return


@contextmanager
def overall_deadline(
    seconds: float,
    what: str,
    *,
    stop: threading.Event | None = None,
    stop_grace: float = STOP_GRACE_S,
    guard: Callable[[], str | None] | None = None,
) -> Iterator[None]:
    """Runs the body with an overall deadline of `seconds` for its outbound calls (the sockets
    this thread connects), ended also `stop_grace` seconds after `stop` (default: the process's
    stop event) is set; past either, raises CallAbandoned (a TransientError) naming `what`,
    whether the body failed from the shut socket or returned. `guard`, asked every POLL_S from
    the watcher thread, ends the calls the same way when it gives a reason (a download grown
    past its listed size): CallOverLimit with that reason."""
    _install_hook()
    outer = getattr(_local, "watch", None)
    watch = _Watch(what, seconds, outer)
    done = threading.Event()
    watcher = threading.Thread(
        target=_watch_over,
        args=(watch, done, _process_stop if stop is None else stop, stop_grace, guard),
        name=WATCHER_NAME,
        daemon=True,
    )
    _local.watch = watch
    watcher.start()
    try:
        yield
    except Exception as exc:
        if watch.expired:
            raise _abandoned(watch) from exc
        raise
    finally:
        done.set()
        _local.watch = outer
        watcher.join()  # at once: it only waits on `done`
    if watch.expired:
        raise _abandoned(watch)


def _abandoned(watch: _Watch) -> CallAbandoned:
    if watch.over is not None:
        return CallOverLimit(f"{watch.what}: {watch.over}")
    if watch.stopped:
        return CallAbandoned(f"{watch.what}: abandoned: stopping", stopped=True)
    return CallAbandoned(f"{watch.what}: not complete within its {watch.seconds:g} s deadline")
