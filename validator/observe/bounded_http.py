"""An HTTP server for the status page whose cost to the validator has a bound, whatever its
clients do: one acceptor thread on a selector, at most MAX_CONNECTIONS open (the oldest
head-less one evicted for a new one, the rest left in the kernel's backlog), a fixed pool of
WORKERS with a CPU budget each, and only GET without a body. Why each: docs/internals.md, "The
status page's server".
"""

from __future__ import annotations

import errno
import io
import logging
import queue
import select
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from validator.errors import ConfigError, describe

log = logging.getLogger(__name__)

WORKERS = 2
MAX_CONNECTIONS = 64
READ_TIMEOUT_S = 5.0  # for the whole head of a request, from the accept
WRITE_TIMEOUT_S = 10.0  # for the whole answer (sendall's timeout is overall since 3.5)
MAX_HEAD_BYTES = 16 * 1024
CPU_SHARE = 0.05  # of one core, for the workers together
LISTEN_BACKLOG = 128


@dataclass
class ServerStats:
    """What the server did, for tests and the log; counters only grow."""

    accepted: int = 0
    paused: int = 0  # times the listener was set aside at MAX_CONNECTIONS
    evicted: int = 0  # waiting for its head, closed to make room for a new connection
    timed_out: int = 0  # no complete head within READ_TIMEOUT_S
    gone: int = 0  # the client went away before or during the answer
    answered: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)


class _Connection:
    __slots__ = ("sock", "address", "deadline", "head")

    def __init__(self, sock: socket.socket, address: tuple, deadline: float) -> None:
        self.sock = sock
        self.address = address
        self.deadline = deadline  # also its order: the first accepted has the soonest
        self.head = bytearray()


