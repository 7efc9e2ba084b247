"""The repos of devkit/hf_hub.py's LocalHub and what its HTTP side (devkit/hf_hub_http.py)
reads of them: the refs, the files and their hashes, the tokens, and the faulty or hostile
answers a test queues. LocalHub adds the test controls that set them; neither file imports the
other's class, so the two sides form no circle.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from devkit.local_server import LocalServer

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# Files the real Hub stores in LFS (and serves through a CDN redirect).
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".pkl", ".model", ".gguf", ".onnx")
CHUNK = 1 << 16


class HubError(Exception):
    """An HTTP error answer, with the `X-Error-Code` huggingface_hub maps to its exceptions."""

    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


@dataclass(frozen=True)
class FileInfo:
    rel: str
    path: Path
    size: int
    git_sha1: str
    sha256: str

    @property
    def is_lfs(self) -> bool:
        return self.rel.endswith(LFS_SUFFIXES)


class HubRepos(LocalServer):
    """A hub's state, for its handler; the server's life is LocalServer's."""

    def __init__(self, root: Path, *, lfs_redirect: bool = True) -> None:
        super().__init__()
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.lfs_redirect = lfs_redirect
        self.requests: list[tuple[str, str, int]] = []
        self._refs: dict[tuple[str, str], str] = {}
        self._tokens: dict[str, str] = {}
        self._blobs: dict[str, Path] = {}
        self._hash_cache: dict[tuple[Path, int, int], tuple[str, str]] = {}
        self._faults: list[tuple[int, str | None]] = []
        self._holds: list[tuple[str, threading.Event]] = []
        # (repo, commit) -> names listed as they are, served at any path ending in their last part
        self._listed_only: dict[tuple[str, str], dict[str, bytes]] = {}
        self._oversend: list[tuple[str, int]] = []
        # (repo, commit) -> name -> the size its listing gives instead of the file's own
        self._listed_sizes: dict[tuple[str, str], dict[str, object]] = {}
        self._padding: dict[tuple[str, str], int] = {}  # (repo, commit) -> names listed only
        self._flooded_listings: dict[str, int] = {}  # repo -> extra files, streamed
        self.listings_sent: list[tuple[str, int, int]] = []  # flooded: (repo, length, sent)
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        """http://127.0.0.1:PORT, as HF_ENDPOINT takes it."""
        return self.root_url

    # -- the repos, as the handler reads them --------------------------------------------------

    def _take_fault(self, path: str) -> int | None:
        with self._lock:
            for i, (status, match) in enumerate(self._faults):
                if match is None or match in path:
                    del self._faults[i]
                    return status
        return None

    def _check_auth(self, repo_id: str, authorization: str | None) -> None:
        with self._lock:
            token = self._tokens.get(repo_id)
        if token is None:
            return
        if not authorization:
            raise HubError(
                401,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in.",
            )
        if authorization != f"Bearer {token}":
            raise HubError(401, None, "Invalid credentials in Authorization header")

    def _snapshot(self, repo_id: str, revision: str) -> tuple[str, Path]:
        """(commit, directory) that `revision` of `repo_id` points to."""
        repo_dir = self.root / repo_id
        if repo_id.count("/") != 1 or ".." in repo_id.split("/") or not repo_dir.is_dir():
            raise HubError(404, "RepoNotFound", "Repository not found")
        with self._lock:
            commit = self._refs.get((repo_id, revision))
        if commit is not None:
            return commit, repo_dir / commit
        if "/" not in revision and revision not in (".", "..") and (repo_dir / revision).is_dir():
            if COMMIT_RE.match(revision):
                return revision, repo_dir / revision
            return self._tree_commit(repo_id, revision), repo_dir / revision
        if COMMIT_RE.match(revision):
            # A commit of a hand-made branch directory (its sha is derived from its content).
            for branch in repo_dir.iterdir():
                if branch.is_dir() and not COMMIT_RE.match(branch.name):
                    if self._tree_commit(repo_id, branch.name) == revision:
                        return revision, branch
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    def _tree_commit(self, repo_id: str, revision: str) -> str:
        digest = hashlib.sha256()
        for info in self._files(self.root / repo_id / revision):
            digest.update(info.rel.encode() + b"\0" + bytes.fromhex(info.sha256))
        return hashlib.sha1(f"{repo_id}\0{revision}\0{digest.hexdigest()}".encode()).hexdigest()

    def _files(self, snapshot: Path) -> list[FileInfo]:
        paths = sorted(p for p in snapshot.rglob("*") if p.is_file())
        return [self._file_info(snapshot, p) for p in paths]

    def _file_info(self, snapshot: Path, path: Path) -> FileInfo:
        stat = path.stat()
        key = (path, stat.st_size, stat.st_mtime_ns)
        with self._lock:
            hashes = self._hash_cache.get(key)
        if hashes is None:
            git, sha256 = hashlib.sha1(f"blob {stat.st_size}\0".encode()), hashlib.sha256()
            with path.open("rb") as f:
                for chunk in iter(lambda: f.read(CHUNK), b""):
                    git.update(chunk)
                    sha256.update(chunk)
            hashes = (git.hexdigest(), sha256.hexdigest())
            with self._lock:
                self._hash_cache[key] = hashes
        info = FileInfo(path.relative_to(snapshot).as_posix(), path, stat.st_size, *hashes)
        if info.is_lfs:
            with self._lock:
                self._blobs[info.sha256] = path
        return info

    def _blob(self, sha256: str) -> Path | None:
        with self._lock:
            return self._blobs.get(sha256)
