"""devkit's LocalHub as a module-scoped pytest fixture's context: huggingface_hub in the test
process talks to it, with a cache of its own and no token."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from devkit.hf_hub import LocalHub


@contextmanager
def served_hub(tmp: Path) -> Iterator[LocalHub]:
    """A LocalHub under `tmp` that huggingface_hub in this process talks to, with a cache of
    its own and no token, for a module-scoped fixture (monkeypatch is function-scoped)."""
    with pytest.MonkeyPatch.context() as patch, LocalHub(tmp / "hub") as hub:
        patch.setenv("HF_ENDPOINT", hub.endpoint)
        patch.setenv("HF_HOME", str(tmp / "hf-home"))
        patch.setenv("HF_HUB_CACHE", str(tmp / "hf-home" / "hub"))
        patch.delenv("HF_TOKEN", raising=False)
        yield hub
