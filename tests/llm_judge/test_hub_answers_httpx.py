"""A hostile Hub's answers under huggingface_hub 1.x (httpx, with hf_xet)
(tests/helpers/hostile_hub.py; 0.x: tests/test_hub_answers.py): a file the Hub says is
stored in Xet comes over the kit's HTTP path, capped and within its deadline, never through
hf_xet's own connections; an encoded file answer is refused; an answer the library cannot use
is the sender's."""

from __future__ import annotations

import importlib.util
import threading
import time

import pytest

from tests.helpers.hostile_hub import (
    COMMIT,
    a_gzip_bomb_for_an_unlisted_base_file_is_refused,
    an_odd_hub_answer_is_the_senders,
    use_hub,
    xet_hub,
)
from tests.helpers.hostile_server import HostileServer

# The download ends in moments over HTTP: far past it, a Xet download is one nothing ends.
WAIT_S = 60.0


def test_a_file_stored_in_xet_comes_over_the_capped_http_path(tmp_path, monkeypatch):
    # huggingface_hub 1.5 depends on hf_xet and handed such a file to its Rust downloader,
    # past the deadline and the cap: a storage that never answered held a download with a
    # 3 s deadline past 195 s; one that streamed grew the process 67 -> 829 MiB.
    from validator.kit import hub  # noqa: PLC0415 - after HF_HOME

    assert importlib.util.find_spec("hf_xet"), "the stack has no hf_xet: this test proves nothing"
    body = b'{"a": 1}'
    with (
        HostileServer(lambda _request: iter(())) as cas,
        HostileServer(xet_hub(cas, body)) as server,
    ):
        use_hub(monkeypatch, tmp_path, server)
        monkeypatch.setattr(hub, "HUB_CALL_DEADLINE_S", 30.0)
        done: list[object] = []

        def fetch() -> None:
            try:
                done.append(hub.download(
                    "org/repo", "config.json", "submission org/repo", submission=True,
                    size=len(body), revision=COMMIT, local_dir=tmp_path / "work",
                    force_download=True, token="hf_x",
                ))  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - what it raised is the test's to say
                done.append(exc)

        # In a thread: a download handed to hf_xet is one the test could not end.
        thread = threading.Thread(target=fetch, daemon=True)
        thread.start()
        end = time.monotonic() + WAIT_S
        while thread.is_alive() and not cas.requests and time.monotonic() < end:
            thread.join(0.1)
        assert cas.requests == [], "the Xet storage was asked for the file"
        assert len(done) == 1 and not isinstance(done[0], Exception), done
        assert done[0].read_bytes() == body
        gets = [r.path for r in server.requests if r.method == "GET" and "/resolve/" in r.path]
        assert gets == [f"/org/repo/resolve/{COMMIT}/config.json"]


def test_a_gzip_bomb_for_an_unlisted_base_file_is_refused_under_httpx(tmp_path, monkeypatch):
    a_gzip_bomb_for_an_unlisted_base_file_is_refused(tmp_path, monkeypatch)


@pytest.mark.parametrize(
    ("where", "submission"),
    [("file", True), ("loop", True), ("short", True), ("loop", False), ("pointer", False)],
)
def test_an_answer_the_library_cannot_use_is_the_senders_under_httpx(
    tmp_path, monkeypatch, where, submission
):
    an_odd_hub_answer_is_the_senders(tmp_path, monkeypatch, where, submission)