class BoundedHTTPServer:
    """Serves `handler_class` (a BaseHTTPRequestHandler) on host:port with the bounds above.
    `start()` starts its threads; `stop()` ends them and closes every socket."""

    def __init__(
        self,
        host: str,
        port: int,
        handler_class: type[BaseHTTPRequestHandler],
        *,
        workers: int = WORKERS,
        max_connections: int = MAX_CONNECTIONS,
        read_timeout: float = READ_TIMEOUT_S,
        cpu_share: float = CPU_SHARE,
    ) -> None:
        self.handler_class = handler_class
        self.max_connections = max_connections
        self.read_timeout = read_timeout
        self.cpu_share = cpu_share
        self.stats = ServerStats()
        self.listener = _listen(host, port)
        self.server_address = self.listener.getsockname()
        self._open = 0  # connections held: waiting for their head, queued or being answered
        self._open_lock = threading.Lock()
        self._work: queue.Queue[_Connection | None] = queue.Queue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = threading.Event()
        self._budget = _CpuBudget(cpu_share)
        self.threads = [threading.Thread(target=self._accept_loop, name="status", daemon=True)]
        self.threads += [
            threading.Thread(target=self._work_loop, name=f"status-worker-{i}", daemon=True)
            for i in range(workers)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._wake()
        for _ in self.threads[1:]:
            self._work.put(None)
        for thread in self.threads:
            if thread.is_alive():
                thread.join(timeout)
        self._wake_w.close()

    # -- the acceptor: every connection until its head is whole

    def _accept_loop(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        listening = False
        waiting: dict[socket.socket, _Connection] = {}
        try:
            while not self._stopping.is_set():
                # The listener is watched only while a connection can be held, or can take the
                # place of one waiting for its head (see above).
                if (self._full() and not waiting) == listening:
                    if listening:
                        selector.unregister(self.listener)
                        self.stats.add("paused")
                    else:
                        selector.register(self.listener, selectors.EVENT_READ)
                    listening = not listening
                timeout = 1.0
                if waiting:
                    soonest = min(c.deadline for c in waiting.values())
                    timeout = min(timeout, max(soonest - time.monotonic(), 0.0))
                for key, _ in selector.select(timeout):
                    if key.fileobj is self.listener:
                        self._accept(selector, waiting)
                    elif key.fileobj is self._wake_r:
                        _drain(self._wake_r)
                    else:
                        self._read(selector, waiting, key.data)
                now = time.monotonic()
                for conn in [c for c in waiting.values() if c.deadline <= now]:
                    self.stats.add("timed_out")
                    log.debug("status page: %s:%s sent no request in time", *conn.address[:2])
                    self._drop(selector, waiting, conn)
        finally:
            for conn in list(waiting.values()):
                self._drop(selector, waiting, conn)
            selector.close()
            self.listener.close()
            self._wake_r.close()

    def _accept(self, selector: selectors.BaseSelector, waiting: dict) -> None:
        # What the backlog holds, as long as a connection can be held or take the place of one
        # waiting for its head: the rest stay queued in the kernel until one closes.
        while self._hold() or self._evict_oldest(selector, waiting):
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                self._release()
                return
            except OSError as exc:  # out of descriptors, say: the next select tries again
                self._release()
                log.warning("status page: accept failed: %s", describe(exc))
                return
            self.stats.add("accepted")
            sock.setblocking(False)
            conn = _Connection(sock, address, time.monotonic() + self.read_timeout)
            waiting[sock] = conn
            selector.register(sock, selectors.EVENT_READ, conn)
            # A head already there is taken now: the connection is no longer one that the next
            # accept may evict (a probe behind a backlog of half-open connections).
            self._read(selector, waiting, conn)

    def _evict_oldest(self, selector: selectors.BaseSelector, waiting: dict) -> bool:
        """Closes the connection waiting longest for its head, when the backlog holds another,
        and holds its place for that one; False when none waits or the backlog is empty."""
        if not waiting or not _readable(self.listener):
            return False
        oldest = min(waiting.values(), key=lambda c: c.deadline)
        self.stats.add("evicted")
        log.debug("status page: %s:%s closed to make room (no request yet)", *oldest.address[:2])
        self._drop(selector, waiting, oldest, wake=False)  # this thread is the one to wake
        return self._hold()  # only this thread holds places: the one just released is free

    def _read(self, selector: selectors.BaseSelector, waiting: dict, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._gone(conn, exc)
            self._drop(selector, waiting, conn)
            return
        if not data:  # closed before its request was whole
            self.stats.add("gone")
            self._drop(selector, waiting, conn)
            return
        conn.head += data
        if b"\r\n\r\n" in conn.head or b"\n\n" in conn.head:
            selector.unregister(conn.sock)
            del waiting[conn.sock]
            self._work.put(conn)
        elif len(conn.head) > MAX_HEAD_BYTES:
            host, port = conn.address[:2]
            log.info("status page: %s:%s sent a head over %d bytes", host, port, MAX_HEAD_BYTES)
            self._drop(selector, waiting, conn)

    def _drop(
        self, selector: selectors.BaseSelector, waiting: dict, conn: _Connection, wake: bool = True
    ) -> None:
        selector.unregister(conn.sock)
        del waiting[conn.sock]
        _reset(conn.sock)
        self._release(wake)

    # -- the workers: complete requests only

    def _work_loop(self) -> None:
        while True:
            conn = self._work.get()
            if conn is None:
                return
            try:
                if not self._stopping.is_set():
                    self._budget.wait()
                    with self._budget.charged():
                        self._answer(conn)
            finally:
                conn.sock.close()
                self._release()

    def _answer(self, conn: _Connection) -> None:
        try:
            conn.sock.setblocking(True)
            conn.sock.settimeout(WRITE_TIMEOUT_S)
            # RequestHead reads the head the acceptor read from `conn`, not a socket.
            self.handler_class(conn, conn.address, self)  # type: ignore[arg-type]
            self.stats.add("answered")
        except OSError as exc:  # reset, broken pipe, a client that does not read: one line
            self._gone(conn, exc)
        except Exception:  # a bug in a page: the traceback is wanted
            log.exception("status page: error answering %s:%s", *conn.address[:2])

    def _gone(self, conn: _Connection, exc: OSError) -> None:
        self.stats.add("gone")
        log.info("status page: client %s:%s went away (%s)", *conn.address[:2], describe(exc))

    # -- the cap

    def _hold(self) -> bool:
        with self._open_lock:
            if self._open >= self.max_connections:
                return False
            self._open += 1
            return True

    def _release(self, wake: bool = True) -> None:
        with self._open_lock:
            was_full = self._open >= self.max_connections
            self._open -= 1
        if was_full and wake:  # the acceptor may be waiting with the listener set aside
            self._wake()

    def _full(self) -> bool:
        with self._open_lock:
            return self._open >= self.max_connections

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # its buffer full (a wake is pending anyway) or closed at stop
            pass


class RequestHead(BaseHTTPRequestHandler):
    """A handler reading the request from the head the acceptor read: subclass it instead of
    BaseHTTPRequestHandler. The socket is written to as usual."""

    def setup(self) -> None:
        conn: _Connection = self.request
        self.request = self.connection = conn.sock
        self.rfile = io.BytesIO(bytes(conn.head))
        self.wfile = self.connection.makefile("wb", buffering=0)

    def finish(self) -> None:
        self.wfile.close()
        self.rfile.close()


class _CpuBudget:
    """The workers' CPU time over wall time, at most `share` over time: each answer's CPU time
    (its thread's) is charged, and a worker that finds the budget overdrawn sleeps it off first.
    Sleeping, not computing, is what gives the GIL back to the loop."""

    def __init__(self, share: float) -> None:
        self.share = share
        self._lock = threading.Lock()
        self._free_at = time.monotonic()  # when the time charged so far is paid off

    def wait(self) -> None:
        with self._lock:
            delay = self._free_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def charged(self) -> _Charge:
        return _Charge(self)

    def charge(self, cpu_seconds: float) -> None:
        with self._lock:
            self._free_at = max(self._free_at, time.monotonic()) + cpu_seconds / self.share


class _Charge:
    def __init__(self, budget: _CpuBudget) -> None:
        self.budget = budget
        self.started = 0.0

    def __enter__(self) -> None:
        self.started = time.thread_time()

    def __exit__(self, *_exc: object) -> None:
        self.budget.charge(time.thread_time() - self.started)


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, or a one-line operator error naming the address (item 11: a port
    in use was a traceback and exit 1)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        listener = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ConfigError(f"--http-host {host!r}: cannot listen there ({describe(exc)})") from exc
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(LISTEN_BACKLOG)
        listener.setblocking(False)
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            why = "the port is in use (another validator or service?); choose another"
        else:
            why = f"cannot listen there ({describe(exc)})"
        raise ConfigError(f"--http-port {port} on {host}: {why}") from exc
    return listener


def _readable(sock: socket.socket) -> bool:
    """Whether a read (an accept, for a listener) would not wait."""
    probe = select.poll()
    probe.register(sock, select.POLLIN)
    return bool(probe.poll(0))


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except OSError:  # nothing more to read (BlockingIOError), or closed at stop
        pass


def _reset(sock: socket.socket) -> None:
    """Close at once, with a reset: nothing lingers for a client that is being turned away."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()
