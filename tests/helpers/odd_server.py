"""A server on 127.0.0.1 that answers each path as a test tells it: a JSON body of any shape, or
a 200 whose body trickles a byte at a time and never ends (until the server stops). For the
doctor's bounds: a wrong shape is a failed row, a trickle a row past its deadline."""

from __future__ import annotations

import threading
from typing import Any

from devkit.local_server import LocalHandler, LocalServer

TRICKLE = object()  # the answer of a path that never finishes


class OddServer(LocalServer):
    def __init__(self, answers: dict[str, Any]) -> None:
        super().__init__()
        self.answers = answers  # path -> a JSON value, or TRICKLE
        self.asked: list[str] = []
        self.stopping = threading.Event()

    def _make_handler(self):
        server = self

        class Handler(LocalHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802
                server.asked.append(self.path)
                answer = server.answers.get(self.path.split("?")[0])
                if answer is TRICKLE:
                    self.start_reply(200, {"Content-Type": "application/json",
                                           "Content-Length": "1000000"})  # fmt: skip
                    while not server.stopping.wait(0.2):
                        try:
                            self.wfile.write(b" ")
                            self.wfile.flush()
                        except OSError:
                            return
                    self.close_connection = True
                elif answer is None:
                    self.reply_json(404, {"detail": "not here"})
                else:
                    self.reply_json(200, answer)

        return Handler

    def stop(self) -> None:
        self.stopping.set()
        super().stop()
