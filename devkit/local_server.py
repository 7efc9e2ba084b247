"""The life of devkit's HTTP servers on 127.0.0.1 (the local hub, the judge, GitHub's API, the
judge texts' source, the Fed Ledger simulator in a thread) and the replies they share.

A server object subclasses `LocalServer` and says how its requests are answered
(`_make_handler`, usually a `LocalHandler` subclass bound to it by `bind`):

    class Echo(LocalServer):
        def _make_handler(self):
            return bind(_EchoHandler, echo=self)

    with Echo() as echo:
        requests.get(echo.root_url + "/x")
"""

from __future__ import annotations

import json
import socketserver
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, TypeVar

# Seconds serve_forever waits between two looks at a shutdown request: shutdown() (once per test
# or more) takes up to this long.
POLL_S = 0.05

# A padded answer's filler (`padded_json`): the cheapest text for the most Python objects.
FILLER = b"{},"
CHUNK = 1 << 16

S = TypeVar("S", bound="LocalServer")
H = TypeVar("H", bound=type)


def serve_in_thread(
    server: socketserver.BaseServer, *, name: str | None = None, poll_interval: float = POLL_S
) -> threading.Thread:
    """Serves `server` from a daemon thread (it never keeps a process alive), started."""
    thread = threading.Thread(
        target=server.serve_forever, args=(poll_interval,), name=name, daemon=True
    )
    thread.start()
    return thread


def stop_serving(
    server: socketserver.BaseServer, thread: threading.Thread | None, timeout: float | None = None
) -> None:
    """Stops `server` served by `thread`: shutdown() returns once serve_forever has, then the
    socket is closed and the thread joined."""
    server.shutdown()
    server.server_close()
    if thread is not None:
        thread.join(timeout)


def padded_json(document: bytes, size: int) -> tuple[int, Iterator[bytes]]:
    """A hostile answer: the JSON `document` (an object or an array) with about `size` bytes
    more in it, made as it is sent (a 300 MB answer costs the server nothing): in an object a
    key "padding" holding a list of empty objects, in an array more empty objects. Returns
    (its length in bytes, its chunks)."""
    document = document.strip()
    count = max(size // len(FILLER), 1)
    empty = document[1:-1].strip() == b""
    if document.startswith(b"{"):
        head = document[:-1] + (b'"padding": [' if empty else b', "padding": [')
        tail = b"]}"
    elif document.startswith(b"["):
        head, tail = document[:-1] + (b"" if empty else b","), b"]"
    else:
        raise ValueError("only an object or an array can be padded")
    length = len(head) + count * len(FILLER) - 1 + len(tail)

    def chunks() -> Iterator[bytes]:
        yield head
        per_chunk = CHUNK // len(FILLER)
        left = count
        while left > 0:
            n = min(per_chunk, left)
            left -= n
            block = FILLER * n
            yield block if left else block[:-1]
        yield tail

    return length, chunks()


def bind(handler: H, **attrs: object) -> H:
    """A subclass of `handler` whose instances see `attrs` (the server object they answer for)."""
    return type(handler.__name__, (handler,), attrs)  # type: ignore[return-value]


class LocalHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer whose handler threads are daemons and that says nothing when a
    client goes away mid-request (a validator that timed out, a test's abandoned read):
    socketserver would print that traceback to whatever `sys.stderr` is at that moment, which
    in a test process may be another test's captured output. Other errors are printed."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class LocalServer:
    """A ThreadingHTTPServer on 127.0.0.1 at a free port, served from a daemon thread between
    `start()` (or `with`) and `stop()`. Handler threads are daemons too, so a client that
    never finishes cannot hold a test's process. The port stays known after `stop()`:
    `root_url` then names a server that is down, which a test may want to reach."""

    def __init__(self) -> None:
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    def _make_handler(self) -> Callable[..., socketserver.BaseRequestHandler]:
        """The request handler class (or factory) the server answers with."""
        raise NotImplementedError

    def __enter__(self: S) -> S:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        self._server = LocalHTTPServer(("127.0.0.1", 0), self._make_handler())
        self._port = self._server.server_address[1]
        self._thread = serve_in_thread(self._server)

    def stop(self) -> None:
        """Takes the server down (a second call does nothing)."""
        server, self._server = self._server, None
        if server is not None:
            stop_serving(server, self._thread)
            self._thread = None

    @property
    def root_url(self) -> str:
        """http://127.0.0.1:PORT"""
        assert self._port is not None, f"{type(self).__name__} is not started"
        return f"http://127.0.0.1:{self._port}"


class LocalHandler(BaseHTTPRequestHandler):
    """A request handler with the replies devkit's servers share. Quiet unless told: the servers
    keep their own logs of what they were asked."""

    quiet: ClassVar[bool] = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        if not self.quiet:
            super().log_message(format, *args)

    def start_reply(self, status: int, headers: Mapping[str, str]) -> None:
        """The status line and `headers`; the body is the caller's."""
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()

    def reply(
        self, status: int, payload: bytes, headers: Mapping[str, str], *, body: bool = True
    ) -> None:
        """`payload` with its Content-Length; `body=False` sends the headers only (HEAD)."""
        self.start_reply(status, {**headers, "Content-Length": str(len(payload))})
        if body and payload:
            self.wfile.write(payload)

    def reply_chunks(
        self, status: int, headers: Mapping[str, str], length: int, chunks: Iterable[bytes]
    ) -> int:
        """`chunks` as the body of `length` bytes; the bytes sent before the client went away
        (what a test asserts the client read at most, give or take the sockets' buffers)."""
        sent = 0
        try:
            self.start_reply(status, {**headers, "Content-Length": str(length)})
            for chunk in chunks:
                self.wfile.write(chunk)
                sent += len(chunk)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        return sent

    def reply_json(
        self, status: int, payload: object, headers: Mapping[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode()
        self.reply(status, data, {"Content-Type": "application/json", **(headers or {})})
