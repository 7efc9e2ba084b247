"""Typed client of the FLock Fed Ledger API (docs/fed-ledger-api.md).

Every call has a timeout per read and an overall deadline, ends shortly after a stop signal
(validator/ledger/transport.py), and is tried again with exponential backoff: listing tasks and
submitting after any connection error, 5xx, 408 or 429 (honouring a bounded Retry-After), but a
lookup only when the API surely did not process it (see LOOKUP_RETRY_STATUSES); bodies that are
empty or not JSON are tolerated. The API key travels only in the request header and is never
logged, and redirects are not followed so it cannot leak to another host.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

import requests
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from validator.errors import RecoverableException
from validator.ledger.transport import (
    DEFAULT_DEADLINE_S,
    MAYBE_PROCESSED_STATUSES,
    ApiUnavailable,
    CallInterrupted,
    Policy,
    RequestNotSendable,
    Transport,
)
from validator.options import DEFAULT_API_URL
from validator.text import quoted

# DEFAULT_API_URL lives with the options (validator/options.py); named here as before.
__all__ = ["DEFAULT_API_URL", "ApiUnavailable", "CallInterrupted", "RequestNotSendable"]

log = logging.getLogger(__name__)

NO_SUBMISSIONS = "No task submissions available to validate"
RATE_LIMITED = "Rate limit reached for validation assignment lookup: 1 per 3 minutes"
NOT_VALIDATING = "Validation assignment is not in validating status"
LOOKUP_PATH = "/tasks/request-validation-assignment/"
# Listing tasks and submitting can be repeated without harm (a result the API already took is
# refused as not validating), so any 5xx is tried again, and so are 408 (the request did not
# arrive in time) and 429 (too many requests), after the Retry-After they may carry.
RETRIED_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# A lookup cannot: each one the API processes may hand out an assignment and starts the task's
# rate-limit window, so a lookup repeated after one the API processed but whose answer was lost
# leaves an assignment this validator never sees (validating until it expires) and is answered
# "rate limit reached". A lookup is therefore tried again only when it surely was not processed:
# when connecting failed (refused, no such host, connect timeout: nothing was sent), and on 503,
# which a load balancer answers with no backend to forward to and the API when it cannot handle
# the request at all. Not after a read timeout or a connection closed once the request was
# sent, nor on 500 (the API failed, maybe after assigning), 502 (the upstream broke off, maybe
# after assigning) or 504 (a proxy stopped waiting for an API still processing the lookup).
# Those end the call at once; the runner then pauses --time-sleep and asks for that task again
# no sooner than its lookup interval. A lookup abandoned at its deadline or on a stop signal is
# not tried again either. A 429 is the API's rate limit, which the runner handles.
LOOKUP_RETRY_STATUSES = frozenset({503})
LIST = Policy("tasks_list", RETRIED_STATUSES, after_processing=True)
LOOKUP = Policy("lookup", LOOKUP_RETRY_STATUSES, after_processing=False)
# A 2xx without JSON is not taken for an answer: sent again, a result the API did take is
# refused as not validating, which the runner records as submitted, with that story.
# A 429 may come from a rate limiter that counts after the API committed the result (issue 23):
# a repeat refused as not validating is then the API holding it, not "too late".
SUBMIT = Policy(
    "submit",
    RETRIED_STATUSES,
    after_processing=True,
    unconfirmed_2xx=True,
    processed_statuses=MAYBE_PROCESSED_STATUSES | {429},
)


def normalise_id(value: Any) -> str:
    """Ids come back as integers while the CLI gives strings."""
    return str(value).strip()


class Task(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    task_type: str | None = None

    _normalise = field_validator("id", mode="before")(normalise_id)


class TaskSubmission(BaseModel):
    model_config = ConfigDict(extra="allow")

    data: dict[str, Any] = Field(default_factory=dict)


class Assignment(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    data: dict[str, Any] = Field(default_factory=dict)
    task_submission: TaskSubmission = Field(default_factory=TaskSubmission)

    _normalise = field_validator("id", mode="before")(normalise_id)

    def module_input(self, submitter_fields: frozenset[str] | None = None) -> dict[str, Any]:
        """The module input: the assignment's data over the submission's. With
        `submitter_fields`, only those are taken from the submission: a field that defines the
        task and that the assignment lacks stays missing, and the input then fails validation."""
        submitted = self.task_submission.data
        if submitter_fields is not None:
            ignored = sorted(set(submitted) - submitter_fields - set(self.data))
            if ignored:
                log.warning(
                    "assignment %s: the submission sets %s, which only the task decides; ignored",
                    self.id,
                    ", ".join(quoted(name) for name in ignored[:10]),
                )
            submitted = {k: v for k, v in submitted.items() if k in submitter_fields}
        return {**submitted, **self.data}


@dataclass(frozen=True)
class Refusal:
    """A lookup that yielded no assignment."""

    kind: Literal["no_submissions", "rate_limited", "unexpected"]
    status: int
    detail: str


@dataclass(frozen=True)
class SubmitResult:
    kind: Literal["accepted", "not_validating", "rejected"]
    status: int
    detail: str = ""
    # An earlier try of this call that the API may have taken, its answer lost (a read timeout,
    # a 502, a 2xx without JSON...): what it met. A "not_validating" after one is most likely
    # that try's result, not a late one.
    earlier: str | None = None


class FedLedgerClient:
    def __init__(
        self,
        api_key: str,
        api_url: str = DEFAULT_API_URL,
        *,
        timeout: tuple[float, float] = (10.0, 60.0),
        retries: int = 4,
        backoff: float = 1.0,
        deadline: float = DEFAULT_DEADLINE_S,
        stop: threading.Event | None = None,
    ) -> None:
        """`deadline`: seconds one call may take, its retries and waits included; `stop`: once
        set, calls are not tried again and a try in progress is abandoned shortly after."""
        self.api_url = api_url.rstrip("/")
        self.timeout = timeout
        self.deadline = deadline
        # Results decided before this moment may have been submitted by an earlier process.
        self.started_at = time.time()
        self._http = Transport(
            api_key,
            self.api_url,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            deadline=deadline,
            stop=stop,
        )

    def close(self) -> None:
        """Nothing is held between calls (each try has its own connection)."""

    def list_tasks(self) -> list[Task]:
        response = self._http.call("GET", "/tasks/list", None, LIST).response
        body = _json_or_none(response)
        self._raise_for_auth(response, body)
        if response.status_code != 200 or not isinstance(body, list):
            raise ApiUnavailable(
                f"GET /tasks/list: HTTP {response.status_code}: {_detail(response, body)}"
            )
        return [Task.model_validate(item) for item in body if isinstance(item, dict)]

    def request_assignment(self, task_id: str) -> Assignment | Refusal:
        path = f"{LOOKUP_PATH}{quote(normalise_id(task_id), safe='')}"
        response = self._http.call("POST", path, None, LOOKUP).response
        body = _json_or_none(response)
        self._raise_for_auth(response, body)
        detail = _detail(response, body)
        if response.status_code == 200:
            try:
                return Assignment.model_validate(body)
            except ValidationError as exc:
                short = exc.errors()[0]["msg"] if exc.errors() else str(exc)
                return Refusal("unexpected", 200, f"malformed assignment: {short}")
        if detail == NO_SUBMISSIONS:
            return Refusal("no_submissions", response.status_code, detail)
        if detail == RATE_LIMITED:
            return Refusal("rate_limited", response.status_code, detail)
        return Refusal("unexpected", response.status_code, detail)

    def submit(
        self, assignment_id: str, status: Literal["completed", "failed"], metrics: dict | None
    ) -> SubmitResult:
        """The API's answer, classified (docs/fed-ledger-api.md, "Submit answers"). Raises
        ApiUnavailable when no try had an answer that settles it (5xx, 408, 429, a 2xx without
        JSON, no answer at all), and RecoverableException on a refused key."""
        path = f"/tasks/update-validation-assignment/{quote(normalise_id(assignment_id), safe='')}"
        body: dict[str, Any] = {"status": status}
        if status == "completed":
            body["data"] = metrics or {}
        reply = self._http.call("POST", path, body, SUBMIT)
        response, code = reply.response, reply.response.status_code
        parsed = _json_or_none(response)
        self._raise_for_auth(response, parsed)
        detail = _detail(response, parsed)
        if 200 <= code < 300 and parsed is None:
            raise ApiUnavailable(
                f"POST {path}: HTTP {code} without a JSON body: {detail}", maybe_processed=True
            )
        if code >= 500 or code in RETRIED_STATUSES:
            raise ApiUnavailable(
                f"POST {path}: HTTP {code}: {detail}",
                maybe_processed=reply.earlier is not None or code in SUBMIT.processed_statuses,
                retry_after=reply.retry_after,
            )
        if 200 <= code < 300:
            return SubmitResult("accepted", code, detail, reply.earlier)
        if detail == NOT_VALIDATING:
            return SubmitResult("not_validating", code, detail, reply.earlier)
        return SubmitResult("rejected", code, detail, reply.earlier)

    @staticmethod
    def _raise_for_auth(response: requests.Response, body: Any) -> None:
        if response.status_code in (401, 403):
            raise RecoverableException(
                f"the Fed Ledger refused the API key (HTTP {response.status_code}: "
                f"{_detail(response, body)}); check --flock-api-key / FLOCK_API_KEY"
            )


def _json_or_none(response: requests.Response) -> Any:
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def _detail(response: requests.Response, body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        return body["detail"]
    if not response.content:
        return "(empty body)"
    text = response.text.strip().replace("\n", " ")
    return text[:200] if body is None else json.dumps(body)[:200]
