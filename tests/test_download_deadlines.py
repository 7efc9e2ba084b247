"""Overall deadlines on outbound downloads: a server that sends one byte at a
time never trips a per-read timeout, so a validation set or a Hub file served that way would hold
the validator for ever. Real trickling servers on 127.0.0.1, deadlines shrunk for the test."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.trickle_server import (
    SEEN_CLOSED_S,
    hub_download_meets_its_deadline,
    hub_reused_connection_meets_its_deadline,
    trickle_server,
)
from validator.errors import TransientError
from validator.kit import downloads
from validator.kit.downloads import fetch_validation_set
from validator.outbound import deadline
from validator.outbound.deadline import CallAbandoned, overall_deadline, set_stop_event


def test_a_trickled_validation_set_ends_at_the_overall_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(downloads, "VALIDATION_SET_DEADLINE_S", 1.0)
    with trickle_server() as trickle:
        url = f"{trickle.url}/sets/val.npz"
        with pytest.raises(TransientError) as caught:
            fetch_validation_set(url, tmp_path, max_bytes=10**6)
        assert str(caught.value) == f"validation set {url}: not complete within its 1 s deadline"
        assert trickle.gets == ["/sets/val.npz"]
        assert trickle.closed.wait(SEEN_CLOSED_S), "the server never saw the connection closed"
    assert list(tmp_path.iterdir()) == []  # neither the set nor its .part


def test_a_stop_signal_ends_a_trickled_validation_set_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The process's stop event, as the validator's signal handlers set it; the deadline is far.
    stop = threading.Event()
    set_stop_event(stop)
    monkeypatch.setattr(downloads, "VALIDATION_SET_DEADLINE_S", 120.0)
    try:
        with trickle_server() as trickle:
            url = f"{trickle.url}/sets/val.npz"
            threading.Timer(0.3, stop.set).start()
            with pytest.raises(CallAbandoned) as caught:
                fetch_validation_set(url, tmp_path, max_bytes=10**6)
            assert caught.value.stopped
            assert str(caught.value) == f"validation set {url}: abandoned: stopping"
            assert trickle.closed.wait(SEEN_CLOSED_S), "the server never saw the connection closed"
    finally:
        set_stop_event(None)
    assert list(tmp_path.iterdir()) == []


def test_a_trickled_hub_file_ends_at_the_overall_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # huggingface_hub 0.x here (requests); tests/llm_judge runs the same under 1.x (httpx).
    hub_download_meets_its_deadline(tmp_path, monkeypatch)


def test_a_trickled_hub_file_after_a_quick_one_ends_at_the_overall_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The library keeps the quick file's connection alive and would reuse it for the next.
    hub_reused_connection_meets_its_deadline(tmp_path, monkeypatch)


def test_a_connect_after_the_deadline_fails_at_once_and_a_quick_body_passes() -> None:
    with pytest.raises(TransientError, match="probe: not complete within its 0.2 s deadline"):
        with overall_deadline(0.2, "probe"):
            watch = deadline._local.watch
            for _ in range(600):  # the watchdog's timer fires (an upper bound: 60 s)
                if watch.expired:
                    break
                time.sleep(0.1)
            with socket.socket() as sock, pytest.raises(ConnectionAbortedError):
                sock.connect(("127.0.0.1", 9))
    with overall_deadline(60.0, "quick"):
        pass  # no error when the body ends in time
