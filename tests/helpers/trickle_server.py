"""A real HTTP server on 127.0.0.1 that answers every GET with a body sent one byte at a time,
a pause between bytes: a server that per-read timeouts never end. It answers HEAD as a Hub
answers for a file (commit, ETag, size), so that huggingface_hub downloads from it too, and it
records when a client closed a connection on it (a send failed) and how many connections it
accepted. A path with `/quick` in it is answered at once (QUICK_BODY), on a kept-alive
connection, as a Hub answers a small file before the slow one."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from devkit.local_server import LocalHTTPServer

COMMIT = "c" * 40
QUICK_BODY = b"abc"


@dataclass
class Trickle:
    url: str
    size: int = 10_000  # the declared body: far more bytes than a test waits for
    pause_s: float = 0.2
    gets: list[str] = field(default_factory=list)
    closed: threading.Event = field(default_factory=threading.Event)  # a client went away
    connections: int = 0  # accepted so far
    stop: threading.Event = field(default_factory=threading.Event)


@contextmanager
def trickle_server(size: int = 10_000, pause_s: float = 0.2) -> Iterator[Trickle]:
    state = Trickle("", size, pause_s)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

        def setup(self) -> None:
            super().setup()
            state.connections += 1

        def _head(self) -> None:
            quick = "/quick" in self.path
            self.send_response(200)
            self.send_header("Content-Length", str(len(QUICK_BODY) if quick else state.size))
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", '"quick"' if quick else '"trickle"')
            self.end_headers()

        def do_HEAD(self) -> None:  # noqa: N802
            self._head()

        def do_GET(self) -> None:  # noqa: N802
            state.gets.append(self.path)
            self._head()
            if "/quick" in self.path:
                self.wfile.write(QUICK_BODY)
                return
            try:
                for _ in range(state.size):
                    if state.stop.is_set():
                        return
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(state.pause_s)
            except OSError:  # the client shut or closed the connection
                state.closed.set()

    server = LocalHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.stop.set()
        server.shutdown()
        server.server_close()


# Far above what a shut connection takes to be seen, on any machine: an upper bound only.
SEEN_CLOSED_S = 60.0


def hub_download_meets_its_deadline(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """validator/kit/hub.py's download from a Hub that trickles the file ends at the (shrunk)
    overall deadline with TransientError, and the connection is closed: shared by the tests
    under huggingface_hub 0.x (requests) and 1.x (httpx)."""
    from validator.errors import TransientError
    from validator.kit import hub

    with trickle_server() as trickle:
        monkeypatch.setenv("HF_ENDPOINT", trickle.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp / "cache"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setattr(hub, "HUB_CALL_DEADLINE_S", 1.0)
        with pytest.raises(TransientError) as caught:
            hub.download(
                "alice/slow", "model.safetensors", "submission alice/slow", submission=True,
                size=None, revision=COMMIT, local_dir=tmp / "dest", force_download=True,
            )  # fmt: skip
        message = str(caught.value)
        assert "model.safetensors" in message and trickle.url in message, message
        assert "not complete within its 1 s deadline" in message, message
        assert any("/alice/slow/resolve/" in path for path in trickle.gets), trickle.gets
        assert trickle.closed.wait(SEEN_CLOSED_S), "the server never saw the connection closed"


def hub_reused_connection_meets_its_deadline(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A quick Hub file, then a trickled one from the same server: the second ends at the
    overall deadline although the library would reuse the first one's kept-alive connection,
    which the deadline (it covers the sockets connected within it) would not see. The
    download runs in a thread so that a deadline that does not hold fails the test instead of
    hanging it."""
    from validator.errors import TransientError
    from validator.kit import hub

    with trickle_server() as trickle:
        monkeypatch.setenv("HF_ENDPOINT", trickle.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp / "cache"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setattr(hub, "HUB_CALL_DEADLINE_S", 1.0)

        def fetch(name: str) -> Path:
            return hub.download(
                "alice/m", name, "submission alice/m", submission=True, size=None,
                revision=COMMIT, local_dir=tmp / "dest", force_download=True,
            )  # fmt: skip

        quick: list[bytes] = []
        ended: list[BaseException] = []

        def both() -> None:  # one thread: huggingface_hub 0.x keeps a session per thread
            quick.append(fetch("quick.json").read_bytes())
            try:
                fetch("model.safetensors")
            except BaseException as exc:  # noqa: BLE001 - handed to the test below
                ended.append(exc)

        thread = threading.Thread(target=both, daemon=True)
        thread.start()
        thread.join(SEEN_CLOSED_S)
        assert quick == [QUICK_BODY]
        assert not thread.is_alive(), "the trickled download outlived its 1 s deadline"
        assert len(ended) == 1 and isinstance(ended[0], TransientError), ended
        assert "not complete within its 1 s deadline" in str(ended[0])
        assert any(path.endswith("/model.safetensors") for path in trickle.gets), trickle.gets
