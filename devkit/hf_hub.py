"""A local stand-in for the HuggingFace Hub, so tests and demos run the real `huggingface_hub`
download code.

Repos live in a directory tree `root/<org>/<name>/<revision-or-commit>/...files`. The server
answers the URLs huggingface_hub 0.29.1 builds (`/api/models/...` for `model_info`/`repo_info`,
`/{repo}/resolve/{rev}/{path}` for `hf_hub_download`) with the headers it relies on:
`X-Repo-Commit`, `ETag` (git blob sha1) or, for LFS-style files, a 302 to a CDN-like URL with
`X-Linked-Etag` (sha256) and `X-Linked-Size`, as the real Hub does.

Usage:

    with LocalHub(tmp_path / "hub") as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        commit = hub.add_repo("org/adapter", {"adapter_config.json": b"{}"})
        ...
        assert ("GET", "/org/adapter/resolve/<commit>/adapter_config.json", 200) in hub.requests
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# Files the real Hub stores in LFS (and serves through a CDN redirect).
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".pkl", ".model", ".gguf", ".onnx")
CHUNK = 1 << 16


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


class _HubError(Exception):
    """An HTTP error answer, with the `X-Error-Code` huggingface_hub maps to its exceptions."""

    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


class LocalHub:
    def __init__(self, root: Path, *, lfs_redirect: bool = True) -> None:
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
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> LocalHub:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        handler = type("Handler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        # A short poll interval keeps shutdown (once per test) fast.
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "LocalHub is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

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

    def bodies_served(self) -> list[str]:
        """Repo-relative names of the files whose content was sent (a GET answered 200 or 206,
        at a resolve or CDN URL): one entry per download of a file's bytes."""
        with self._lock:
            paths = [p for m, p, status in self.requests if m == "GET" and status in (200, 206)]
        names = [_file_name(path) for path in paths]
        return [name for name in names if name is not None]

    def file_requests(self, method: str = "GET") -> list[str]:
        """Repo-relative names of files requested with `method` (resolve or CDN URLs)."""
        names = [_file_name(path) for m, path, _status in list(self.requests) if m == method]
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
            raise _HubError(
                401,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in.",
            )
        if authorization != f"Bearer {token}":
            raise _HubError(401, None, "Invalid credentials in Authorization header")

    def _snapshot(self, repo_id: str, revision: str) -> tuple[str, Path]:
        """(commit, directory) that `revision` of `repo_id` points to."""
        repo_dir = self.root / repo_id
        if repo_id.count("/") != 1 or ".." in repo_id.split("/") or not repo_dir.is_dir():
            raise _HubError(404, "RepoNotFound", "Repository not found")
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
        raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

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


def _file_name(path: str) -> str | None:
    """The repo-relative file name of a resolve or CDN path; None for other paths."""
    if "/resolve/" in path:
        return path.split("/resolve/", 1)[1].split("/", 1)[1]
    if path.startswith("/cdn-lfs/"):
        return path.split("/", 3)[3]
    return None


def _split_repo(repo_id: str) -> tuple[str, str]:
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts) or any(p in (".", "..") for p in parts):
        raise ValueError(f"repo id must be <org>/<name>, got {repo_id!r}")
    return parts[0], parts[1]


def _sibling(info: _FileInfo, blobs: bool) -> dict[str, object]:
    entry: dict[str, object] = {"rfilename": info.rel}
    if blobs:
        entry["size"] = info.size
        entry["blobId"] = info.git_sha1
        if info.is_lfs:
            entry["lfs"] = {"size": info.size, "sha256": info.sha256, "pointerSize": 134}
    return entry


