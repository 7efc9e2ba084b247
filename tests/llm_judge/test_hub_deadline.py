"""The Hub download's overall deadline under huggingface_hub 1.x, whose client is httpx (the
0.x one, requests, is tested in tests/test_download_deadlines.py): a Hub that trickles a file
ends at the deadline with TransientError, and the connection is closed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.trickle_server import (
    hub_download_meets_its_deadline,
    hub_reused_connection_meets_its_deadline,
)


def test_a_trickled_hub_file_ends_at_the_overall_deadline_under_httpx(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub_download_meets_its_deadline(tmp_path, monkeypatch)


def test_a_trickled_file_after_a_quick_one_ends_at_the_deadline_under_httpx(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub_reused_connection_meets_its_deadline(tmp_path, monkeypatch)
