"""Where releases are published besides the registry: the project's GitHub releases, whose
assets hold each release's signed manifest (launcher/release/manifest.py). Read here, never trusted:
what a manifest says counts only once its signature verifies against this checkout's keys, so
the channel may be a mirror (`--release-channel` / VALIDATOR_RELEASE_CHANNEL) and a tampered
answer is a refusal, not a run.

- `{channel}/releases/download/vX.Y.Z/release.json` (and `.sig`): one release's manifest;
- the releases' list, GitHub's REST API `GET /repos/OWNER/REPO/releases` (api.github.com for
  github.com, `/api/v3` on another host: GitHub Enterprise, or devkit/release_channel.py).

Every answer is read by `_read_answer` alone, through the validator's bounded reader: within the
bytes of its kind (`release.listing`, `release.asset`) and one overall deadline, redirects
included (GitHub serves an asset from another host); the list is decoded within its cap's JSON
values and nesting, a signature by `verify` within its own. The channel answers before any
signature is checked, so what it sends must never cost more than that: a channel that trickles,
nests or pads is "unavailable", or for a signature "not a signature".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from launcher.errors import UsageError
from launcher.options import DEFAULT_CHANNEL
from launcher.release.manifest import (
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
from validator.errors import AnswerTooLarge
from validator.outbound.answer_caps import ANSWER_CAPS, Cap, where
from validator.outbound.bounded_reader import Answer, fetch_answer
from validator.outbound.deadline import CallAbandoned, overall_deadline

LISTING_CAP = ANSWER_CAPS["release.listing"]
MAX_LISTING_BYTES = LISTING_CAP.max_bytes
ASSET_CAP = ANSWER_CAPS["release.asset"]
# Each answer, its redirects included, within TOTAL_SECONDS; each read within READ_SECONDS.
CONNECT_SECONDS, READ_SECONDS, TOTAL_SECONDS = 10.0, 30.0, 60.0
MAX_REDIRECTS = 5
REDIRECTS = (301, 302, 303, 307, 308)


class ReleaseUnavailable(Exception):
    """The channel could not say (unreachable, no such release): nothing to verify, so the
    caller runs nothing (run.py --pull, exit 3), or keeps what it runs (the follower)."""


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


def _read_answer(url: str, cap: Cap, accept: str = "application/octet-stream") -> Answer:
    """The answer to a GET of `url` (redirects followed), read within `cap` and TOTAL_SECONDS in
    all: the one place where the channel's answers are read. ReleaseUnavailable for whatever
    keeps it from answering, past its cap or its deadline included."""
    headers = {"Accept": accept, "User-Agent": "flock-validator"}
    try:
        with overall_deadline(TOTAL_SECONDS, f"GET {where(url)}"):
            for _ in range(MAX_REDIRECTS + 1):
                answer = fetch_answer(
                    "GET", url, cap, deadline_s=TOTAL_SECONDS, headers=headers,
                    timeout=(CONNECT_SECONDS, READ_SECONDS),
                )  # fmt: skip
                if answer.status_code not in REDIRECTS:
                    break
                url = _redirected(url, answer.headers.get("Location"))
            else:
                raise ReleaseUnavailable(f"over {MAX_REDIRECTS} redirects from {where(url)}")
    except CallAbandoned:
        raise ReleaseUnavailable(f"{where(url)} took over {TOTAL_SECONDS:g} s") from None
    except AnswerTooLarge as exc:
        raise ReleaseUnavailable(str(exc)) from None
    except requests.RequestException as exc:
        why = type(exc).__name__
        raise ReleaseUnavailable(f"the release channel cannot be reached ({why})") from None
    if answer.status_code == 404:
        raise ReleaseUnavailable("not published")
    if answer.status_code != 200:
        raise ReleaseUnavailable(f"HTTP {answer.status_code} from {where(url)}")
    return answer


def _redirected(url: str, location: str | None) -> str:
    """Where a redirect leads: http(s) only, and never from https down to plain http."""
    try:
        target = urljoin(url, location or "")
        scheme = urlsplit(target).scheme
    except ValueError:  # a Location that is no URL ("http://[::1", say)
        target, scheme = "", ""
    downgrade = urlsplit(url).scheme == "https" and scheme == "http"
    if not location or scheme not in ("https", "http") or downgrade:
        raise ReleaseUnavailable(f"{where(url)} redirects to {str(location)[:100]!r}")
    return target


def fetch_release(
    channel: Channel, version: str, keys: dict[str, Ed25519PublicKey] | None = None
) -> ReleaseManifest:
    """Release `version`'s manifest, verified against this checkout's keys. ReleaseUnavailable
    when the channel cannot say, or this checkout trusts no key yet (no release to check it
    against); ReleaseRefused (exit 3) when the channel says something unsigned."""
    keys = trusted_keys() if keys is None else keys
    if not keys:
        raise ReleaseUnavailable(f"this checkout trusts no release key ({KEYS_FILE.name})")
    manifest = _read_answer(channel.asset(version, MANIFEST), _asset_cap(MAX_MANIFEST_BYTES))
    signature = _read_answer(channel.asset(version, SIGNATURE), _asset_cap(MAX_SIGNATURE_BYTES))
    return verify(manifest.content, signature.content, version, keys)


def _asset_cap(max_bytes: int) -> Cap:
    return replace(ASSET_CAP, max_bytes=min(max_bytes, ASSET_CAP.max_bytes))


def newer_versions(channel: Channel, current: str) -> list[str]:
    """The published releases after `current` with its major version, newest first (drafts and
    pre-releases left out). ReleaseUnavailable when the channel cannot say."""
    answer = _read_answer(channel.listing(), LISTING_CAP, "application/vnd.github+json")
    try:
        listed: Any = answer.json()  # within the cap's bytes, values and nesting
        tags = [
            str(entry["tag_name"])
            for entry in listed
            if not entry.get("draft") and not entry.get("prerelease")
        ]
    except (ValueError, TypeError, KeyError, AttributeError):  # JsonRefused is a ValueError
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
