"""devkit's HTTP servers run in the test process: what their handler threads print lands in
whatever test captures `sys.stderr` at that moment, so a client that went away prints nothing."""

from __future__ import annotations

import pytest

from devkit.local_server import LocalHandler, LocalHTTPServer
from devkit.simulator.server import SimulatorServer


@pytest.mark.parametrize("gone", [ConnectionResetError, BrokenPipeError, ConnectionAbortedError])
def test_a_client_gone_mid_request_prints_nothing_and_a_real_error_is_printed(capsys, gone):
    assert issubclass(SimulatorServer, LocalHTTPServer)
    server = LocalHTTPServer(("127.0.0.1", 0), LocalHandler)
    try:
        try:
            raise gone(104, "Connection reset by peer")
        except ConnectionError:
            server.handle_error(None, ("127.0.0.1", 1))
        assert capsys.readouterr().err == ""
        try:
            raise ValueError("a handler's own bug")
        except ValueError:
            server.handle_error(None, ("127.0.0.1", 1))
        printed = capsys.readouterr().err
        assert "Traceback" in printed and "ValueError: a handler's own bug" in printed
    finally:
        server.server_close()
