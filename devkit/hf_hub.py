"""A local stand-in for the HuggingFace Hub, so tests and demos run the real `huggingface_hub`
download code.

Repos live in a directory tree `root/<org>/<name>/<revision-or-commit>/...files`. The server
answers the URLs huggingface_hub 0.29.1 builds (`/api/models/...` for `model_info`/`repo_info`,
`/{repo}/resolve/{rev}/{path}` for `hf_hub_download`) with the headers it relies on:
`X-Repo-Commit`, `ETag` (git blob sha1) or, for LFS-style files, a 302 to a CDN-like URL with
`X-Linked-Etag` (sha256) and `X-Linked-Size`, as the real Hub does.
This file holds the repos and the test controls; devkit/hf_hub_http.py answers the requests.

Usage:

    with LocalHub(tmp_path / "hub") as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        commit = hub.add_repo("org/adapter", {"adapter_config.json": b"{}"})
        ...
        assert ("GET", "/org/adapter/resolve/<commit>/adapter_config.json", 200) in hub.requests
"""

from __future__ import annotations

import hashlib
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from devkit.hf_hub_http import CHUNK, HubError, HubHandler, file_name
from devkit.local_server import LocalServer, bind

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# Files the real Hub stores in LFS (and serves through a CDN redirect).
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".pkl", ".model", ".gguf", ".onnx")


@dataclass(frozen=True)
class _FileInfo:
    rel: str
    path: Path
    size: int
    git_sha1: str
    sha256: str

    @property
    def is_lfs(self) -> bool:
        return self.rel.endswith(LFS_SUFFIXES)


