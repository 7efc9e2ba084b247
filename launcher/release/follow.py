"""`run.py MODULE --pull --follow-releases`: opt-in updates, as Watchtower and PM2 offer them,
but only to what verifies (docs/upgrading.md "Following releases" says what an operator sees).

A thread looks every VALIDATOR_FOLLOW_INTERVAL seconds for releases after the running one with
the same major version; the newest whose manifest verifies against this checkout's keys, and
whose journal schema a rollback can still read, is pulled by digest while the validator works,
then each worker (launcher/engine/supervisor.py `upgrade`) is stopped as an operator's stop
stops it and started on the new image with the same journal. A release refused is one line,
once; a start looks at once (`start_on`), so a restart resumes the newest release that
verifies. The launcher's own code stays the checkout's: a new major version is an upgrade by
hand.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import docker
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from launcher.engine.fault_hook import kill_point
from launcher.errors import UsageError, say
from launcher.release.channel import Channel, ReleaseUnavailable, fetch_release, newer_versions
from launcher.release.manifest import ReleaseRefused
from launcher.release.published import pull_release
from validator.state.store import SCHEMA_VERSION

INTERVAL_ENV = "VALIDATOR_FOLLOW_INTERVAL"
DEFAULT_INTERVAL = 3600.0


class Upgradable(Protocol):
    def upgrade(self, image: str, why: str) -> None: ...


def check_options(pull: bool, follow: bool, check_file: object) -> None:
    """The door's part: --follow-releases follows released images, and a --check ends anyway."""
    if follow and not pull:
        raise UsageError("--follow-releases moves between released images: give --pull too")
    if follow and check_file is not None:
        raise UsageError("--check scores one input and ends: give it without --follow-releases")
    if follow:
        interval()  # a malformed VALIDATOR_FOLLOW_INTERVAL, before any image is pulled


def interval(env: dict[str, str] | None = None) -> float:
    raw = (os.environ if env is None else env).get(INTERVAL_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_INTERVAL
    except ValueError:
        value = -1.0
    if not 0 < value < math.inf:
        raise UsageError(f"{INTERVAL_ENV} {raw!r}: give the seconds between two looks, e.g. 3600")
    return value


class Follower:
    """Moves `targets` to each newer verified release; `check` is one look."""

    def __init__(
        self,
        client: docker.DockerClient,
        registry: str,
        module: str,
        channel: Channel,
        version: str,
        targets: Sequence[Upgradable],
        *,
        journal_schema: int = SCHEMA_VERSION,
        image: str | None = None,  # the image running, when known
        tell: Callable[[str], None] = say,
        keys: dict[str, Ed25519PublicKey] | None = None,  # None: this checkout's
    ) -> None:
        self.client, self.registry, self.module, self.channel = client, registry, module, channel
        self.version, self.journal_schema = version, journal_schema  # the release running
        self.targets, self.image = targets, image
        self.tell, self.keys = tell, keys
        self.refused: set[str] = set()  # said once each

    def look(self) -> None:
        """One look of the thread: whatever goes wrong in it (a channel's answer nothing
        expected, a lost engine) is one line, and the next look comes all the same; an
        exception left to end the thread would end the following for the process's life."""
        try:
            self.check()
        except Exception as exc:  # noqa: BLE001 - the thread must outlive any one look
            self.tell(f"following releases: this look failed ({_why(exc)}); looking again later")

    def start_on(self, image: str) -> str:
        """The image to start the workers on: `image` (the checkout's release, or its build),
        or the newest newer release that verifies, looked for now."""
        self.image = image
        try:
            found = self.check()
        except Exception as exc:  # noqa: BLE001 - a failed look keeps the checkout's release
            self.tell(f"following releases: this look failed ({_why(exc)}); looking again later")
            return image
        if found is None:
            return image
        self.tell(f"following releases: starting on release v{self.version}, {found}")
        return found

    def check(self) -> str | None:
        """The image of the release moved to, or None (nothing newer that verifies)."""
        try:
            versions = newer_versions(self.channel, self.version)
        except ReleaseUnavailable:
            return None  # asked again at the next look
        for version in versions:
            if version in self.refused:
                continue
            image = self._take(version)
            if image is not None or self.version == version:  # followed, moved or not
                return image
        return None

    def _take(self, version: str) -> str | None:
        try:
            manifest = fetch_release(self.channel, version, self.keys)
            if manifest.journal_schema > self.journal_schema:
                raise ReleaseRefused(
                    f"release v{version} keeps its journal at schema {manifest.journal_schema}, "
                    f"newer than v{self.version}'s {self.journal_schema}: a rollback could not "
                    "read it; upgrade by hand (docs/upgrading.md)"
                )
            instead = f"staying on v{self.version}, pulled again at the next look"
            image = pull_release(self.client, self.registry, self.module, manifest, instead)
        except ReleaseUnavailable:
            return None
        except ReleaseRefused as exc:
            self.refused.add(version)
            self.tell(f"not following release v{version}: {exc}")
            return None
        if image is None:
            return None  # the registry could not be reached: tried again at the next look
        was, self.version, self.journal_schema = self.version, version, manifest.journal_schema
        if image == self.image:
            self.tell(
                f"release v{version} verified (was v{was}); it signs the image already "
                f"running, {image}: nothing to move"
            )
            return None
        kill_point("switch:pulled")
        why = f"release v{version} verified (was v{was})"
        for target in self.targets:
            target.upgrade(image, why)
        self.image = image
        kill_point("switch:asked")
        return image

    def follow(self, targets: Sequence[Upgradable]) -> threading.Thread:
        """Moves `targets` from now on: a look every VALIDATOR_FOLLOW_INTERVAL seconds."""
        self.targets = targets
        return self.start(interval(), threading.Event())

    def start(self, every: float, stop: threading.Event) -> threading.Thread:
        def watch() -> None:
            while not stop.wait(every):
                self.look()

        thread = threading.Thread(target=watch, name="follow-releases", daemon=True)
        thread.start()
        return thread


def _why(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
