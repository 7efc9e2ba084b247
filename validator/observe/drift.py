"""Protocol drift: has the network's code moved past the commit a module's rules follow?

A module's spec pins the network's repository, the folder of its rules and a commit
(`protocol:` in module.yaml). At start-up and then every INTERVAL_S, a background thread asks
GitHub's REST API (unauthenticated, under a short timeout and an overall deadline) which
commits touched that folder after the pin. When some did: one WARNING line naming them, the
metric flock_validator_protocol_commits_behind{module}, a line on the status page. Offline:
"unknown", said once. The answer is cached in the state dir, so a restart within the interval
asks nothing. Nothing here is fatal or runs on the scoring thread.

--no-protocol-watch (VALIDATOR_PROTOCOL_WATCH=off) turns it off; VALIDATOR_GITHUB_API points at
another API (a test's stand-in, a mirror).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import requests
from prometheus_client import Gauge
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from validator.errors import AnswerTooLarge, describe
from validator.observe.telemetry import PREFIX, REGISTRY
from validator.outbound.bounded_reader import fetch_answer
from validator.outbound.deadline import overall_deadline
from validator.spec import ModuleSpec, ProtocolPin

log = logging.getLogger(__name__)

WATCH_ENV = "VALIDATOR_PROTOCOL_WATCH"
API_ENV = "VALIDATOR_GITHUB_API"
DEFAULT_API = "https://api.github.com"
INTERVAL_S = 6 * 3600.0
# An unanswered check is asked again sooner than a settled one, but not on every restart.
UNKNOWN_RETRY_S = 1800.0
TIMEOUT = (5.0, 10.0)  # connect, read
DEADLINE_S = 30.0  # both calls together, their reading and parsing included
NAMED = 5  # commits named in the warning, and all the cache keeps of them
PAGE = 100  # commits asked for: one page, read under the github.commits cap
MESSAGE_CHARS = 120  # of a commit's first line
CACHE_PREFIX = "protocol-drift-"
CACHE_MAX_BYTES = 8 * 1024  # a cache file is a few hundred bytes; past this it is damaged
SHA_PATTERN = r"^[0-9a-f]{40}$"

State = Literal["current", "behind", "unknown"]
Sha = Annotated[str, Field(pattern=SHA_PATTERN)]
Message = Annotated[str, Field(max_length=MESSAGE_CHARS)]

COMMITS_BEHIND = Gauge(
    f"{PREFIX}_protocol_commits_behind",
    "Commits to the network's code of this module's rules after the commit they follow "
    "(module.yaml's protocol pin; -1: not known yet)",
    ["module"],
    registry=REGISTRY,
)
_status: dict[str, str] = {}  # module -> the status page's line


@dataclass(frozen=True)
class Drift:
    state: State
    # (sha, first line), newest first: the first NAMED of them.
    commits: list[tuple[str, str]] = field(default_factory=list)
    checked_at: float = 0.0
    why: str = ""  # unknown: what failed
    count: int = 0  # commits after the pin (PAGE: at least that many)

    def describe(self, pin: ProtocolPin) -> str:
        where = f"{pin.repo}/{pin.path}" if pin.path else pin.repo
        if self.state == "current":
            return f"rules follow {where} at {pin.commit[:7]}, its newest change there"
        if self.state == "unknown":
            return f"whether {where} moved past {pin.commit[:7]} is unknown ({self.why})"
        named = "; ".join(f"{sha[:7]} {message}" for sha, message in self.commits[:NAMED])
        more = f"; and {self.count - NAMED} more" if self.count > NAMED else ""
        many = "at least " if self.count >= PAGE else ""
        return (
            f"the network's {where} has {many}{self.count} commit(s) after {pin.commit[:7]}, "
            f"which these rules follow: {named}{more}"
        )


def enabled(env: dict[str, str] | None = None) -> bool:
    value = (env if env is not None else os.environ).get(WATCH_ENV, "").strip().lower()
    return value not in ("off", "0", "false", "no")


def api_base(env: dict[str, str] | None = None) -> str:
    return ((env if env is not None else os.environ).get(API_ENV) or DEFAULT_API).rstrip("/")


# -- GitHub's answers: only what the watch needs, each sha checked -------------------------------


class _Committer(BaseModel):
    model_config = ConfigDict(extra="ignore")
    date: str = Field(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


class _CommitBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    message: str
    committer: _Committer


class _Commit(BaseModel):
    model_config = ConfigDict(extra="ignore")
    sha: Sha
    commit: _CommitBody

    def named(self) -> tuple[str, str]:
        return self.sha, self.commit.message.split("\n", 1)[0][:MESSAGE_CHARS]


_PAGE_OF_COMMITS = TypeAdapter(list[_Commit])


def ask(pin: ProtocolPin, api: str) -> Drift:
    """The commits that touched the pin's folder after it: the pin's own date (the first of a
    listing that starts at it: a commit's own answer carries its whole diff), then a page of
    the folder's commits since that date (GitHub lists newest first). Both answers are read
    and parsed within the github.commits cap and one overall deadline."""
    try:
        with overall_deadline(DEADLINE_S, "protocol drift check"):
            pinned = _commits(api, pin, {"sha": pin.commit, "per_page": "1"})
            if not pinned or pinned[0].sha != pin.commit:
                raise RuntimeError(f"GitHub does not list the commit {pin.commit[:7]}")
            params = {"since": pinned[0].commit.committer.date, "per_page": str(PAGE)}
            if pin.path:
                params["path"] = pin.path
            listed = _commits(api, pin, params)
    except Exception as exc:  # never fatal: whatever failed, the answer is "unknown"
        return Drift("unknown", checked_at=time.time(), why=_why(exc))
    after = [item.named() for item in listed if item.sha != pin.commit]
    state: State = "behind" if after else "current"
    return Drift(state, after[:NAMED], time.time(), count=len(after))


def _commits(api: str, pin: ProtocolPin, params: dict[str, str]) -> list[_Commit]:
    url = f"{api}/repos/{pin.repo}/commits"
    headers = {"Accept": "application/vnd.github+json", "User-Agent": "flock-validator"}
    answer = fetch_answer(
        "GET", url, "github.commits", deadline_s=DEADLINE_S, timeout=TIMEOUT, headers=headers,
        params=params, what=f"GET {api}/repos/{pin.repo}/commits",
    )  # fmt: skip
    if answer.status_code != 200:
        raise RuntimeError(f"HTTP {answer.status_code} from {api}")
    page = _PAGE_OF_COMMITS.validate_python(answer.json())
    if len(page) > PAGE:
        raise ValueError(f"{len(page)} commits in a page of {PAGE}")
    return page


def _why(exc: Exception) -> str:
    if isinstance(exc, requests.RequestException):
        return f"GitHub unreachable: {type(exc).__name__}"
    if isinstance(exc, AnswerTooLarge):
        return f"an answer over its cap of {exc.max_bytes} bytes"
    if isinstance(exc, (KeyError, TypeError, ValueError)):  # pydantic's, JsonRefused
        return "an answer of an unexpected shape"
    return str(exc)[:200] or type(exc).__name__


# -- the cache in the state dir: a few hundred bytes, checked whole when read -------------------


class _Cached(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pin: str = Field(pattern=SHA_PATTERN)
    api: str = Field(max_length=2000)
    state: State
    commits: list[tuple[Sha, Message]] = Field(max_length=NAMED)
    count: int = Field(ge=0, le=PAGE)
    checked_at: float = Field(ge=0)
    why: str = Field(max_length=200)

    @model_validator(mode="after")
    def _consistent(self) -> _Cached:
        if not math.isfinite(self.checked_at):
            raise ValueError("checked_at is not a time")
        if (self.state == "behind") != (self.count > 0) or len(self.commits) > self.count:
            raise ValueError(f"{self.count} commit(s) do not make {self.state!r}")
        return self


def cache_file(state_dir: Path, module: str) -> Path:
    return state_dir / f"{CACHE_PREFIX}{module}.json"


def cached(state_dir: Path, module: str, pin: ProtocolPin, api: str, now: float) -> Drift | None:
    """The last answer, when it is for this pin and API and young enough. A file that is not
    one the watch wrote (damaged, cut, grown, edited) is said in a WARNING and deleted: the
    next check asks GitHub again."""
    path = cache_file(state_dir, module)
    try:
        with path.open("rb") as f:
            data = f.read(CACHE_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("protocol drift: cannot read %s (%s); asking GitHub", path, describe(exc))
        return None
    try:
        if len(data) > CACHE_MAX_BYTES:
            raise ValueError(f"over {CACHE_MAX_BYTES} bytes")
        raw = _Cached.model_validate_json(data)
    except ValueError as exc:  # pydantic's ValidationError too
        _discard(path, exc)
        return None
    if raw.pin != pin.commit or raw.api != api:
        return None
    drift = Drift(raw.state, raw.commits, raw.checked_at, raw.why, raw.count)
    age = now - drift.checked_at
    fresh = UNKNOWN_RETRY_S if drift.state == "unknown" else INTERVAL_S
    return drift if 0 <= age < fresh else None


def _discard(path: Path, exc: ValueError) -> None:
    why = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) and exc.errors() else exc
    log.warning(
        "protocol drift: the cache %s is damaged (%s); deleted, asking GitHub again",
        path,
        str(why)[:200],
    )
    try:
        path.unlink()
    except OSError as unlink_error:
        log.warning("protocol drift: cannot delete %s: %s", path, describe(unlink_error))


def store(state_dir: Path, module: str, pin: ProtocolPin, api: str, drift: Drift) -> None:
    path = cache_file(state_dir, module)
    record = _Cached(
        pin=pin.commit,
        api=api,
        state=drift.state,
        commits=drift.commits[:NAMED],
        count=drift.count,
        checked_at=drift.checked_at,
        why=drift.why[:200],
    )
    try:
        temporary = path.with_suffix(".tmp")
        temporary.write_text(record.model_dump_json(), encoding="utf-8")
        os.replace(temporary, path)
    except OSError as exc:  # a full or read-only state dir: asked again next time
        log.debug("protocol drift: cache not written: %s", exc)


def check(module: str, pin: ProtocolPin, state_dir: Path, api: str) -> Drift:
    now = time.time()
    drift = cached(state_dir, module, pin, api, now)
    if drift is None:
        drift = ask(pin, api)
        store(state_dir, module, pin, api, drift)
    return drift


class DriftWatch:
    """The background thread: a check at start-up, then one per INTERVAL_S, until `stop`."""

    def __init__(self, spec: ModuleSpec, state_dir: Path, stop: threading.Event, api: str):
        assert spec.protocol is not None
        self.module, self.pin, self.state_dir, self.api = spec.name, spec.protocol, state_dir, api
        self.stop = stop
        self.said: tuple[State, tuple] | None = None
        self.thread = threading.Thread(target=self._run, name="protocol-drift", daemon=True)
        COMMITS_BEHIND.labels(self.module).set(-1)

    def start(self) -> DriftWatch:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.report(check(self.module, self.pin, self.state_dir, self.api))
            except Exception as exc:  # a bug here must not end the validator
                log.warning("protocol drift check failed: %s", describe(exc), exc_info=True)
            self.stop.wait(INTERVAL_S)

    def report(self, drift: Drift) -> None:
        """A line when what is known changes (so: once while offline); the metric and the
        status page's line every time."""
        text = drift.describe(self.pin)
        _status[self.module] = text
        COMMITS_BEHIND.labels(self.module).set(-1 if drift.state == "unknown" else drift.count)
        known = (drift.state, tuple(sha for sha, _ in drift.commits))
        if known == self.said or (drift.state == "unknown" and self.said is not None):
            return
        self.said = known
        if drift.state == "behind":
            log.warning("protocol drift: %s (docs/operating.md, Protocol drift)", text)
        else:
            log.info("protocol drift: %s", text)


def start_drift_watch(
    spec: ModuleSpec, state_dir: Path, stop: threading.Event, watch: bool | None = None
) -> DriftWatch | None:
    """The module's watch, started; None when its spec pins nothing or it is turned off
    (`watch`: --no-protocol-watch; None: VALIDATOR_PROTOCOL_WATCH decides)."""
    if spec.protocol is None or not (enabled() if watch is None else watch):
        return None
    return DriftWatch(spec, state_dir, stop, api_base()).start()


def status_line() -> str:
    """The status page's line: each watched module's drift, or empty."""
    return " · ".join(f"{module}: {text}" for module, text in sorted(_status.items()))
