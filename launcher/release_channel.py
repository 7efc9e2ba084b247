"""Where releases are published besides the registry: the project's GitHub releases, whose
assets hold each release's signed manifest (launcher/release.py). Read here, never trusted:
what a manifest says counts only once its signature verifies against this checkout's keys, so
the channel may be a mirror (`--release-channel` / VALIDATOR_RELEASE_CHANNEL) and a tampered
answer is a refusal, not a run.

- `{channel}/releases/download/vX.Y.Z/release.json` (and `.sig`): one release's manifest;
- the releases' list, GitHub's REST API `GET /repos/OWNER/REPO/releases` (api.github.com for
  github.com, `/api/v3` on another host: GitHub Enterprise, or devkit/release_channel.py).

Every answer is read by `_read_answer` alone, within a size and a time.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import requests
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from launcher.errors import UsageError
from launcher.release import (
    KEYS_FILE,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    MAX_SIGNATURE_BYTES,
    SIGNATURE,
    ReleaseManifest,
    trusted_keys,
    verify,
    version_key,
)

DEFAULT_CHANNEL = "https://github.com/FLock-io/flock-validator"
CHANNEL_ENV = "VALIDATOR_RELEASE_CHANNEL"
MAX_LISTING_BYTES = 4 * 1024 * 1024
CONNECT_SECONDS, READ_SECONDS, TOTAL_SECONDS = 10.0, 30.0, 60.0
CHUNK = 64 * 1024


class ReleaseUnavailable(Exception):
    """The channel could not say (unreachable, no such release): nothing to verify, so the
    caller builds the image here, or keeps what it runs."""


@dataclass(frozen=True)
class Channel:
    url: str  # https://github.com/OWNER/REPO, or a stand-in's http://127.0.0.1:PORT/OWNER/REPO

    def __post_init__(self) -> None:
        split = urlsplit(self.url)
        owner_and_repo = split.path.strip("/").split("/")
        if split.scheme not in ("https", "http") or len(owner_and_repo) != len(("owner", "repo")):
            raise UsageError(
                f"--release-channel {self.url!r}: give a repository's address such as "
                f"{DEFAULT_CHANNEL}"
            )

    def asset(self, version: str, name: str) -> str:
        return f"{self.url.rstrip('/')}/releases/download/v{version}/{name}"

    def listing(self) -> str:
        split = urlsplit(self.url)
        api = "https://api.github.com" if split.netloc == "github.com" else None
        api = api or f"{split.scheme}://{split.netloc}/api/v3"
        return f"{api}/repos/{split.path.strip('/')}/releases?per_page=100"


def _read_answer(url: str, max_bytes: int, accept: str = "application/octet-stream") -> bytes:
    """The body of a GET of `url`, at most `max_bytes`, within TOTAL_SECONDS (one place where
    the channel's answers are read); ReleaseUnavailable for what keeps it from answering."""
    deadline = time.monotonic() + TOTAL_SECONDS
    try:
        with requests.get(
            url, headers={"Accept": accept}, stream=True, timeout=(CONNECT_SECONDS, READ_SECONDS)
        ) as response:
            if response.status_code == 404:
                raise ReleaseUnavailable("not published")
            if response.status_code != 200:
                raise ReleaseUnavailable(f"HTTP {response.status_code} from {url}")
            body = bytearray()
            for chunk in response.iter_content(CHUNK):
                body += chunk
                if len(body) > max_bytes:
                    raise ReleaseUnavailable(f"{url} answered over {max_bytes} bytes")
                if time.monotonic() > deadline:
                    raise ReleaseUnavailable(f"{url} took over {TOTAL_SECONDS:g} s")
            return bytes(body)
    except requests.RequestException as exc:
        why = type(exc).__name__
        raise ReleaseUnavailable(f"the release channel cannot be reached ({why})") from None


def fetch_release(
    channel: Channel, version: str, keys: dict[str, Ed25519PublicKey] | None = None
) -> ReleaseManifest:
    """Release `version`'s manifest, verified against this checkout's keys. ReleaseUnavailable
    when the channel cannot say, or this checkout trusts no key yet (no release to check it
    against); ReleaseRefused (exit 3) when the channel says something unsigned."""
    keys = trusted_keys() if keys is None else keys
    if not keys:
        raise ReleaseUnavailable(f"this checkout trusts no release key ({KEYS_FILE.name})")
    manifest = _read_answer(channel.asset(version, MANIFEST), MAX_MANIFEST_BYTES)
    signature = _read_answer(channel.asset(version, SIGNATURE), MAX_SIGNATURE_BYTES)
    return verify(manifest, signature, version, keys)


def newer_versions(channel: Channel, current: str) -> list[str]:
    """The published releases after `current` with its major version, newest first (drafts and
    pre-releases left out). ReleaseUnavailable when the channel cannot say."""
    raw = _read_answer(channel.listing(), MAX_LISTING_BYTES, "application/vnd.github+json")
    try:
        listed = json.loads(raw)
        tags = [
            str(entry["tag_name"])
            for entry in listed
            if not entry.get("draft") and not entry.get("prerelease")
        ]
    except (ValueError, TypeError, KeyError, AttributeError):
        raise ReleaseUnavailable("the releases' list is not GitHub's JSON") from None
    major, found = version_key(current)[0], []
    for tag in tags:
        try:
            key = version_key(tag.removeprefix("v"))
        except ValueError:
            continue  # not a release tag of ours
        if tag.startswith("v") and key[0] == major and key > version_key(current):
            found.append(tag.removeprefix("v"))
    return sorted(set(found), key=version_key, reverse=True)
