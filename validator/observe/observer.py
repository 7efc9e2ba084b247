"""What the loop is doing, for the operator: per-assignment records (validator/state/records.py),
Prometheus metrics (validator/observe/telemetry.py) and the state the status page shows
(status_server.py). The runner tells it what happens; nothing here decides anything.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from validator.observe import telemetry
from validator.state.journal import Entry, State
from validator.state.phases import phase_name
from validator.state.records import (
    AssignmentRecord,
    RecordStore,
    captured_logs,
    json_safe,
    main_metric,
    outcome_label,
)

log = logging.getLogger("validator")
RECENT = 10


@dataclass
class Current:
    assignment_id: str
    task_id: str
    phase: str
    since: float


@dataclass
class _Extras:
    """What a record holds beyond the journal's row."""

    phases: dict[str, float] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    commit: str | None = None


class Observer:
    def __init__(self, state_dir: Path, module: str, records_keep: int, lookups: str = "") -> None:
        self.module = module
        # What the loop looks up ("tasks 2, 4 (shard 1/2 of 4 task ids)"), for the page.
        self.lookups = lookups
        self.records = RecordStore(state_dir, records_keep)
        self.started_at = time.time()
        self.current: Current | None = None
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self.backlog = {"undecided": 0, "unsubmitted": 0}
        self._extras: dict[str, _Extras] = {}
        self._counted: deque[str] = deque(maxlen=1000)  # finished ids, each counted once
        self.progress()

    def progress(self) -> None:
        self.last_progress = time.time()
        telemetry.LAST_PROGRESS.set(self.last_progress)

    def looked_up(self, task_id: str, answer: str, seconds: float, assignment_id: str | None):
        telemetry.LOOKUPS.labels(task_id, answer).inc()
        telemetry.PHASE_SECONDS.labels("lookup").observe(seconds)
        if assignment_id is not None:
            self._extra(assignment_id).phases["lookup"] = round(seconds, 3)
        self.progress()

    def set_backlog(self, undecided: int, unsubmitted: int) -> None:
        self.backlog = {"undecided": undecided, "unsubmitted": unsubmitted}
        for kind, count in self.backlog.items():
            telemetry.BACKLOG.labels(kind).set(count)

    @contextmanager
    def scoring(self, entry: Entry, config: dict[str, Any]) -> Iterator[None]:
        """Around one scoring: the current assignment for the page, its log lines kept."""
        extras = self._extra(entry.id)
        extras.config = json_safe(config)
        self.current = Current(entry.id, entry.task_id, "score", time.time())
        telemetry.SCORING.set(1)
        self.progress()
        try:
            with captured_logs() as capture:
                # The record's lines are the capture's own list: a record written during the
                # scoring (its submit) has them, after an earlier attempt's.
                capture.lines[:0] = extras.log
                extras.log = capture.lines
                yield
        finally:
            self.current = None
            telemetry.SCORING.set(0)
            self.progress()

    def phase(self, phase: str) -> None:
        """The scoring moved to `phase` (validator/state/phases.py)."""
        if self.current is not None:
            self.current.phase, self.current.since = phase_name(phase), time.time()
        self.progress()

    def scored(self, entry: Entry, phases: dict[str, float], commit: str | None) -> None:
        extras = self._extra(entry.id)
        extras.phases.update(phases)
        extras.commit = commit or extras.commit
        for phase, seconds in phases.items():
            telemetry.PHASE_SECONDS.labels(phase).observe(seconds)
        if phases:  # one line a person reads: where the assignment's time went
            took = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in phases.items())
            log.info("assignment %s took %s", entry.id, took)

    def submit_took(self, assignment_id: str, seconds: float) -> None:
        self._extra(assignment_id).phases["submit"] = round(seconds, 3)
        telemetry.PHASE_SECONDS.labels("submit").observe(seconds)
        self.progress()

    def save(self, entry: Entry) -> None:
        """Writes the record of `entry` as the journal now has it; counts a finished one."""
        if entry.id in self._counted and entry.id not in self._extras:
            return  # finished, counted and written already
        extras = self._extra(entry.id)
        outcome = outcome_label(entry.state.value, entry.outcome)
        record = AssignmentRecord(
            id=entry.id,
            task_id=entry.task_id,
            module=self.module,
            outcome=outcome,
            reason=entry.error,
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
        self.records.write(record)
        if entry.state in (State.SUBMITTED, State.DROPPED) and entry.id not in self._counted:
            self._counted.append(entry.id)
            telemetry.ASSIGNMENTS.labels(entry.task_id, outcome).inc()
            if entry.state is State.SUBMITTED:
                telemetry.LAST_SUBMIT.set(time.time())
            metric = main_metric(entry.metrics or {})
            self.recent.appendleft(
                {
                    "id": entry.id,
                    "task_id": entry.task_id,
                    "outcome": outcome,
                    "score": f"{metric} {entry.metrics[metric]:.6g}"
                    if metric and entry.metrics
                    else "",
                    "reason": entry.error or "",
                    "time": record.finished_at,
                }
            )
            self._extras.pop(entry.id, None)

    def _extra(self, assignment_id: str) -> _Extras:
        return self._extras.setdefault(assignment_id, _Extras())
