"""The HTTP side of devkit/hf_hub.py's LocalHub: the URLs huggingface_hub 0.29.1 builds, the
headers it relies on, ranges for resumed downloads, and the faulty or hostile answers a test
queues on the hub (faults, held bodies, names listed only, oversent files), read from its repos
(devkit/hf_hub_repos.py).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

from devkit.hf_hub_repos import CHUNK, FileInfo, HubError, HubRepos
from devkit.local_server import CHUNK as REPLY_CHUNK
from devkit.local_server import LocalHandler


def file_name(path: str) -> str | None:
    """The repo-relative file name of a resolve or CDN path; None for other paths."""
    if "/resolve/" in path:
        return path.split("/resolve/", 1)[1].split("/", 1)[1]
    if path.startswith("/cdn-lfs/"):
        return path.split("/", 3)[3]
    return None


def _sibling(info: FileInfo, blobs: bool) -> dict[str, object]:
    entry: dict[str, object] = {"rfilename": info.rel}
    if blobs:
        entry["size"] = info.size
        entry["blobId"] = info.git_sha1
        if info.is_lfs:
            entry["lfs"] = {"size": info.size, "sha256": info.sha256, "pointerSize": 134}
    return entry


def _misstate(siblings: list[dict[str, object]], sizes: dict[str, object]) -> None:
    """The sizes `LocalHub.list_size` set, in place of the files' own (and their LFS size)."""
    for entry in siblings:
        if entry["rfilename"] in sizes:
            entry["size"] = sizes[str(entry["rfilename"])]
            if isinstance(entry.get("lfs"), dict):
                entry["lfs"] = {**entry["lfs"], "size": entry["size"]}


class HubHandler(LocalHandler):
    hub: HubRepos
    protocol_version = "HTTP/1.0"

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
                self._send_error(HubError(status, None, "injected fault"), body)
            elif (listed := self._listed_only(path)) is not None:
                headers = {"X-Repo-Commit": listed[0], "ETag": '"listed-only"'}
                headers["Content-Type"] = "application/octet-stream"
                self.reply(200, listed[1], headers, body=body)
                status = 200
            elif path.startswith("/api/models/"):
                status = self._model_info(split.path, parse_qs(split.query), body)
            elif path.startswith("/cdn-lfs/"):
                status = self._serve_blob(path, body)
            elif "/resolve/" in split.path:
                status = self._resolve(split.path, body)
            else:
                raise HubError(404, None, "not found")
        except HubError as err:
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
            raise HubError(404, None, "not found")
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
            padding = self.hub._padding.get((repo_id, commit), 0)
            info["siblings"] += [
                {"rfilename": f"padding/{n}.txt", "size": 1} for n in range(padding)
            ]
            _misstate(info["siblings"], self.hub._listed_sizes.get((repo_id, commit), {}))
            flood = self.hub._flooded_listings.get(repo_id, 0)
        payload = json.dumps(info).encode()
        if flood and body:
            return self._flooded_listing(repo_id, payload, flood)
        self.reply(200, payload, {"Content-Type": "application/json"}, body=body)
        return 200

    def _flooded_listing(self, repo_id: str, payload: bytes, files: int) -> int:
        """The listing (siblings last) with `files` more siblings, streamed."""
        head, tail = payload[: -len(b"]}")], b"]}"
        entry = b', {"rfilename": "pad/f%08d.bin", "size": 1}'
        length = len(head) + files * len(entry % 0) + len(tail)
        per_chunk = max(REPLY_CHUNK // len(entry % 0), 1)

        def chunks():
            yield head
            for start in range(0, files, per_chunk):
                yield b"".join(entry % i for i in range(start, min(start + per_chunk, files)))
            yield tail

        headers = {"Content-Type": "application/json"}
        sent = self.reply_chunks(200, headers, length, chunks())
        with self.hub._lock:
            self.hub.listings_sent.append((repo_id, length, sent))
        return 200 if sent == length else 499

    def _resolve(self, raw_path: str, body: bool) -> int:
        head, _, tail = raw_path.lstrip("/").partition("/resolve/")
        revision_raw, _, filename_raw = tail.partition("/")
        repo_id, revision, filename = unquote(head), unquote(revision_raw), unquote(filename_raw)
        self.hub._check_auth(repo_id, self.headers.get("Authorization"))
        commit, snapshot = self.hub._snapshot(repo_id, revision)
        target = (snapshot / filename).resolve()
        if not filename or not target.is_file() or snapshot.resolve() not in target.parents:
            raise HubError(404, "EntryNotFound", f"{filename} does not exist", commit)
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
            self.reply(302, b"", headers, body=body)
            return 302
        headers = {"X-Repo-Commit": commit, "ETag": f'"{info.git_sha1}"'}
        return self._send_file(info.path, headers, body)

    def _serve_blob(self, path: str, body: bool) -> int:
        parts = path.split("/", 3)
        blob = self.hub._blob(parts[2]) if len(parts) == 4 else None
        if blob is None or not blob.is_file():
            raise HubError(404, None, "blob not found")
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
        self.start_reply(status, headers)
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

    def _send_error(self, err: HubError, body: bool) -> None:
        payload = json.dumps({"error": err.message}).encode()
        headers = {"Content-Type": "application/json", "X-Error-Message": err.message}
        if err.code:
            headers["X-Error-Code"] = err.code
        if err.commit:
            headers["X-Repo-Commit"] = err.commit
        self.reply(err.status, payload, headers, body=body)


def _range_start(header: str | None, size: int) -> tuple[int, int]:
    """Only `bytes=N-` ranges, the form huggingface_hub sends when resuming a download."""
    match = re.fullmatch(r"bytes=(\d+)-", header or "")
    if match is None:
        return 0, 200
    start = int(match.group(1))
    if start >= size:
        raise HubError(416, None, "range not satisfiable")
    return start, 206
