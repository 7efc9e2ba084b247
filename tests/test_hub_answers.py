"""A hostile Hub's answers under huggingface_hub 0.x (requests)
(tests/helpers/hostile_hub.py; 1.x: tests/llm_judge/test_hub_answers_httpx.py): a base model's
file without a listed size is never read uncapped, an encoded file answer is refused, and an
answer the library cannot use is the sender's, not an error of the module."""

from __future__ import annotations

from pathlib import Path

import pytest

from devkit.hf_hub import LocalHub
from tests.helpers.hostile_hub import (
    a_gzip_bomb_for_an_unlisted_base_file_is_refused,
    an_odd_hub_answer_is_the_senders,
)
from validator.errors import TransientError
from validator.kit.base_models import fetch_base_model


def test_a_gzip_bomb_for_an_unlisted_base_file_is_refused(tmp_path, monkeypatch):
    a_gzip_bomb_for_an_unlisted_base_file_is_refused(tmp_path, monkeypatch)


# A submission's files go to a work folder (the commit names no pointer there); a base's to the
# HF cache.
ODD_ANSWERS = [
    *[(where, True) for where in ("file", "loop", "short", "negative")],
    *[(where, False) for where in ("file", "loop", "short", "negative", "pointer")],
]


@pytest.mark.parametrize(("where", "submission"), ODD_ANSWERS)
def test_an_answer_the_library_cannot_use_is_the_senders(tmp_path, monkeypatch, where, submission):
    an_odd_hub_answer_is_the_senders(tmp_path, monkeypatch, where, submission)


def test_a_base_file_the_listing_gives_no_size_for_is_never_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With no listed size, fetch_base_model's cap would be None (sizes.get(name)): uncapped.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with LocalHub(tmp_path / "hub") as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        hub.add_repo("org/base", {"config.json": b"{}", "model.safetensors": b"x" * 8})
        hub.list_size("org/base", "config.json", None)
        with pytest.raises(TransientError, match="the Hub listing has no size for config.json"):
            fetch_base_model("org/base")
        assert hub.file_requests("GET") == [] and hub.file_requests("HEAD") == []
