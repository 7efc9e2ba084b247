"""The runtime scope of one scoring: what a module may tell the loop while `validate()` runs.

    from validator.kit import current_scope

    scope = current_scope()
    with scope.host_work("download"):   # a death in here is this host's doing, not the submission's
        ...
    scope.note("commit", sha)           # a fact for the assignment's record
    scope.penalty("cannot_load", why)   # the metrics returned are the network's penalty: why
    progress = scope.progress("scoring", total=len(batches), unit="batches")

Outside a run (`--check`, tests, a notebook) the scope is `NO_RUN`: every call is a no-op, so
a module needs no branch for it. The loop enters a scope of its own for each assignment
(validator/state/phases.py). The scope is a context variable: it follows the thread that runs
`validate()`; a thread a module starts sees it when started through `contextvars.copy_context()`
(or takes `current_scope()` along as an argument).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from typing import Literal, get_args

from validator._moved import moved_name

log = logging.getLogger(__name__)

EVERY_SECONDS = 30.0

# What a module's host work is: fetching files, loading a base model, reading the task's data,
# waiting on outside services (judge models). Also the phases that records and metrics time.
HostPhase = Literal["download", "load", "data", "wait"]
HOST_PHASES: tuple[HostPhase, ...] = get_args(HostPhase)

# Why a module's metrics are the network's penalty (a -999, lora's loss 999) rather than a
# score: a small fixed set, so that a metric label and the report's tables stay bounded. The
# reason's text says the rest.
PenaltyKind = Literal["over_max_params", "cannot_load", "no_score"]
PENALTY_KINDS: tuple[PenaltyKind, ...] = get_args(PenaltyKind)
MAX_PENALTY_REASON = 1000


class Scope:
    """The no-op scope; the loop's scope (validator/state/phases.py) overrides the three hooks."""

    @contextmanager
    def host_work(self, phase: HostPhase) -> Iterator[None]:
        """A section of `validate()` whose failure to return is not the submission's: if the
        process dies inside it, the scoring attempt is not counted. Its time is recorded under
        `phase`; the rest of `validate()` is the submission's own ("score")."""
        if phase not in HOST_PHASES:
            raise ValueError(f"host_work phase {phase!r}: one of {', '.join(HOST_PHASES)}")
        self._enter(phase)
        try:
            yield
        finally:
            self._leave(phase)

    def note(self, key: str, value: object) -> None:
        """A fact of the assignment being scored for its record (e.g. "commit", the revision
        it resolved to); in a run, the result's log line shows the commit. Outside a run
        (`--check`), a log line."""
        log.info("%s: %s", key, str(value)[:200])

    def penalty(self, kind: PenaltyKind, reason: str) -> None:
        """The metrics `validate()` returns are the network's penalty, not a score (a model over
        max_params, one that cannot be loaded, a loss that cannot be computed), for `reason`.
        The metrics are submitted unchanged; the kind and the reason go to the journal, the
        record, the status page, the report and a metric label. Outside a run, a log line."""
        check_penalty_kind(kind)
        log.warning("penalty (%s): %s", kind, reason)

    def heartbeat(self) -> None:
        """Long work is still going: /healthz must not call the loop stuck."""

    def progress(self, what: str, total: int | None = None, unit: str = "") -> Progress:
        """A progress line every 30 s for long work, each one also a heartbeat of this scope."""
        return Progress(what, total=total, unit=unit, beat=self.heartbeat)

    def _enter(self, phase: HostPhase) -> None:
        """Host work `phase` begins (the loop records it on disk, for after a SIGKILL)."""

    def _leave(self, phase: HostPhase) -> None:
        """Host work `phase` ends; the submission's own work goes on."""


def check_penalty_kind(kind: str) -> None:
    if kind not in PENALTY_KINDS:
        raise ValueError(f"penalty kind {kind!r}: one of {', '.join(PENALTY_KINDS)}")


class Progress:
    """Progress of long work (a scoring's batches): a log line at most every `every` seconds
    instead of minutes of silence, each one a heartbeat of the scope it was made in."""

    def __init__(
        self,
        what: str,
        total: int | None = None,
        unit: str = "",
        every: float = EVERY_SECONDS,
        beat: Callable[[], None] | None = None,
    ) -> None:
        self.what, self.total, self.unit, self.every = what, total, unit, every
        # Taken now: `advance` may be called from a thread that does not see the scope.
        self.beat = beat if beat is not None else current_scope().heartbeat
        self.done = 0
        self.started = self.last = time.monotonic()

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            log.info("%s: %s", self.what, self.describe(now))
            self.beat()

    def describe(self, now: float | None = None) -> str:
        elapsed = (now or time.monotonic()) - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        share = f" of {self.total} ({self.done / self.total:.0%})" if self.total else ""
        return f"{self.done}{share} {self.unit} in {elapsed:.0f} s, {rate:.2f}/s".replace("  ", " ")


NO_RUN = Scope()
_current: ContextVar[Scope] = ContextVar("validator_scope", default=NO_RUN)
# What stays held until the scoring in progress ends (a base model marked in use in a shared HF
# cache, validator/outbound/hf_cache.py); None outside a run.
_held: ContextVar[ExitStack | None] = ContextVar("validator_scope_held", default=None)


def current_scope() -> Scope:
    """The scope of the scoring in progress; `NO_RUN` (no-ops) outside one."""
    return _current.get()


@contextmanager
def entered(scope: Scope) -> Iterator[Scope]:
    """`scope` is the current scope inside the block (the loop, around `validate()`)."""
    stack = ExitStack()
    token = _current.set(scope)
    held = _held.set(stack)
    try:
        with stack:
            yield scope
    finally:
        _held.reset(held)
        _current.reset(token)


def held_until_scored() -> ExitStack | None:
    """An exit stack closed when the scoring in progress ends (what is entered into it is held
    until then); None outside a run, where the caller releases what it took itself."""
    return _held.get()


def __getattr__(name: str) -> object:
    return moved_name(__name__, name)  # the functions `validator.phases` gave