class LocalHub(LocalServer):
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

    # -- lifecycle -----------------------------------------------------------------------------

    def _make_handler(self) -> type[HubHandler]:
        return bind(HubHandler, hub=self)

    def close(self) -> None:
        """Takes the hub down (`stop()`; a second call does nothing)."""
        self.stop()

    @property
    def endpoint(self) -> str:
        """http://127.0.0.1:PORT, as HF_ENDPOINT takes it."""
        return self.root_url

    # -- test controls -------------------------------------------------------------------------

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes | Path],
        revision: str = "main",
        *,
        require_token: str | None = None,
        commit: str | None = None,
    ) -> str:
        """Push `files` as a new commit and point `revision` at it; returns the commit sha.

        The commit depends on the repo, revision and content, so pushing different files to
        the same branch makes a new commit while the old one stays downloadable. `commit` gives
        the sha instead: a mirror or a fork of another repo, which shares its commits.
        """
        _split_repo(repo_id)
        digest = hashlib.sha256()
        for name in sorted(files):
            data = files[name]
            blob = data.read_bytes() if isinstance(data, Path) else data
            digest.update(name.encode() + b"\0" + hashlib.sha256(blob).digest())
        if commit is None:
            commit = hashlib.sha1(
                f"{repo_id}\0{revision}\0{digest.hexdigest()}".encode()
            ).hexdigest()
        elif not COMMIT_RE.match(commit):
            raise ValueError(f"commit {commit!r}: 40 hex digits")
        snapshot = self.root / repo_id / commit
        if snapshot.exists():
            shutil.rmtree(snapshot)
        for name, data in files.items():
            target = snapshot / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(data, Path):
                shutil.copyfile(data, target)
            else:
                target.write_bytes(data)
        with self._lock:
            self._refs[(repo_id, revision)] = commit
            if require_token is not None:
                self._tokens[repo_id] = require_token
        return commit

    def list_name(self, repo_id: str, name: str, data: bytes, revision: str = "main") -> None:
        """A hostile Hub: `revision`'s listing also names `name` as it is (`../x`, `/x`: names
        no tree can hold), and `data` is served at every URL whose path ends in the name's last
        part (a client normalises the `..` of a URL away and asks elsewhere)."""
        with self._lock:
            commit = self._refs[(repo_id, revision)]
            self._listed_only.setdefault((repo_id, commit), {})[name] = data

    def list_size(self, repo_id: str, name: str, size: object, revision: str = "main") -> None:
        """A hostile Hub: `revision`'s listing gives `size` (any JSON value: a negative number,
        text) as the size of `name`, a file of the repo or a name listed by `list_name`; the
        file is served as it is."""
        with self._lock:
            commit = self._refs[(repo_id, revision)]
            self._listed_sizes.setdefault((repo_id, commit), {})[name] = size

    def pad_listing(self, repo_id: str, count: int, revision: str = "main") -> None:
        """A hostile Hub: `revision`'s listing also names `count` files (`padding/N.txt`, one
        byte each) that are never served."""
        with self._lock:
            commit = self._refs[(repo_id, revision)]
            self._padding[(repo_id, commit)] = count

    def require_token(self, repo_id: str, token: str | None) -> None:
        """Make the repo gated: 401 unless `Authorization: Bearer <token>` is sent."""
        with self._lock:
            if token is None:
                self._tokens.pop(repo_id, None)
            else:
                self._tokens[repo_id] = token

    def fail_next(self, n: int, status: int = 503, match: str | None = None) -> None:
        """Answer the next `n` requests (whose path contains `match`, if given) with `status`."""
        with self._lock:
            self._faults.extend([(status, match)] * n)

    def hold_bodies(self, match: str) -> threading.Event:
        """File contents whose URL contains `match` are sent only once the returned event is set
        (at most five minutes later), so that a test can line up concurrent downloads; headers
        (HEAD) and listings are answered at once."""
        release = threading.Event()
        with self._lock:
            self._holds.append((match, release))
        return release

    def oversend(self, match: str, extra: int) -> None:
        """A hostile Hub: files whose URL contains `match` are sent with `extra` more bytes
        (spaces) than the listing says, the length header saying so too."""
        with self._lock:
            self._oversend.append((match, extra))

    def flood_listing(self, repo_id: str, files: int) -> None:
        """A hostile Hub: `repo_id`'s listing (model_info) also names `files` more files, made as
        it is streamed (10^6 files is a 46 MB answer; pad_listing's few thousand are built whole);
        `listings_sent` then records how many of its bytes went out before the client closed
        the connection."""
        with self._lock:
            self._flooded_listings[repo_id] = files

    def bodies_served(self) -> list[str]:
        """Repo-relative names of the files whose content was sent (a GET answered 200 or 206,
        at a resolve or CDN URL): one entry per download of a file's bytes."""
        with self._lock:
            paths = [p for m, p, status in self.requests if m == "GET" and status in (200, 206)]
        names = [file_name(path) for path in paths]
        return [name for name in names if name is not None]

    def file_requests(self, method: str = "GET") -> list[str]:
        """Repo-relative names of files requested with `method` (resolve or CDN URLs)."""
        names = [file_name(path) for m, path, _status in list(self.requests) if m == method]
        return [name for name in names if name is not None]

    # -- repo model (used by the handler) ------------------------------------------------------

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

    def _files(self, snapshot: Path) -> list[_FileInfo]:
        paths = sorted(p for p in snapshot.rglob("*") if p.is_file())
        return [self._file_info(snapshot, p) for p in paths]

    def _file_info(self, snapshot: Path, path: Path) -> _FileInfo:
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
        info = _FileInfo(path.relative_to(snapshot).as_posix(), path, stat.st_size, *hashes)
        if info.is_lfs:
            with self._lock:
                self._blobs[info.sha256] = path
        return info

    def _blob(self, sha256: str) -> Path | None:
        with self._lock:
            return self._blobs.get(sha256)


def _split_repo(repo_id: str) -> tuple[str, str]:
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts) or any(p in (".", "..") for p in parts):
        raise ValueError(f"repo id must be <org>/<name>, got {repo_id!r}")
    return parts[0], parts[1]