class _Handler(BaseHTTPRequestHandler):
    hub: LocalHub
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # the hub keeps its own structured log

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch(body=False)

    # -- routing -------------------------------------------------------------------------------

    def _dispatch(self, body: bool) -> None:
        split = urlsplit(self.path)
        path = unquote(split.path)
        status = self.hub._take_fault(path)
        try:
            if status is not None:
                self._send_error(_HubError(status, None, "injected fault"), body)
            elif (listed := self._listed_only(path)) is not None:
                headers = {"X-Repo-Commit": listed[0], "ETag": '"listed-only"'}
                self._send(
                    200, {**headers, "Content-Type": "application/octet-stream"}, listed[1], body
                )
                status = 200
            elif path.startswith("/api/models/"):
                status = self._model_info(split.path, parse_qs(split.query), body)
            elif path.startswith("/cdn-lfs/"):
                status = self._serve_blob(path, body)
            elif "/resolve/" in split.path:
                status = self._resolve(split.path, body)
            else:
                raise _HubError(404, None, "not found")
        except _HubError as err:
            status = err.status
            self._send_error(err, body)
        except (BrokenPipeError, ConnectionResetError):
            status = status or 499
        with self.hub._lock:
            self.hub.requests.append((self.command, path, status or 500))

    def _listed_only(self, path: str) -> tuple[str, bytes] | None:
        """(commit, data) of a name listed by `LocalHub.list_name` that `path` ends in."""
        with self.hub._lock:
            for (_repo, commit), names in self.hub._listed_only.items():
                for name, data in names.items():
                    if path.endswith("/" + name.rsplit("/", 1)[-1]):
                        return commit, data
        return None

    def _model_info(self, raw_path: str, query: dict[str, list[str]], body: bool) -> int:
        rest = raw_path[len("/api/models/") :].split("/")
        if len(rest) == 2:
            revision = "main"
        elif len(rest) == 4 and rest[2] == "revision":
            revision = unquote(rest[3])
        else:
            raise _HubError(404, None, "not found")
        repo_id = f"{unquote(rest[0])}/{unquote(rest[1])}"
        self.hub._check_auth(repo_id, self.headers.get("Authorization"))
        commit, snapshot = self.hub._snapshot(repo_id, revision)
        blobs = query.get("blobs", [""])[0].lower() == "true"
        info = {
            "_id": commit[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0],
            "sha": commit,
            "lastModified": "2024-01-01T00:00:00.000Z",
            "private": False,
            "gated": "manual" if repo_id in self.hub._tokens else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": [_sibling(f, blobs) for f in self.hub._files(snapshot)],
        }
        with self.hub._lock:
            extra = self.hub._listed_only.get((repo_id, commit), {})
            info["siblings"] += [{"rfilename": n, "size": len(d)} for n, d in extra.items()]
        payload = json.dumps(info).encode()
        self._send(200, {"Content-Type": "application/json"}, payload, body)
        return 200

    def _resolve(self, raw_path: str, body: bool) -> int:
        head, _, tail = raw_path.lstrip("/").partition("/resolve/")
        revision_raw, _, filename_raw = tail.partition("/")
        repo_id, revision, filename = unquote(head), unquote(revision_raw), unquote(filename_raw)
        self.hub._check_auth(repo_id, self.headers.get("Authorization"))
        commit, snapshot = self.hub._snapshot(repo_id, revision)
        target = (snapshot / filename).resolve()
        if not filename or not target.is_file() or snapshot.resolve() not in target.parents:
            raise _HubError(404, "EntryNotFound", f"{filename} does not exist", commit)
        info = self.hub._file_info(snapshot, target)
        if info.is_lfs and self.hub.lfs_redirect:
            location = f"{self.hub.endpoint}/cdn-lfs/{info.sha256}/{quote(info.rel)}"
            headers = {
                "Location": location,
                "X-Repo-Commit": commit,
                "X-Linked-Etag": f'"{info.sha256}"',
                "X-Linked-Size": str(info.size),
                "ETag": f'"{info.git_sha1}"',
            }
            self._send(302, headers, b"", body)
            return 302
        headers = {"X-Repo-Commit": commit, "ETag": f'"{info.git_sha1}"'}
        return self._send_file(info.path, headers, body)

    def _serve_blob(self, path: str, body: bool) -> int:
        parts = path.split("/", 3)
        blob = self.hub._blob(parts[2]) if len(parts) == 4 else None
        if blob is None or not blob.is_file():
            raise _HubError(404, None, "blob not found")
        return self._send_file(blob, {"ETag": f'"{parts[2]}"'}, body)

    # -- responses -----------------------------------------------------------------------------

    def _send_file(self, path: Path, headers: dict[str, str], body: bool) -> int:
        with self.hub._lock:
            extra = sum(n for match, n in self.hub._oversend if match in self.path)
        size = path.stat().st_size + extra
        start, status = _range_start(self.headers.get("Range"), size)
        headers = {
            **headers,
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "Content-Length": str(size - start),
        }
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self._wait_for_release()
            with path.open("rb") as f:
                f.seek(start)
                shutil.copyfileobj(f, self.wfile, CHUNK)
            for sent in range(max(start - (size - extra), 0), extra, CHUNK):
                self.wfile.write(b" " * min(CHUNK, extra - sent))
        return status

    def _wait_for_release(self) -> None:
        with self.hub._lock:
            holds = [release for match, release in self.hub._holds if match in self.path]
        for release in holds:
            release.wait(300)  # bounded: a test that never releases must not hang the server

    def _send(self, status: int, headers: dict[str, str], payload: bytes, body: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if body and payload:
            self.wfile.write(payload)

    def _send_error(self, err: _HubError, body: bool) -> None:
        payload = json.dumps({"error": err.message}).encode()
        headers = {"Content-Type": "application/json", "X-Error-Message": err.message}
        if err.code:
            headers["X-Error-Code"] = err.code
        if err.commit:
            headers["X-Repo-Commit"] = err.commit
        self._send(err.status, headers, payload, body)


def _range_start(header: str | None, size: int) -> tuple[int, int]:
    """Only `bytes=N-` ranges, the form huggingface_hub sends when resuming a download."""
    match = re.fullmatch(r"bytes=(\d+)-", header or "")
    if match is None:
        return 0, 200
    start = int(match.group(1))
    if start >= size:
        raise _HubError(416, None, "range not satisfiable")
    return start, 206
