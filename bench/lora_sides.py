"""Each side of the CPU comparison in a process of its own, driven in alternation.

This machine's speed drifts over minutes (the same matrix product measured 135 to 225 GFLOP/s
within a minute), so running one side's assignments and then the other's biased the ratio
either way. Alternating assignment by assignment spreads the drift over both sides, and a
process per side makes each side's peak memory its own.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any


class SideFailed(RuntimeError):
    """A side raised; the message carries its traceback."""


def _serve(conn: Connection, factory: Callable[..., Any], args: tuple) -> None:
    try:
        side = factory(*args)
        conn.send(("ok", None))
    except BaseException:  # noqa: BLE001 - reported to the driver, which raises it
        conn.send(("error", traceback.format_exc()))
        return
    while (request := conn.recv()) is not None:
        method, call_args = request
        try:
            conn.send(("ok", getattr(side, method)(*call_args)))
        except BaseException:  # noqa: BLE001 - as above
            conn.send(("error", traceback.format_exc()))


class SideProcess:
    """`factory(*args)` built in a spawned process; `call` runs one of its methods there."""

    def __init__(self, name: str, factory: Callable[..., Any], *args: Any) -> None:
        self.name = name
        # spawn, not fork: the driver has already run torch's thread pools.
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, factory, args), daemon=True)
        self._process.start()
        child.close()
        self._reply()

    def call(self, method: str, *args: Any) -> Any:
        self._conn.send((method, args))
        return self._reply()

    def _reply(self) -> Any:
        try:
            status, value = self._conn.recv()
        except EOFError:
            self._process.join()
            raise SideFailed(f"{self.name}: exited with {self._process.exitcode}") from None
        if status == "error":
            raise SideFailed(f"{self.name} raised:\n{value}")
        return value

    def close(self) -> None:
        if self._process.is_alive():
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.kill()
        self._conn.close()

    def __enter__(self) -> SideProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
