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

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import requests
from prometheus_client import Gauge

from validator.kit.deadline import overall_deadline
from validator.observe.telemetry import PREFIX, REGISTRY
from validator.spec import ModuleSpec, ProtocolPin

log = logging.getLogger(__name__)

WATCH_ENV = "VALIDATOR_PROTOCOL_WATCH"
API_ENV = "VALIDATOR_GITHUB_API"
DEFAULT_API = "https://api.github.com"
INTERVAL_S = 6 * 3600.0
# An unanswered check is asked again sooner than a settled one, but not on every restart.
UNKNOWN_RETRY_S = 1800.0
TIMEOUT = (5.0, 10.0)  # connect, read
DEADLINE_S = 30.0  # both calls together
NAMED = 5  # commits named in the warning
PAGE = 100
CACHE_PREFIX = "protocol-drift-"

State = Literal["current", "behind", "unknown"]

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
    commits: list[tuple[str, str]] = field(default_factory=list)  # (sha, first line), newest first
    checked_at: float = 0.0
    why: str = ""  # unknown: what failed

    def describe(self, pin: ProtocolPin) -> str:
        where = f"{pin.repo}/{pin.path}" if pin.path else pin.repo
        if self.state == "current":
            return f"rules follow {where} at {pin.commit[:7]}, its newest change there"
        if self.state == "unknown":
            return f"whether {where} moved past {pin.commit[:7]} is unknown ({self.why})"
        named = "; ".join(f"{sha[:7]} {message}" for sha, message in self.commits[:NAMED])
        more = f"; and {len(self.commits) - NAMED} more" if len(self.commits) > NAMED else ""
        return (
            f"the network's {where} has {len(self.commits)} commit(s) after {pin.commit[:7]}, "
            f"which these rules follow: {named}{more}"
        )


def enabled(env: dict[str, str] | None = None) -> bool:
    value = (env if env is not None else os.environ).get(WATCH_ENV, "").strip().lower()
    return value not in ("off", "0", "false", "no")


def api_base(env: dict[str, str] | None = None) -> str:
    return ((env if env is not None else os.environ).get(API_ENV) or DEFAULT_API).rstrip("/")


def ask(pin: ProtocolPin, api: str) -> Drift:
    """The commits that touched the pin's folder after it: the pin's own date, then the
    folder's commits since that date (GitHub lists newest first)."""
    headers = {"Accept": "application/vnd.github+json", "User-Agent": "flock-validator"}
    try:
        with overall_deadline(DEADLINE_S, "protocol drift check"):
            pinned = _get(f"{api}/repos/{pin.repo}/commits/{pin.commit}", headers, {})
            since = pinned["commit"]["committer"]["date"]
            params = {"since": since, "per_page": str(PAGE)}
            if pin.path:
                params["path"] = pin.path
            listed = _get(f"{api}/repos/{pin.repo}/commits", headers, params)
        commits = [
            (str(item["sha"]), str(item["commit"]["message"]).split("\n", 1)[0][:120])
            for item in listed
            if item["sha"] != pin.commit
        ]
    except Exception as exc:  # never fatal: whatever failed, the answer is "unknown"
        return Drift("unknown", checked_at=time.time(), why=_why(exc))
    return Drift("behind" if commits else "current", commits, time.time())


def _get(url: str, headers: dict[str, str], params: dict[str, str]):
    response = requests.get(
        url, headers=headers, params=params, timeout=TIMEOUT, allow_redirects=False
    )
    if response.status_code != 200:
        raise RuntimeError(f"HTTP {response.status_code} from {url.split('/repos/')[0]}")
    return response.json()


def _why(exc: Exception) -> str:
    if isinstance(exc, requests.RequestException):
        return f"GitHub unreachable: {type(exc).__name__}"
    if isinstance(exc, (KeyError, TypeError, ValueError)):
        return "an answer of an unexpected shape"
    return str(exc)[:200] or type(exc).__name__


def cache_file(state_dir: Path, module: str) -> Path:
    return state_dir / f"{CACHE_PREFIX}{module}.json"


def cached(state_dir: Path, module: str, pin: ProtocolPin, api: str, now: float) -> Drift | None:
    """The last answer, when it is for this pin and API and young enough."""
    try:
        raw = json.loads(cache_file(state_dir, module).read_text(encoding="utf-8"))
        if raw["pin"] != pin.commit or raw["api"] != api:
            return None
        drift = Drift(
            raw["state"], [tuple(c) for c in raw["commits"]], raw["checked_at"], raw["why"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if drift.state not in ("current", "behind", "unknown"):
        return None
    age = now - drift.checked_at
    fresh = UNKNOWN_RETRY_S if drift.state == "unknown" else INTERVAL_S
    return drift if 0 <= age < fresh else None


def store(state_dir: Path, module: str, pin: ProtocolPin, api: str, drift: Drift) -> None:
    path = cache_file(state_dir, module)
    try:
        temporary = path.with_suffix(".tmp")
        temporary.write_text(
            json.dumps({"pin": pin.commit, "api": api, **asdict(drift)}), encoding="utf-8"
        )
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
            except Exception:  # a bug here must not end the validator
                log.debug("protocol drift check failed", exc_info=True)
            self.stop.wait(INTERVAL_S)

    def report(self, drift: Drift) -> None:
        """A line when what is known changes (so: once while offline); the metric and the
        status page's line every time."""
        text = drift.describe(self.pin)
        _status[self.module] = text
        COMMITS_BEHIND.labels(self.module).set(
            -1 if drift.state == "unknown" else len(drift.commits)
        )
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
