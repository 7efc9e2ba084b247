"""The one disk guard (validator/disk.py) words every "no room" the same way: a download that
fills its disk names the directory, what is free there and what to do, in one line, as the
journal's refusal does (tests/test_journal.py, tests/faults/test_full_disk.py). Real downloads
from servers on 127.0.0.1 into a small tmpfs that really fills up."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

import pytest

from devkit.hf_hub import LocalHub
from devkit.local_server import LocalHTTPServer
from tests.helpers.tmpfs import small_tmpfs
from validator.errors import OperatorError, Verdict, classify
from validator.kit import hub
from validator.kit.downloads import fetch_validation_set

TMPFS_KIB = 256
TOO_BIG = b"\xa5" * (1024 * 1024)  # four times the tmpfs


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """A plain file server on 127.0.0.1 serving /val.jsonl, larger than the tmpfs."""
    root = tmp_path / "served"
    root.mkdir()
    (root / "val.jsonl").write_bytes(TOO_BIG)
    server = LocalHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def assert_one_line_naming(error: BaseException, where: str, directory: Path, what: str) -> None:
    message = str(error)
    assert isinstance(error, OperatorError) and classify(error) is Verdict.OPERATOR
    assert message.startswith(f"{where} {directory} cannot take {what} ("), message
    assert "MiB free" in message and "No space left on device" in message, message
    assert message.endswith("; free space there, then rerun") and "\n" not in message


def test_a_validation_set_that_fills_its_disk_names_the_dir(tmp_path: Path, served: str) -> None:
    url = f"{served}/val.jsonl"
    with small_tmpfs(tmp_path / "work", TMPFS_KIB) as work:
        with pytest.raises(OperatorError) as caught:
            fetch_validation_set(url, work, max_bytes=len(TOO_BIG))
        assert_one_line_naming(caught.value, "download dir", work, f"validation set {url}")
        assert list(work.iterdir()) == []  # no .part left to keep the disk full


def test_a_hub_file_that_fills_its_disk_names_the_hf_cache_or_the_download_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with LocalHub(tmp_path / "hub") as local, small_tmpfs(tmp_path / "disk", TMPFS_KIB) as disk:
        local.add_repo("org/base", {"model.safetensors": TOO_BIG})
        monkeypatch.setenv("HF_ENDPOINT", local.endpoint)
        monkeypatch.setenv("HF_HUB_CACHE", str(disk / "cache"))
        # A base model into the shared cache.
        with pytest.raises(OperatorError) as caught:
            hub.download(
                "org/base", "model.safetensors", "base model org/base", submission=False,
                cache_dir=hub.cache_dir(),
            )  # fmt: skip
        assert_one_line_naming(caught.value, "HF cache", disk / "cache", "base model org/base")
        # A submission into its work folder.
        dest = disk / "work"
        with pytest.raises(OperatorError) as caught:
            hub.download(
                "org/base", "model.safetensors", "submission org/base", submission=True,
                local_dir=dest,
            )  # fmt: skip
        assert_one_line_naming(caught.value, "download dir", dest, "submission org/base")
