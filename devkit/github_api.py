"""A stand-in for the GitHub REST calls the protocol drift watch makes (validator/observe/
drift.py), on 127.0.0.1: `GET /repos/{owner}/{repo}/commits?sha=&path=&since=&per_page=` (and
`GET /repos/{owner}/{repo}/commits/{sha}`), answered from commits a test adds.

with LocalGitHub() as github:
    github.add_commit("FLock-io/FLock-validator", sha, "fix: ...", ["validator/modules/rl/x.py"])
    os.environ["VALIDATOR_GITHUB_API"] = github.endpoint

Hostile answers for the bounded reader's tests: `pad_next(n, size)` pads the next `n` listings
with `size` bytes of JSON values (gzip-encoded with `gzip=True`: a small answer that decodes to
`size`); `padded` records how many bytes of each went out before the client closed.
"""

from __future__ import annotations

import gzip
import json
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, urlsplit

from devkit.local_server import LocalHandler, LocalServer, bind, padded_json

EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class _Commit:
    sha: str
    message: str
    paths: tuple[str, ...]
    date: datetime

    def as_json(self) -> dict:
        stamp = self.date.strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "sha": self.sha,
            "commit": {"message": self.message, "committer": {"date": stamp}},
        }


class LocalGitHub(LocalServer):
    def __init__(self) -> None:
        super().__init__()
        self.commits: dict[str, list[_Commit]] = {}
        self.requests: list[str] = []  # path and query of each request
        self.padded: list[tuple[int, int]] = []  # padded listings: (length, bytes sent)
        self._pads: list[tuple[int, bool] | None] = []
        self._lock = threading.Lock()

    def _make_handler(self) -> type[_Handler]:
        return bind(_Handler, github=self)

    @property
    def endpoint(self) -> str:
        return self.root_url

    def pad_next(self, n: int, size: int, *, after: int = 0, gzip: bool = False) -> None:
        """The `n` listings after the next `after` carry `size` bytes more of JSON values;
        `gzip`: sent gzip-encoded (whatever the client asked for), a few kB that decode to
        `size`."""
        with self._lock:
            self._pads += [None] * after + [(size, gzip)] * n

    def add_commit(self, repo: str, sha: str, message: str, paths: list[str]) -> None:
        """A commit on the default branch, an hour after the repo's previous one."""
        with self._lock:
            history = self.commits.setdefault(repo, [])
            date = EPOCH + timedelta(hours=len(history))
            history.append(_Commit(sha, message, tuple(paths), date))


class _Handler(LocalHandler):
    github: LocalGitHub

    def do_GET(self) -> None:  # noqa: N802
        split = urlsplit(self.path)
        with self.github._lock:
            self.github.requests.append(self.path)
        parts = split.path.strip("/").split("/")
        if len(parts) < 4 or parts[0] != "repos" or parts[3] != "commits":
            return self.reply_json(404, {"message": "Not Found"})
        repo = f"{parts[1]}/{parts[2]}"
        with self.github._lock:
            history = list(self.github.commits.get(repo, []))
        if len(parts) == 5:
            found = [c for c in history if c.sha == parts[4]]
            if not found:
                return self.reply_json(422, {"message": f"No commit found for SHA: {parts[4]}"})
            return self.reply_json(200, found[0].as_json())
        query = parse_qs(split.query)
        path = query.get("path", [""])[0]
        since = query.get("since", [None])[0]
        start = query.get("sha", [None])[0]
        limit = int(query.get("per_page", ["30"])[0])
        if start is not None:  # the listing starts at that commit: it and its ancestors
            shas = [c.sha for c in history]
            if start not in shas:
                return self.reply_json(404, {"message": "Not Found"})
            history = history[: shas.index(start) + 1]
        listed = [
            c
            for c in reversed(history)
            if (not path or any(p == path or p.startswith(path + "/") for p in c.paths))
            and (since is None or c.date >= datetime.fromisoformat(since.replace("Z", "+00:00")))
        ]
        page = [c.as_json() for c in listed[:limit]]
        with self.github._lock:
            pad = self.github._pads.pop(0) if self.github._pads else None
        if pad is None:
            return self.reply_json(200, page)
        self._padded(json.dumps(page).encode(), *pad)

    def _padded(self, document: bytes, size: int, encoded: bool) -> None:
        length, chunks = padded_json(document, size)
        headers = {"Content-Type": "application/json"}
        if encoded:
            data = gzip.compress(b"".join(chunks), compresslevel=9)
            length, chunks = len(data), iter([data])
            headers["Content-Encoding"] = "gzip"
        sent = self.reply_chunks(200, headers, length, chunks)
        with self.github._lock:
            self.github.padded.append((length, sent))
