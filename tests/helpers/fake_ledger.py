"""A Fed Ledger in the test process, for the loop's unit tests (tests/helpers/loop.py): the
methods of validator.ledger.client.FedLedgerClient that the runner calls, recording what they
received. Its answers are HTTP answers built here and read by the client's own readers
(validator/ledger/answers.py: try_again, read_lookup, read_submit), so that what the runner gets
is what the real client would return or raise for that answer, and cannot drift from it.

What the transport does within one call (tries, backoff, waits) is not played: an answer here is
the call's last, with what an earlier try of the call met (`earlier`) as the transport hands it
over. tests/test_ledger_answers.py checks the readers row by row; the real client and transport
are tested against the simulator (tests/test_fedledger.py, tests/faults/).
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests

from validator.ledger.answers import (
    NO_SUBMISSIONS,
    NOT_VALIDATING,
    RATE_LIMITED,
    SUBMIT,
    UNKNOWN_TASK,
    ApiUnavailable,
    Assignment,
    Refusal,
    SubmitResult,
    Task,
    read_lookup,
    read_submit,
    read_tasks,
    try_again,
)
from validator.ledger.transport import retry_after_seconds

UPDATE_PATH = "/tasks/update-validation-assignment/"


@dataclass(frozen=True)
class Reply:
    """The last answer of one call: an HTTP status and body (a dict or list is sent as JSON,
    text as it is, None as an empty body), its Retry-After header, and what an earlier try of
    the same call met that the API may have processed (the transport's `earlier`)."""

    status: int
    body: Any = None
    retry_after: str | None = None
    earlier: str | None = None

    def response(self) -> requests.Response:
        response = requests.Response()
        response.status_code = self.status
        if self.body is None:
            response._content = b""
        elif isinstance(self.body, str):
            response._content = self.body.encode()
        else:
            response._content = json.dumps(self.body).encode()
        response.encoding = "utf-8"
        if self.retry_after is not None:
            response.headers["Retry-After"] = self.retry_after
        return response


def detail(status: int, text: str, **extra: Any) -> Reply:
    """An answer whose JSON body is {"detail": text}, as the API refuses."""
    return Reply(status, {"detail": text}, **extra)


OK = Reply(200, {"status": "ok"})
NOTHING = detail(400, NO_SUBMISSIONS)
LIMITED = detail(429, RATE_LIMITED)
LATE = detail(400, NOT_VALIDATING)

# A call with no answer at all (refused connection, read timeout, no answer by the deadline):
# the transport raises this itself, as ApiUnavailable.
Unreachable = ApiUnavailable
# What a scripted answer may be: a reply, an exception the transport would raise, or a function
# of the fake (to change the state of the test when the call comes, then answer).
Answer = Reply | Exception | Callable[["FakeLedger"], "Reply | Exception"]


@dataclass(frozen=True)
class Lookup:
    at: float  # the runner's clock when the API received it
    task_id: str
    answer: str  # "assignment <id>", "no_submissions", "rate_limited", "unexpected", or raised


@dataclass(frozen=True)
class Submit:
    at: float
    assignment_id: str
    status: str
    metrics: dict[str, Any] | None
    answer: str  # the verdict's kind, or what was raised


@dataclass
class FakeLedger:
    """Hands out queued submissions per task (then "no submissions"), and takes every submit,
    unless the test scripted the next answers (`lookup_answers`, `submit_answers`)."""

    now: Callable[[], float]  # the clock that stamps the calls (the runner's)
    queued: dict[str, deque[dict[str, Any]]] = field(default_factory=dict)
    lookup_answers: deque[Answer] = field(default_factory=deque)
    submit_answers: deque[Answer] = field(default_factory=deque)
    lookups: list[Lookup] = field(default_factory=list)
    submits: list[Submit] = field(default_factory=list)
    # The assignments handed out: id -> (task id, what was handed out).
    handed_out: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    # Results decided before this moment may have been submitted by an earlier process: as the
    # real client, the moment this "process" started (the real clock: the journal's stamps).
    started_at: float = field(default_factory=time.time)
    # GET /tasks/list's answer at start-up; an empty list sets nothing aside (the runner then
    # looks every task up; tests/test_lookups.py plays the set-aside against the simulator).
    tasks_answer: Reply = field(default_factory=lambda: Reply(200, []))
    # The API's rate limit, when set: a lookup received within `window` seconds of the last one
    # of its task that it counted (any but a refused one) is answered 429, as the API does.
    window: float | None = None
    # Seconds each lookup spends on its way to the API and back, (there, back), taken in turn:
    # the runner's clock moves by them (`advance`) during the call, as a network's would.
    travel: list[tuple[float, float]] = field(default_factory=list)
    advance: Callable[[float], None] | None = None
    # Tasks the API does not know: their lookups are answered 404 "Task not found".
    unknown: set[str] = field(default_factory=set)
    _counted: dict[str, float] = field(default_factory=dict)

    def queue(self, task_id: str, submission: dict[str, Any], data: dict[str, Any]) -> None:
        self.queued.setdefault(task_id, deque()).append(
            {"data": data, "task_submission": {"data": submission}}
        )

    # --- the client's methods, as the runner calls them ----------------------------------

    def list_tasks(self) -> list[Task]:
        return read_tasks(self.tasks_answer.response())

    def request_assignment(self, task_id: str) -> Assignment | Refusal:
        there, back = self._travel()
        self._move(there)
        received = self.now()
        if self._limited(task_id, received):
            answer: Reply | Exception = LIMITED
        else:
            answer = self._next(self.lookup_answers, lambda: self._hand_out(task_id))
        try:
            if isinstance(answer, Exception):
                raise answer
            result = read_lookup(answer.response())
        except Exception as exc:
            self.lookups.append(Lookup(received, task_id, type(exc).__name__))
            raise
        kind = f"assignment {result.id}" if isinstance(result, Assignment) else result.kind
        if kind != "rate_limited":
            self._counted[task_id] = received
        self.lookups.append(Lookup(received, task_id, kind))
        self._move(back)
        return result

    def submit(self, assignment_id: str, status: str, metrics: dict | None) -> SubmitResult:
        answer = self._next(self.submit_answers, lambda: OK)
        try:
            if isinstance(answer, Exception):
                raise answer
            response = answer.response()
            # As the transport hands over the last answer: its Retry-After, bounded.
            again = try_again(response, SUBMIT)
            wait = retry_after_seconds(again.retry_after) if again else None
            call = f"POST {UPDATE_PATH}{assignment_id}"
            result = read_submit(response, call, earlier=answer.earlier, retry_after=wait)
        except Exception as exc:
            self.submits.append(
                Submit(self.now(), assignment_id, status, metrics, type(exc).__name__)
            )
            raise
        self.submits.append(Submit(self.now(), assignment_id, status, metrics, result.kind.value))
        return result

    def close(self) -> None:
        pass

    # --- what the test reads -------------------------------------------------------------

    def taken(self) -> list[tuple[str, str, dict[str, Any] | None]]:
        """(assignment id, status, metrics) of each submit the API took, in order."""
        return [
            (s.assignment_id, s.status, s.metrics) for s in self.submits if s.answer == "accepted"
        ]

    def looked_up(self) -> list[str]:
        return [lookup.task_id for lookup in self.lookups]

    # --- inside --------------------------------------------------------------------------

    def _travel(self) -> tuple[float, float]:
        if not self.travel:
            return 0.0, 0.0
        self.travel.append(self.travel.pop(0))
        return self.travel[-1]

    def _move(self, seconds: float) -> None:
        if seconds and self.advance is not None:
            self.advance(seconds)

    def _limited(self, task_id: str, received: float) -> bool:
        counted = self._counted.get(task_id)
        return self.window is not None and counted is not None and received - counted < self.window

    def _next(self, script: deque[Answer], default: Callable[[], Reply]) -> Reply | Exception:
        answer = script.popleft() if script else default()
        return answer(self) if callable(answer) else answer

    def _hand_out(self, task_id: str) -> Reply:
        if task_id in self.unknown:
            return detail(404, UNKNOWN_TASK)
        waiting = self.queued.get(task_id)
        if not waiting:
            return NOTHING
        assignment_id = str(len(self.handed_out) + 1)
        assignment = {"id": int(assignment_id), **waiting.popleft()}
        self.handed_out[assignment_id] = (task_id, assignment)
        return Reply(200, assignment)
