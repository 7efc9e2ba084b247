"""What the loop is doing, for the operator: three middleware on the runner's hooks
(validator/observe/hooks.py). `Metrics` moves the Prometheus metrics (telemetry.py), `Records`
writes the per-assignment records (validator/state/records.py), `StatusBoard` holds what the
status page and /healthz show (status_server.py). Each reacts to what the runner tells it;
nothing here decides anything.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from validator.observe import telemetry
from validator.observe.hooks import Hooks, Middleware
from validator.observe.lines import phases_text
from validator.state.entry import FINAL, Entry, State
from validator.state.phases import phase_name
from validator.state.records import (
    AssignmentRecord,
    LogCapture,
    RecordStore,
    json_safe,
    main_metric,
    outcome_label,
)

log = logging.getLogger(__name__)
RECENT = 10


class Observer(Hooks):
    """The loop's hook list: records, metrics and the status page's board, in that order (a
    finished assignment's record is on disk before it is counted or shown)."""

    def __init__(
        self,
        state_dir: Path,
        module: str,
        records_keep: int,
        lookups: str = "",
        config_for: Callable[[str], BaseModel] | None = None,
        penalty_rules: str = "",
    ) -> None:
        self.records = Records(state_dir, module, records_keep, config_for)
        self.metrics = Metrics()
        self.status = StatusBoard(module, lookups, penalty_rules)
        super().__init__(self.records, self.metrics, self.status)


class Metrics(Middleware):
    """The Prometheus metrics of the loop (telemetry.py). The last-progress gauge moves with
    the status board's (/healthz): at each step, and at each phase and beat of a scoring."""

    def __init__(self) -> None:
        self._progress()

    def _progress(self) -> None:
        telemetry.LAST_PROGRESS.set(time.time())

    def before_pass(self, undecided: int, unsubmitted: int) -> None:
        telemetry.BACKLOG.labels("undecided").set(undecided)
        telemetry.BACKLOG.labels("unsubmitted").set(unsubmitted)
        self._progress()

    def after_lookup(
        self, task_id: str, answer: str, seconds: float, assignment_id: str | None
    ) -> None:
        telemetry.LOOKUPS.labels(task_id, answer).inc()
        telemetry.PHASE_SECONDS.labels("lookup").observe(seconds)
        self._progress()

    def on_task_aside(self, task_id: str, reason: str | None) -> None:
        telemetry.TASK_SET_ASIDE.labels(task_id).set(0 if reason is None else 1)

    def before_attempt(self, entry: Entry) -> None:
        telemetry.SCORING.set(1)
        self._progress()

    def on_phase(self, phase: str) -> None:
        self._progress()

    def on_beat(self) -> None:
        self._progress()

    def after_score(self, entry: Entry, phases: dict[str, float], commit: str | None) -> None:
        for phase, seconds in phases.items():
            telemetry.PHASE_SECONDS.labels(phase).observe(seconds)

    def after_submit(self, entry: Entry, seconds: float) -> None:
        telemetry.PHASE_SECONDS.labels("submit").observe(seconds)
        self._progress()

    def after_finish(self, entry: Entry) -> None:
        outcome = outcome_label(entry.state.value, entry.outcome)
        telemetry.ASSIGNMENTS.labels(entry.task_id, outcome).inc()
        if entry.state is State.SUBMITTED:
            telemetry.LAST_SUBMIT.set(time.time())
            if entry.penalty is not None:
                kind = entry.penalty_kind or telemetry.UNRECORDED
                telemetry.PENALTIES.labels(entry.task_id, kind).inc()

    def after_attempt(self, entry: Entry, exception: BaseException | None = None) -> None:
        telemetry.SCORING.set(0)
        self._progress()


@dataclass
class _Extras:
    """What a record holds beyond the journal's row."""

    phases: dict[str, float] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    commit: str | None = None


class Records(Middleware):
    """The record of each assignment (validator/state/records.py): written as the journal has
    it after each submit and each attempt, with its config, commit, seconds per phase and the
    log lines of its attempts; kept in memory only until it is finished."""

    def __init__(
        self,
        state_dir: Path,
        module: str,
        keep: int,
        config_for: Callable[[str], BaseModel] | None = None,
    ) -> None:
        self.module = module
        # The config a task's assignments are scored with (ModulePool.config_for), for the
        # record: read here, so that the loop hands the hooks nothing but its entry.
        self._config_for = config_for
        self.store = RecordStore(state_dir, keep)
        self._extras: dict[str, _Extras] = {}
        self._capture: LogCapture | None = None

    def after_lookup(
        self, task_id: str, answer: str, seconds: float, assignment_id: str | None
    ) -> None:
        if assignment_id is not None:
            self._extra(assignment_id).phases["lookup"] = round(seconds, 3)

    def before_attempt(self, entry: Entry) -> None:
        extras = self._extra(entry.id)
        if self._config_for is not None:
            extras.config = json_safe(self._config_for(entry.task_id).model_dump())
        # Into the record's own list: a record written during the attempt (its submit) has the
        # lines so far, after an earlier attempt's.
        self._capture = LogCapture(extras.log)
        self._capture.start()

    def after_score(self, entry: Entry, phases: dict[str, float], commit: str | None) -> None:
        extras = self._extra(entry.id)
        extras.phases.update(phases)
        extras.commit = commit or extras.commit
        if phases:  # at INFO, the result's line says it (validator/observe/lines.py)
            log.debug("assignment %s took %s", entry.id, phases_text(phases))

    def after_submit(self, entry: Entry, seconds: float) -> None:
        self._extra(entry.id).phases["submit"] = round(seconds, 3)
        if entry.state not in FINAL:  # a finished one is written by after_finish
            self._write(entry)

    def after_finish(self, entry: Entry) -> None:
        self._write(entry)
        self._extras.pop(entry.id, None)

    def after_attempt(self, entry: Entry, exception: BaseException | None = None) -> None:
        if self._capture is not None:
            self._capture.stop()
            self._capture = None
        # An attempt that ended the loop leaves no record; a finished one has its own.
        if exception is None and entry.id in self._extras:
            self._write(entry)

    def _write(self, entry: Entry) -> None:
        """Writes the record of `entry` as the journal now has it."""
        extras = self._extra(entry.id)
        self.store.write(
            AssignmentRecord(
                id=entry.id,
                task_id=entry.task_id,
                module=self.module,
                outcome=outcome_label(entry.state.value, entry.outcome),
                reason=entry.error,
                penalty_kind=entry.penalty_kind,
                penalty=entry.penalty,
                received_at=entry.received_at,
                finished_at=time.time(),
                attempts=entry.attempts,
                input=entry.input,
                config=extras.config,
                commit=extras.commit,
                metrics=entry.metrics,
                phases=extras.phases,
                log=extras.log,
            )
        )

    def _extra(self, assignment_id: str) -> _Extras:
        return self._extras.setdefault(assignment_id, _Extras())


@dataclass
class Current:
    assignment_id: str
    task_id: str
    phase: str
    since: float


class StatusBoard(Middleware):
    """What the status page shows: the assignment being scored and its phase, the backlog, the
    last results; and when the loop last made progress, which /healthz reads."""

    def __init__(self, module: str, lookups: str = "", penalty_rules: str = "") -> None:
        self.module = module
        # What the loop looks up ("tasks 2, 4 (shard 1/2 of 4 task ids)"), for the page.
        self.lookups = lookups
        # What the network does with a submission it cannot score (the module's spec).
        self.penalty_rules = penalty_rules
        self.current: Current | None = None
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self.backlog = {"undecided": 0, "unsubmitted": 0}
        # Tasks set aside (the API does not know them): task id -> (why, since when).
        self.aside: dict[str, tuple[str, float]] = {}
        self._progress()

    def _progress(self) -> None:
        self.last_progress = time.time()

    def before_pass(self, undecided: int, unsubmitted: int) -> None:
        self.backlog = {"undecided": undecided, "unsubmitted": unsubmitted}
        self._progress()

    def after_lookup(
        self, task_id: str, answer: str, seconds: float, assignment_id: str | None
    ) -> None:
        self._progress()

    def on_task_aside(self, task_id: str, reason: str | None) -> None:
        if reason is None:
            self.aside.pop(task_id, None)
        else:
            self.aside[task_id] = (reason, time.time())

    def before_attempt(self, entry: Entry) -> None:
        self.current = Current(entry.id, entry.task_id, "score", time.time())
        self._progress()

    def on_phase(self, phase: str) -> None:
        if self.current is not None:
            self.current.phase, self.current.since = phase_name(phase), time.time()
        self._progress()

    def on_beat(self) -> None:
        self._progress()

    def after_submit(self, entry: Entry, seconds: float) -> None:
        self._progress()

    def after_finish(self, entry: Entry) -> None:
        metric = main_metric(entry.metrics or {})
        self.recent.appendleft(
            {
                "id": entry.id,
                "task_id": entry.task_id,
                "outcome": outcome_label(entry.state.value, entry.outcome),
                "score": f"{metric} {entry.metrics[metric]:.6g}"
                if metric and entry.metrics
                else "",
                # A penalty's kind ("" for a score), and why: the penalty's reason, or what
                # kept or dropped it.
                "penalty": (entry.penalty_kind or telemetry.UNRECORDED) if entry.penalty else "",
                "reason": entry.penalty or entry.error or "",
                "time": time.time(),
            }
        )

    def after_attempt(self, entry: Entry, exception: BaseException | None = None) -> None:
        self.current = None
        self._progress()
