"""A raw HTTP server on 127.0.0.1 for hostile answers: it answers each
request with whatever bytes a test's `respond(request)` yields, as they come (bytes are sent, a
number is a pause in seconds), so an answer can be malformed, trickled, compressed or endless in
ways a well-behaved server library would not send. It records each request and how many bytes
of answers it managed to send (a send that fails: the client went away). A TLS hello is closed
at once, so that a client that tries https first (the Docker engine, for a registry on
127.0.0.1) goes on to plain http without waiting out its handshake."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Request:
    line: str  # "GET /path HTTP/1.1"
    head: bytes  # the request line and headers
    body: bytes

    @property
    def method(self) -> str:
        return self.line.split(" ", 1)[0]

    @property
    def path(self) -> str:
        return self.line.split(" ")[1]

    def header(self, name: str) -> str | None:
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.lower().encode():
                return value.strip().decode("latin-1")
        return None


Respond = Callable[[Request], Iterable[bytes | float]]


@dataclass
class HostileServer:
    respond: Respond
    requests: list[Request] = field(default_factory=list)
    sent: int = 0  # bytes of answers sent, all connections together
    cut_off: threading.Event = field(default_factory=threading.Event)  # a client went away
    _sock: socket.socket | None = None

    def __enter__(self) -> HostileServer:
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        threading.Thread(target=self._accept, daemon=True, name="hostile-server").start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._sock is not None:
            self._sock.close()

    @property
    def port(self) -> int:
        assert self._sock is not None
        return self._sock.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        assert self._sock is not None
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            request = _read_request(conn)
            if request is None:
                return
            self.requests.append(request)
            try:
                for part in self.respond(request):
                    if isinstance(part, (int, float)):
                        time.sleep(part)
                        continue
                    conn.sendall(part)
                    self.sent += len(part)
            except OSError:
                self.cut_off.set()


TLS_HANDSHAKE = b"\x16"


def _read_request(conn: socket.socket) -> Request | None:
    if conn.recv(1, socket.MSG_PEEK) == TLS_HANDSHAKE:
        return None
    data = b""
    while b"\r\n\r\n" not in data:
        got = conn.recv(65536)
        if not got:
            return None
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    request = Request(head.split(b"\r\n")[0].decode("latin-1"), head, b"")
    length = int(request.header("Content-Length") or 0)
    while len(body) < length:
        got = conn.recv(65536)
        if not got:
            break
        body += got
    return Request(request.line, head, body)


def answer(body: bytes, status: str = "200 OK", headers: Iterable[str] = ()) -> bytes:
    """A whole HTTP/1.1 answer with a Content-Length, on a connection the server then closes
    (it answers one request per connection: a client must not send another on it)."""
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", "Connection: close", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def chunked_with_trailers(trailers: int, body: bytes = b'[{"id": 1}]') -> Respond:
    """A chunked answer of `body`, then `trailers` bytes of trailer fields (lines of 60 kB:
    http.client and urllib3 take each line up to 64 KiB, and any number of them)."""

    def respond(_request: Request) -> Iterable[bytes]:
        yield b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        yield b"%x\r\n%s\r\n0\r\n" % (len(body), body)
        line = b"X-Pad: " + b"a" * 60_000 + b"\r\n"
        for _ in range(trailers // len(line)):
            yield line
        yield b"\r\n"

    return respond
