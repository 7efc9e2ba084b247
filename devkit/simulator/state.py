"""Thread-safe state of the Fed Ledger simulator.

Everything the simulated API remembers lives here: tasks, their submissions,
validation assignments, the per-key lookup windows and the request log. The
HTTP layer (server.py) only parses requests and turns the results and
`SimError`s of this module into responses.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError, model_validator

# Written out from docs/fed-ledger-api.md ("Error texts the client recognises") rather than
# imported from validator.ledger.answers, so that a typo on either side makes the end-to-end tests
# fail instead of agreeing with itself.
RATE_LIMIT_DETAIL = "Rate limit reached for validation assignment lookup: 1 per 3 minutes"
NO_SUBMISSIONS_DETAIL = "No task submissions available to validate"
NOT_VALIDATING_DETAIL = "Validation assignment is not in validating status"

# Statuses that stop a submission from being handed out again to the same key;
# an expired assignment does not, so the submission becomes available again.
BLOCKING_STATUSES = frozenset({"validating", "completed", "failed"})


# ---------------------------------------------------------------- data file


class SubmissionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data: dict[str, Any] = {}
    assignment_data: dict[str, Any] = {}


class TaskSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Strict so that "12" stays a string and 12 an int, exactly as in the file.
    id: StrictInt | StrictStr
    task_type: str
    data: dict[str, Any] = {}
    submissions: list[SubmissionSpec] = []


class DataFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: list[TaskSpec]

    @model_validator(mode="after")
    def _unique_ids(self) -> DataFile:
        # URL ids are strings, so 12 and "12" would be the same task.
        seen: set[str] = set()
        for task in self.tasks:
            if str(task.id) in seen:
                raise ValueError(f"duplicate task id {task.id!r}")
            seen.add(str(task.id))
        return self


class SimulatorConfigError(Exception):
    """A data or fault file the simulator cannot start with (one-line message)."""


def describe_errors(exc: ValidationError) -> str:
    """Squash a pydantic error into one line: `where: what; where: what`."""
    parts = []
    for error in exc.errors():
        # Our own validators' messages carry a redundant "Value error, " prefix.
        message = error["msg"].removeprefix("Value error, ")
        where = ".".join(str(part) for part in error["loc"])
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def read_json_file(path: Path, what: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SimulatorConfigError(f"{what} {path}: cannot read: {exc.strerror or exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SimulatorConfigError(f"{what} {path}: not valid JSON: {exc}") from exc


def load_data_file(path: Path) -> DataFile:
    raw = read_json_file(path, "data file")
    try:
        return DataFile.model_validate(raw)
    except ValidationError as exc:
        raise SimulatorConfigError(f"data file {path}: {describe_errors(exc)}") from exc


# ---------------------------------------------------------------- errors


class SimError(Exception):
    """An API error; `status` is the HTTP status the server answers with."""

    status = 400

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class NotFound(SimError):
    status = 404


class RateLimited(SimError):
    status = 429


# ---------------------------------------------------------------- state


@dataclass
class Task:
    id: int | str
    task_type: str
    data: dict[str, Any]


@dataclass
class Submission:
    id: int
    task_id: int | str
    data: dict[str, Any]
    assignment_data: dict[str, Any]


@dataclass
class Assignment:
    id: int
    task_id: int | str
    submission_id: int
    api_key_hash: str
    status: str
    created_at: float
    data: dict[str, Any]
    task_submission: dict[str, Any]


def hash_api_key(api_key: str | None) -> str:
    # Only a short digest is kept, so a state dump can never leak the key.
    return hashlib.sha256((api_key or "").encode()).hexdigest()[:12]


class SimState:
    def __init__(
        self,
        spec: DataFile,
        *,
        rate_limit_seconds: float = 180.0,
        assignment_ttl_seconds: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self.rate_limit_seconds = rate_limit_seconds
        self.assignment_ttl_seconds = assignment_ttl_seconds
        self._tasks: dict[str, Task] = {}
        self._submissions: list[Submission] = []
        self._assignments: dict[int, Assignment] = {}
        self._results: list[dict[str, Any]] = []
        self._requests: list[dict[str, Any]] = []
        self._sent: list[dict[str, Any]] = []  # padded answers: declared and sent bytes
        # API requests read but not yet answered (a delay fault holds one for a while).
        self._in_flight = 0
        # (api key hash, task id as str) -> time the current window started
        self._windows: dict[tuple[str, str], float] = {}
        for task in spec.tasks:
            self._tasks[str(task.id)] = Task(task.id, task.task_type, dict(task.data))
            for sub in task.submissions:
                self._add_submission(task.id, sub.data, sub.assignment_data)

    # -- queries

    def list_tasks(self) -> list[dict[str, Any]]:
        with self._lock:
            return _copy([vars(task) for task in self._tasks.values()])

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            self._expire_overdue(self._clock())
            return _copy(
                {
                    "tasks": [vars(task) for task in self._tasks.values()],
                    "assignments": [vars(a) for a in self._assignments.values()],
                    "submissions": self._results,
                    "requests": self._requests,
                    "in_flight": self._in_flight,
                    "padded": self._sent,
                }
            )

    # -- API operations

    def request_assignment(
        self, task_id: str, api_key: str | None, received: float | None = None
    ) -> dict[str, Any]:
        """A lookup; `received`: when the API received it (the request log's stamp), which its
        rate-limit window counts, whenever a busy machine lets this thread take the lock."""
        with self._lock:
            now = self._clock()
            task = self._tasks.get(task_id)
            if task is None:
                raise NotFound("Task not found")
            key_hash = hash_api_key(api_key)
            self._check_window(key_hash, task_id, now if received is None else received)
            self._expire_overdue(now)
            submission = self._next_submission(task_id, key_hash)
            if submission is None:
                raise SimError(NO_SUBMISSIONS_DETAIL)
            return self._assign(task, submission, key_hash, now)

    def update_assignment(
        self, assignment_id: str, status: str, data: dict[str, Any] | None
    ) -> dict[str, Any]:
        with self._lock:
            now = self._clock()
            assignment = self._assignments.get(_as_int(assignment_id))
            if assignment is None:
                raise NotFound("Validation assignment not found")
            self._expire_overdue(now)
            if assignment.status != "validating":
                raise SimError(NOT_VALIDATING_DETAIL)
            assignment.status = status
            self._results.append(
                {
                    "assignment_id": assignment.id,
                    "status": status,
                    "data": data,
                    "time": now,
                }
            )
            return {"id": assignment.id, "status": assignment.status}

    def add_submission(
        self, task_id: str, data: dict[str, Any], assignment_data: dict[str, Any]
    ) -> dict[str, Any]:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                raise NotFound("Task not found")
            submission = self._add_submission(task.id, data, assignment_data)
            return {"id": submission.id}

    def note_sent(self, method: str, path: str, length: int, sent: int) -> None:
        """An `oversized` answer of `length` bytes, of which `sent` went out before the client
        closed the connection (the rest never left: what the client read is at most this)."""
        with self._lock:
            self._sent.append({"method": method, "path": path, "length": length, "sent": sent})

    def end_task(self, task_id: str) -> dict[str, Any]:
        """The task ends: no longer listed, its lookups answered 404 "Task not found" (its
        assignments can still be submitted)."""
        with self._lock:
            if self._tasks.pop(task_id, None) is None:
                raise NotFound("Task not found")
            return {"id": task_id, "ended": True}

    def now(self) -> float:
        return self._clock()

    def request_begun(self) -> float:
        """Count an API request in flight; the simulator's clock when it arrived."""
        with self._lock:
            self._in_flight += 1
            return self._clock()

    def log_request(
        self,
        method: str,
        path: str,
        status: int | None,
        fault: str | None,
        *,
        processed: bool = True,
        received: float | None = None,
        agent: str | None = None,
    ) -> None:
        """Record an API request's outcome (None: dropped); it is no longer in flight.
        `processed`: whether the API itself handled it (a fault may have replaced its answer).
        `received`: when it arrived (request_begun's clock); `time` is when it was answered,
        which a delay fault or a busy machine pushes later, so gaps between sends are measured
        on `received`. `agent`: the client's User-Agent (a fleet's worker names itself there)."""
        with self._lock:
            self._in_flight = max(self._in_flight - 1, 0)
            now = self._clock()
            self._requests.append(
                {
                    "method": method,
                    "path": path,
                    "status": status,
                    "time": now,
                    "received": now if received is None else received,
                    "fault": fault,
                    "processed": processed,
                    "agent": agent,
                }
            )

    # -- internals (callers hold the lock)

    def _check_window(self, key_hash: str, task_id: str, now: float) -> None:
        started = self._windows.get((key_hash, task_id))
        if started is not None and now - started < self.rate_limit_seconds:
            # Deliberately not restarting the window: only answered lookups do.
            raise RateLimited(RATE_LIMIT_DETAIL)
        self._windows[(key_hash, task_id)] = now

    def _expire_overdue(self, now: float) -> None:
        for assignment in self._assignments.values():
            overdue = now - assignment.created_at >= self.assignment_ttl_seconds
            if assignment.status == "validating" and overdue:
                assignment.status = "expired"

    def _next_submission(self, task_id: str, key_hash: str) -> Submission | None:
        taken = {
            a.submission_id
            for a in self._assignments.values()
            if a.api_key_hash == key_hash and a.status in BLOCKING_STATUSES
        }
        for submission in self._submissions:
            if str(submission.task_id) == task_id and submission.id not in taken:
                return submission
        return None

    def _assign(
        self, task: Task, submission: Submission, key_hash: str, now: float
    ) -> dict[str, Any]:
        assignment = Assignment(
            id=len(self._assignments) + 1,
            task_id=task.id,
            submission_id=submission.id,
            api_key_hash=key_hash,
            status="validating",
            created_at=now,
            data={**task.data, **submission.assignment_data},
            task_submission={
                "id": submission.id,
                "task_id": task.id,
                "data": submission.data,
            },
        )
        self._assignments[assignment.id] = assignment
        return _copy(
            {
                "id": assignment.id,
                "data": assignment.data,
                "task_submission": assignment.task_submission,
            }
        )

    def _add_submission(
        self, task_id: int | str, data: dict[str, Any], assignment_data: dict[str, Any]
    ) -> Submission:
        submission = Submission(len(self._submissions) + 1, task_id, data, assignment_data)
        self._submissions.append(submission)
        return submission


def _as_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _copy(value: Any) -> Any:
    # A deep copy through JSON: the caller serialises it after the lock is
    # released, while other threads keep mutating the live objects.
    return json.loads(json.dumps(value))
