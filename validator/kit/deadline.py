"""An overall deadline for an outbound download, whatever library makes it (requests for the
validation sets, huggingface_hub's requests or httpx for the Hub).

Clients bound each read, never a whole answer: a server that sends one byte every few seconds
holds a read-timeout-bounded download for ever (issue 23, item 4). Python cannot interrupt a
thread blocked in `recv`, but another thread can shut its socket down, which ends the read at
once. So `overall_deadline` records every socket that the calling thread connects while it is
active (through the interpreter's `socket.connect` audit event, which every client library's
connect goes through) and a watchdog timer shuts them down when the deadline passes; a connect
attempted after that fails at once. The library then raises its own connection error (or
returns truncated data), and the context raises TransientError naming what was downloaded and
the deadline, whatever the library did.

Only the calling thread's sockets are recorded: a download that a library hands to worker
threads (huggingface_hub's snapshot_download) is not covered.
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from validator.errors import DeadlinePassed, TransientError


@dataclass
class _Watch:
    what: str
    seconds: float
    outer: _Watch | None = None  # a deadline around this one: it covers these sockets too
    expired: bool = False
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

    def expire(self) -> None:
        with self.lock:
            self.expired = True
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


@contextmanager
def overall_deadline(seconds: float, what: str) -> Iterator[None]:
    """Runs the body with an overall deadline of `seconds` for its downloads (the sockets this
    thread connects); past it, raises TransientError naming `what` and the deadline, whether
    the body failed from the shut socket or returned."""
    _install_hook()
    outer = getattr(_local, "watch", None)
    watch = _Watch(what, seconds, outer)
    timer = threading.Timer(seconds, watch.expire)
    timer.daemon = True
    _local.watch = watch
    timer.start()
    try:
        yield
    except Exception as exc:
        if watch.expired:
            raise _passed(watch) from exc
        raise
    finally:
        timer.cancel()
        _local.watch = outer
    if watch.expired:
        raise _passed(watch)


def _passed(watch: _Watch) -> TransientError:
    return TransientError(f"{watch.what}: not complete within its {watch.seconds:g} s deadline")
