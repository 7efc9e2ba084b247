"""A shared Hugging Face cache kept under a budget (`--hf-cache-max-gb`,
VALIDATOR_HF_CACHE_MAX_GB): the least recently used base models are evicted through
huggingface_hub's cache API, never one that a worker on this host is using (`base_in_use`: a
shared flock per repo, which the evictor must take exclusively). How and why: docs/internals.md,
"The shared HF cache's budget".
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from huggingface_hub import CachedRepoInfo, scan_cache_dir
from huggingface_hub.errors import CacheNotFound

from validator.run_context import BYTES_PER_GB, current_run

log = logging.getLogger(__name__)

IN_USE_DIR = Path(".locks") / "flock-in-use"
# Held (exclusively, waiting) by one evictor at a time on the whole cache: two workers evicting
# at once would each count the other's deletions as still there and delete more than needed.
EVICTING_LOCK = "evicting.lock"


def budget_bytes() -> int | None:
    """The cache budget of this run (--hf-cache-max-gb; VALIDATOR_HF_CACHE_MAX_GB outside a
    run, read on every call like the library's own settings); None when unset."""
    return current_run().hf_cache_budget_bytes()


def in_use_path(cache: Path, repo_id: str) -> Path:
    return cache / IN_USE_DIR / f"models--{repo_id.replace('/', '--')}.lock"


def _open_lock(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)


def _touch(fd: int) -> None:
    try:
        os.utime(fd)  # the last use, for recency
    except OSError:
        pass  # a lock file of another user on a shared volume: recency falls back to atime


@contextmanager
def base_in_use(cache: Path, repo_id: str) -> Iterator[None]:
    """`repo_id` is in use by this process inside the block: no evictor deletes it. Waits while
    an evictor is deleting it (a deletion takes moments; the caller then downloads it again)."""
    fd = _open_lock(in_use_path(cache, repo_id))
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        _touch(fd)
        yield
        _touch(fd)
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def _exclusive(path: Path, wait: bool) -> Iterator[bool]:
    """True inside the block when the lock at `path` is held exclusively; False (not held) when
    `wait` is off and another process holds it."""
    fd = _open_lock(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _last_used(cache: Path, repo: CachedRepoInfo) -> float:
    try:
        marked = in_use_path(cache, repo.repo_id).stat().st_mtime
    except OSError:
        marked = 0.0
    return max(repo.last_accessed, marked)


def _scan(cache: Path) -> tuple[int, list[CachedRepoInfo]]:
    """(bytes the cache holds, its model repos)."""
    try:
        info = scan_cache_dir(cache)
    except CacheNotFound:
        return 0, []
    return info.size_on_disk, [repo for repo in info.repos if repo.repo_type == "model"]


def _delete(cache: Path, repo_id: str) -> int:
    """Deletes the folder of `repo_id` (its lock held exclusively), every revision in it; the
    bytes freed. Scanned again under the lock: the earlier scan may predate a revision another
    worker added.

    `HFCacheInfo.delete_revisions` finds revisions by commit hash across the whole cache and
    takes the first repo holding each hash: a mirror or a fork of a base shares its commits, so
    asked for the idle copy it may delete the one another worker holds. Asked on a scan cut down
    to this one repo it can only name this repo's folder, which is checked before anything goes.
    """
    info = scan_cache_dir(cache)
    for repo in info.repos:
        if repo.repo_type == "model" and repo.repo_id == repo_id:
            only_this = dataclasses.replace(info, repos=frozenset({repo}), warnings=[])
            strategy = only_this.delete_revisions(*(r.commit_hash for r in repo.revisions))
            if strategy.repos != {repo.repo_path} or strategy.snapshots or strategy.blobs:
                raise OSError(f"the deletion of {repo_id} would reach past {repo.repo_path}")
            strategy.execute()
            if repo.repo_path.exists():  # the library logs and swallows a permission error
                raise OSError(f"{repo.repo_path} could not be deleted whole")
            log.info(
                "HF cache: evicted %s, least recently used: its folder %s (%s, %s)",
                repo_id, repo.repo_path, _revisions(repo), _gb(repo.size_on_disk),
            )  # fmt: skip
            return repo.size_on_disk
    return 0


def _revisions(repo: CachedRepoInfo) -> str:
    """`revision 1a2b3c4d5e6f (main)`, `revisions 1a2b3c4d5e6f (main), 9f8e7d6c5b4a`."""
    named = [
        r.commit_hash[:12] + (f" ({', '.join(sorted(r.refs))})" if r.refs else "")
        for r in sorted(repo.revisions, key=lambda r: r.commit_hash)
    ]
    return f"revision{'s' if len(named) != 1 else ''} {', '.join(named) or 'none'}"


def evict(cache: Path, budget: int, room: int = 0, *, warn: bool = True) -> list[str]:
    """Deletes the least recently used model repos not in use until the cache plus `room` (bytes
    about to be downloaded) fits in `budget` bytes; the repo ids deleted. When the repos in use
    alone are over it, one warning (when `warn`) and nothing more: a full budget never fails an
    assignment. A cache that cannot be read or deleted from is a warning too."""
    try:
        with _exclusive(cache / IN_USE_DIR / EVICTING_LOCK, wait=True):
            return _evict(cache, budget, room, warn)
    except OSError as exc:
        log.warning("HF cache %s: cannot keep it under its budget: %s", cache, exc)
        return []


def _evict(cache: Path, budget: int, room: int, warn: bool) -> list[str]:
    total, repos = _scan(cache)
    evicted: list[str] = []
    if total + room <= budget:
        return evicted
    for repo in sorted(repos, key=lambda r: _last_used(cache, r)):
        if total + room <= budget:
            break
        with _exclusive(in_use_path(cache, repo.repo_id), wait=False) as unused:
            if not unused:
                continue  # a worker (this one included) holds it
            freed = _delete(cache, repo.repo_id)
        if freed:
            total -= freed
            evicted.append(repo.repo_id)
    if warn and total + room > budget:
        log.warning(
            "HF cache %s holds %s (%s more to come), over its budget of %s: what is left is in "
            "use by the workers sharing it (or not a model); going on",
            cache, _gb(total), _gb(room), _gb(budget),
        )  # fmt: skip
    return evicted


def _gb(size: int) -> str:
    return f"{size / BYTES_PER_GB:.3g} GB"
