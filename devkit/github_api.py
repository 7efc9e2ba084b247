"""A stand-in for the two GitHub REST calls the protocol drift watch makes (validator/observe/
drift.py), on 127.0.0.1: `GET /repos/{owner}/{repo}/commits/{sha}` and
`GET /repos/{owner}/{repo}/commits?path=&since=&per_page=`, answered from commits a test adds.

with LocalGitHub() as github:
    github.add_commit("FLock-io/FLock-validator", sha, "fix: ...", ["validator/modules/rl/x.py"])
    os.environ["VALIDATOR_GITHUB_API"] = github.endpoint
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, urlsplit

from devkit.local_server import LocalHandler, LocalServer, bind

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
        self._lock = threading.Lock()

    def _make_handler(self) -> type[_Handler]:
        return bind(_Handler, github=self)

    @property
    def endpoint(self) -> str:
        return self.root_url

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
        limit = int(query.get("per_page", ["30"])[0])
        listed = [
            c
            for c in reversed(history)
            if (not path or any(p == path or p.startswith(path + "/") for p in c.paths))
            and (since is None or c.date >= datetime.fromisoformat(since.replace("Z", "+00:00")))
        ]
        self.reply_json(200, [c.as_json() for c in listed[:limit]])
