"""What a hash lock (`make lock`, devkit/lock.py) pins, read back for the tests."""

from __future__ import annotations

import re

import pytest
from packaging.utils import canonicalize_name

ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)(?: ;\s*(.+?))?(?: \\)?$")


def pins(text: str) -> list[tuple[str, str, str | None, list[str]]]:
    """(name, version, marker, hashes) of every pin of a lock; a universal lock (the host's)
    may pin a package once per Python, under markers."""
    found: list[tuple[str, str, str | None, list[str]]] = []
    for line in text.splitlines():
        match = ENTRY.match(line)
        if match:
            found.append((canonicalize_name(match.group(1)), match.group(2), match.group(3), []))
        elif line.strip().startswith("--hash=sha256:") and found:
            found[-1][3].append(line.strip().removeprefix("--hash=sha256:").rstrip(" \\"))
        elif line.strip() and not line.lstrip().startswith("#"):
            pytest.fail(f"a line that is not a pin or a hash: {line!r}")
    return found


def entries(text: str) -> dict[str, str]:
    """name -> version of a lock for one platform: each package pinned once."""
    found = {name: version for name, version, _, _ in pins(text)}
    assert len(found) == len(pins(text)), "a package pinned twice"
    return found
