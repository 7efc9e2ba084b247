"""A stand-in for the releases' channel (GitHub releases, launcher/release/channel.py) on
127.0.0.1, and a release key made on the spot: the tests of `run.py --pull` and
`--follow-releases` publish signed releases here, the way .github/workflows/release.yml does on
GitHub, and nothing leaves the machine.

    key = ReleaseKey()
    key.trust_in(repo)                      # the copy's launcher/release/release_keys.json
    with LocalReleaseChannel() as channel:  # channel.url: http://127.0.0.1:PORT/FLock-io/...
        channel.publish(key.release("0.1.0", {"fixture": "sha256:..."}))

Its answers: `GET /api/v3/repos/OWNER/REPO/releases` (GitHub's list, newest first) and
`GET /OWNER/REPO/releases/download/vX.Y.Z/NAME` (an asset: as on GitHub, a 302 to where its
bytes are served, `/release-assets/vX.Y.Z/NAME`), 404 for anything else.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from devkit.local_server import LocalHandler, LocalServer, bind
from launcher.release.manifest import (
    MANIFEST,
    SIGNATURE,
    ReleaseManifest,
    key_id,
    public_entry,
    sign,
)
from validator.state.store import SCHEMA_VERSION

REPOSITORY = "FLock-io/flock-validator"
COMMIT = "0" * 40
ASSETS = "release-assets"  # where an asset's download redirects (GitHub: another host)


@dataclass(frozen=True)
class Release:
    version: str
    files: dict[str, bytes]  # asset name -> bytes


class ReleaseKey:
    """An Ed25519 release key, made for one test run; its private half never leaves it."""

    def __init__(self) -> None:
        self._private = Ed25519PrivateKey.generate()

    @property
    def id(self) -> str:
        return key_id(self._private.public_key())

    def trust_in(self, repo: Path, *, alone: bool = True) -> None:
        """Makes the checkout at `repo` trust this key (alone, or beside those it trusts)."""
        path = repo / "launcher" / "release" / "release_keys.json"
        keys = [] if alone else json.loads(path.read_text())["keys"]
        keys.append(public_entry(self._private.public_key(), "a test's release key"))
        path.write_text(json.dumps({"keys": keys}, indent=2) + "\n")

    def release(
        self, version: str, images: dict[str, str], *, journal_schema: int = SCHEMA_VERSION
    ) -> Release:
        """Release `version`'s assets as the workflow publishes them, signed by this key."""
        manifest = ReleaseManifest(
            version=version, commit=COMMIT, journal_schema=journal_schema, images=images
        ).encoded()
        return Release(version, {MANIFEST: manifest, SIGNATURE: sign(manifest, self._private)})


class LocalReleaseChannel(LocalServer):
    def __init__(self, repository: str = REPOSITORY) -> None:
        super().__init__()
        self.repository = repository
        self.releases: dict[str, Release] = {}  # by version, in the order published
        self.requests: list[str] = []  # the path of each request
        self._lock = threading.Lock()

    def _make_handler(self) -> type[_Handler]:
        return bind(_Handler, channel=self)

    @property
    def url(self) -> str:
        """What `--release-channel` / VALIDATOR_RELEASE_CHANNEL takes."""
        return f"{self.root_url}/{self.repository}"

    def publish(self, release: Release) -> None:
        with self._lock:
            self.releases[release.version] = release

    def listing(self) -> list[dict]:
        with self._lock:
            versions = list(self.releases)
        return [
            {"tag_name": f"v{version}", "draft": False, "prerelease": False}
            for version in reversed(versions)
        ]

    def asset(self, tag: str, name: str) -> bytes | None:
        with self._lock:
            release = self.releases.get(tag.removeprefix("v"))
        return None if release is None else release.files.get(name)


class _Handler(LocalHandler):
    channel: LocalReleaseChannel

    def do_GET(self) -> None:  # noqa: N802
        with self.channel._lock:
            self.channel.requests.append(self.path)
        path = self.path.split("?", 1)[0].strip("/")
        listing = f"api/v3/repos/{self.channel.repository}/releases"
        downloads = f"{self.channel.repository}/releases/download/"
        if path == listing:
            return self.reply_json(200, self.channel.listing())
        if path.startswith(downloads) and path.count("/") == downloads.count("/") + 1:
            tag, name = path[len(downloads) :].split("/")
            if self.channel.asset(tag, name) is not None:  # GitHub's: a redirect to its storage
                where = f"{self.channel.root_url}/{ASSETS}/{tag}/{name}"
                return self.reply(302, b"", {"Location": where})
        if path.startswith(f"{ASSETS}/") and path.count("/") == 2:
            found = self.channel.asset(*path.split("/")[1:])
            if found is not None:
                return self.reply(200, found, {"Content-Type": "application/octet-stream"})
        self.reply_json(404, {"message": "Not Found"})
