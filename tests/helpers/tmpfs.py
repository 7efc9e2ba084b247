"""A small tmpfs for full-disk tests: a real file system that really fills up, unlike a mock.

with small_tmpfs(tmp_path / "state", size_kib=2048) as mount:
    filler = fill(mount)   # now nothing more fits
    filler.unlink()        # "the operator freed space"
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

OPT_OUT = "FLOCK_SKIP_TMPFS_TESTS"
CHUNK = 4096


@contextmanager
def small_tmpfs(path: Path, size_kib: int) -> Iterator[Path]:
    """Mount a tmpfs of `size_kib` at `path` (created), unmounted on the way out whatever
    happens. Needs root (CI runs as root); without it the test fails and says so, unless
    FLOCK_SKIP_TMPFS_TESTS=1 opts out explicitly."""
    if os.environ.get(OPT_OUT) == "1":
        pytest.skip(f"{OPT_OUT}=1: tmpfs tests opted out")
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.fail(
            f"this test mounts a small tmpfs to fill it and needs root for that; `mount` said: "
            f"{mounted.stderr.strip() or mounted.returncode}; run as root or set {OPT_OUT}=1",
            pytrace=False,
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(mount: Path, leave_bytes: int = 0, name: str = "filler") -> Path:
    """Fill the file system of `mount` up to `leave_bytes` of free space; returns the filler."""
    filler = mount / name
    with open(filler, "ab", buffering=0) as out:
        try:
            while free_bytes(mount) > leave_bytes:
                out.write(b"\xa5" * min(CHUNK, free_bytes(mount) - leave_bytes))
        except OSError:
            pass  # full: exactly what was asked for when leave_bytes is 0
    return filler


def free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize
