"""A local stand-in for the HuggingFace Hub, so tests and demos run the real `huggingface_hub`
download code.

Repos live in a directory tree `root/<org>/<name>/<revision-or-commit>/...files`. The server
answers the URLs huggingface_hub 0.29.1 builds (`/api/models/...` for `model_info`/`repo_info`,
`/{repo}/resolve/{rev}/{path}` for `hf_hub_download`) with the headers it relies on:
`X-Repo-Commit`, `ETag` (git blob sha1) or, for LFS-style files, a 302 to a CDN-like URL with
`X-Linked-Etag` (sha256) and `X-Linked-Size`, as the real Hub does.
This file holds the test controls; devkit/hf_hub_repos.py the repos, which
devkit/hf_hub_http.py reads to answer the requests.

Usage:

    with LocalHub(tmp_path / "hub") as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        commit = hub.add_repo("org/adapter", {"adapter_config.json": b"{}"})
        ...
        assert ("GET", "/org/adapter/resolve/<commit>/adapter_config.json", 200) in hub.requests
"""

from __future__ import annotations

import hashlib
import shutil
import threading
from pathlib import Path

from devkit.hf_hub_http import HubHandler, file_name
from devkit.hf_hub_repos import COMMIT_RE, HubRepos
from devkit.local_server import bind


class LocalHub(HubRepos):
    """The hub: its repos (HubRepos), served by HubHandler, set up by the test controls."""

    # -- lifecycle -----------------------------------------------------------------------------

    def _make_handler(self) -> type[HubHandler]:
        return bind(HubHandler, hub=self)

    def close(self) -> None:
        """Takes the hub down (`stop()`; a second call does nothing)."""
        self.stop()

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


def _split_repo(repo_id: str) -> tuple[str, str]:
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts) or any(p in (".", "..") for p in parts):
        raise ValueError(f"repo id must be <org>/<name>, got {repo_id!r}")
    return parts[0], parts[1]
