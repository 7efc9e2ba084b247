"""What an answer of the Fed Ledger API means: the one place that decides it.

docs/fed-ledger-api.md ("Submit answers", "Error texts the client recognises") is the table;
this module is that table in code, and tests/test_ledger_answers.py checks it row by row. Here
live the answer texts and statuses of the protocol, the policies of each kind of call, the
models of what the API hands out, and one reading per kind of call:

- `try_again`: whether an answer leaves the call unsettled, worth another try within it. The
  transport (ledger/transport.py) asks it, and keeps only the mechanics: tries, backoff,
  Retry-After, deadline, stop.
- `read_tasks`, `read_lookup`, `read_submit`: the call's final answer as what the client
  (ledger/client.py) returns, or the exception it raises.

Nothing here sends a request; submitting.py reads a submit's answer into a verdict, which the
runner records in the journal.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, get_args

import requests
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from validator.errors import OperatorError, TransientError
from validator.outbound.answer_caps import ANSWER_CAPS
from validator.outbound.bounded_reader import parse
from validator.text import quoted

# The client's name, which these lines have always had.
log = logging.getLogger(__name__)

NO_SUBMISSIONS = "No task submissions available to validate"
RATE_LIMITED = "Rate limit reached for validation assignment lookup: 1 per 3 minutes"
# The window that text names: one lookup per key and task per 3 minutes, as the API counts them.
RATE_LIMIT_WINDOW_S = 180.0
NOT_VALIDATING = "Validation assignment is not in validating status"
# The API's own word that it does not know a task (a typo, a task that ended), with a 404. A 404
# with any other detail is not it: FastAPI answers `{"detail": "Not Found"}` for a path it has
# no route for (a wrong --api-url, a proxy or deploy in flux), whatever the task.
UNKNOWN_TASK = "Task not found"
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
# Answers after which the API may have processed the request (a 503 and the 4xx below surely
# did not: see LOOKUP_RETRY_STATUSES); a submit adds 429 (SUBMIT).
MAYBE_PROCESSED_STATUSES = frozenset({500, 502, 504})


class ApiUnavailable(TransientError):
    """The API could not be reached, answered 5xx (or 408, 429), or gave no answer within the
    call's deadline, after all retries. `maybe_processed`: a try may have reached the API, whose
    answer was lost; `retry_after`: the wait the API asked for, if any (bounded)."""

    def __init__(
        self, message: str, *, maybe_processed: bool = False, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.maybe_processed = maybe_processed
        self.retry_after = retry_after


@dataclass(frozen=True)
class Policy:
    """Which answers of one kind of call are tried again within the call."""

    name: str  # the call, as the metrics label it: lookup, submit, tasks_list
    statuses: frozenset[int]
    # The kit's cap on its answers (validator/outbound/answer_caps.py ANSWER_CAPS).
    cap: str
    # Whether a try the API may have processed (sent, then no answer, 500/502/504, a 2xx
    # without JSON) may be repeated: not for a lookup, which hands out an assignment each time.
    after_processing: bool
    unconfirmed_2xx: bool = False
    # Answers after which the API may have processed this kind of call.
    processed_statuses: frozenset[int] = MAYBE_PROCESSED_STATUSES


LIST = Policy("tasks_list", RETRIED_STATUSES, "ledger.tasks", after_processing=True)
LOOKUP = Policy("lookup", LOOKUP_RETRY_STATUSES, "ledger.lookup", after_processing=False)
# A 2xx without JSON is not taken for an answer: sent again, a result the API did take is
# refused as not validating, which the runner records as submitted, with that story.
# A 429 may come from a rate limiter that counts after the API committed the result:
# a repeat refused as not validating is then the API holding it, not "too late".
SUBMIT = Policy(
    "submit",
    RETRIED_STATUSES,
    "ledger.submit",
    after_processing=True,
    unconfirmed_2xx=True,
    processed_statuses=MAYBE_PROCESSED_STATUSES | {429},
)


# An id the API hands out: it sends integers; text of these characters is taken too (ids the
# CLI is given, the simulator's). An id becomes a journal key and a URL path segment.
ID_TEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def normalise_id(value: Any) -> str:
    """Ids come back as integers while the CLI gives strings."""
    return str(value).strip()


def answered_id(value: Any) -> str:
    """An id in an answer of the API: an integer (not a boolean) or text matching ID_TEXT, as
    text; anything else (null, true, a list, an object, text with a lone surrogate) is no id:
    taken, `null` would be submitted to .../update-validation-assignment/None, and
    `"\\ud800"` would end the validator at the journal's INSERT."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"an id is an integer or text, not {type(value).__name__}")
    text = normalise_id(value)
    if not ID_TEXT.fullmatch(text):
        raise ValueError("an id is letters, digits and ._:- (128 at most)")
    return text


# What the API sends beyond these fields is dropped here, at the boundary (a lookup answer's
# extra keys, kept, cost 2.7 GB for 100 MB); the answers' size is capped by the
# reader (validator/outbound/answer_caps.py: ANSWER_CAPS, the Policy's `cap`), and text that
# is not all Unicode refused whole (`_decoded`: a lone surrogate in any field of an
# assignment would reach the journal, the log and the module).


class Task(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str
    task_type: str | None = None

    _id = field_validator("id", mode="before")(answered_id)


class TaskSubmission(BaseModel):
    model_config = ConfigDict(extra="ignore")

    data: dict[str, Any] = Field(default_factory=dict)


class Assignment(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str
    data: dict[str, Any] = Field(default_factory=dict)
    task_submission: TaskSubmission = Field(default_factory=TaskSubmission)

    _id = field_validator("id", mode="before")(answered_id)

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


# Why a lookup yielded no assignment: nothing to validate, too soon, a task the API does not
# know, or an answer the client does not know.
Refused = Literal["no_submissions", "rate_limited", "unknown_task", "unexpected"]
# What a lookup came to, as the hooks and the metrics' labels say it: an assignment, a refusal,
# or no answer from the API.
LookupAnswer = Literal["assignment", Refused, "unavailable"]
LOOKUP_ANSWERS: tuple[LookupAnswer, ...] = get_args(LookupAnswer)
# A submitted result's status, as the API takes it.
SubmitStatus = Literal["completed", "failed"]


class SubmitAnswer(Enum):
    """What the API's final answer to a submit says of the result."""

    ACCEPTED = "accepted"  # taken
    NOT_VALIDATING = "not_validating"  # the assignment is past validating: taken, or too late
    REJECTED = "rejected"  # a 4xx the client does not know


@dataclass(frozen=True)
class Refusal:
    """A lookup that yielded no assignment."""

    kind: Refused
    status: int
    detail: str


@dataclass(frozen=True)
class SubmitResult:
    kind: SubmitAnswer
    status: int
    detail: str = ""
    # An earlier try of this call that the API may have taken, its answer lost (a read timeout,
    # a 502, a 2xx without JSON...): what it met. A NOT_VALIDATING after one is most likely
    # that try's result, not a late one.
    earlier: str | None = None


@dataclass(frozen=True)
class TryAgain:
    """An answer that leaves the call unsettled: another try may settle it, if the transport
    has one left (tries, deadline, stop, and the policy's after_processing)."""

    why: str
    # Whether the API may have processed the try that met this answer.
    maybe_processed: bool
    kind: str  # the metrics' label: http_503, not_json
    # The Retry-After header the answer carries, as sent (the transport bounds and waits it).
    retry_after: str | None = None


def try_again(response: requests.Response, policy: Policy) -> TryAgain | None:
    """Whether `response` to a call of `policy`'s kind is a failure to try again; None: it is
    the call's answer, which read_tasks / read_lookup / read_submit then make sense of."""
    status = response.status_code
    if 200 <= status < 300:
        if policy.unconfirmed_2xx and not _is_json(response, policy):
            # The API's own 2xx carries JSON; an empty one or a page is a proxy's, and the
            # request may never have reached the API.
            return TryAgain(
                f"HTTP {status} without a JSON body", maybe_processed=True, kind="not_json"
            )
        return None
    if status not in policy.statuses:
        return None
    processed = status in policy.processed_statuses
    header = response.headers.get("Retry-After")
    return TryAgain(f"HTTP {status}", processed, f"http_{status}", header)


def read_tasks(response: requests.Response) -> list[Task]:
    """The final answer to GET /tasks/list: the tasks listed."""
    body = _json_or_none(response, LIST)
    _refuse_key(response, body)
    if response.status_code != 200 or not isinstance(body, list):
        raise ApiUnavailable(
            f"GET /tasks/list: HTTP {response.status_code}: {_detail(response, body)}"
        )
    tasks, left_out = [], 0
    for item in body:
        try:
            tasks.append(Task.model_validate(item))
        except ValidationError:  # not a task (no id, say): the others stand
            left_out += 1
    if left_out:
        log.warning("GET /tasks/list: %d listed entries are not tasks; left out", left_out)
    return tasks


def read_lookup(response: requests.Response) -> Assignment | Refusal:
    """The final answer to a lookup: an assignment, or why there is none (matched on the
    detail's text, not on the status)."""
    body, refused = _json_and_why(response, LOOKUP)
    _refuse_key(response, body)
    detail = _detail(response, body)
    if response.status_code == 200:
        if refused is not None:  # not JSON, past the cap's values, not all Unicode
            return Refusal("unexpected", 200, f"malformed assignment: {refused}")
        try:
            return Assignment.model_validate(body)
        except ValidationError as exc:
            short = exc.errors()[0]["msg"] if exc.errors() else str(exc)
            return Refusal("unexpected", 200, f"malformed assignment: {short}")
    if detail == NO_SUBMISSIONS:
        return Refusal("no_submissions", response.status_code, detail)
    if detail == RATE_LIMITED:
        return Refusal("rate_limited", response.status_code, detail)
    if response.status_code == 404 and detail == UNKNOWN_TASK:
        # The API's own 404: it does not know this task, a typo or a task that ended. Any other
        # 404 (a route it lacks, a proxy's page) says nothing of the task.
        return Refusal("unknown_task", 404, detail)
    return Refusal("unexpected", response.status_code, detail)


def read_submit(
    response: requests.Response,
    call: str,
    *,
    earlier: str | None = None,
    retry_after: float | None = None,
) -> SubmitResult:
    """The final answer to a submit (`call`: "POST <path>", for the messages), classified as
    docs/fed-ledger-api.md "Submit answers" says. `earlier`: what an earlier try of the call
    that the API may have processed met; `retry_after`: the transport's bounded wait of the
    answer. Raises ApiUnavailable when no answer settles it (5xx, 408, 429, a 2xx without
    JSON), and OperatorError on a refused key."""
    code = response.status_code
    parsed = _json_or_none(response, SUBMIT)
    _refuse_key(response, parsed)
    detail = _detail(response, parsed)
    if 200 <= code < 300 and parsed is None:
        raise ApiUnavailable(
            f"{call}: HTTP {code} without a JSON body: {detail}", maybe_processed=True
        )
    if code >= 500 or code in RETRIED_STATUSES:
        raise ApiUnavailable(
            f"{call}: HTTP {code}: {detail}",
            maybe_processed=earlier is not None or code in SUBMIT.processed_statuses,
            retry_after=retry_after,
        )
    if 200 <= code < 300:
        return SubmitResult(SubmitAnswer.ACCEPTED, code, detail, earlier)
    if detail == NOT_VALIDATING:
        return SubmitResult(SubmitAnswer.NOT_VALIDATING, code, detail, earlier)
    return SubmitResult(SubmitAnswer.REJECTED, code, detail, earlier)


def _refuse_key(response: requests.Response, body: Any) -> None:
    """401 and 403, to any call: the key is refused, which no retry mends (exit 3)."""
    if response.status_code in (401, 403):
        raise OperatorError(
            f"the Fed Ledger refused the API key (HTTP {response.status_code}: "
            f"{_detail(response, body)}); check --flock-api-key / FLOCK_API_KEY"
        )


def _is_json(response: requests.Response, policy: Policy) -> bool:
    # A body of `null` is JSON here, though read_submit's _json_or_none reads it as none.
    try:
        _decoded(response, policy)
    except ValueError:  # an empty body too
        return False
    return True


def _json_or_none(response: requests.Response, policy: Policy) -> Any:
    return _json_and_why(response, policy)[0]


def _json_and_why(response: requests.Response, policy: Policy) -> tuple[Any, str | None]:
    """(the body decoded, None), or (None, why it was refused); (None, None) when empty."""
    if not response.content:
        return None, None
    try:
        return _decoded(response, policy), None
    except ValueError as exc:
        return None, str(exc)


def _decoded(response: requests.Response, policy: Policy) -> Any:
    """The body decoded within the call's cap (bytes, JSON values, depth), all its text Unicode
    (bounded_reader.parse): JsonRefused, a ValueError, when it is not JSON, over the cap (the
    transport read no more than the cap's bytes) or holds a lone surrogate."""
    return parse(response.content, ANSWER_CAPS[policy.cap], f"the answer to {policy.name}")


def _has_detail(body: Any) -> bool:
    return isinstance(body, dict) and isinstance(body.get("detail"), str)


def _detail(response: requests.Response, body: Any) -> str:
    if _has_detail(body):
        return body["detail"]
    if not response.content:
        return "(empty body)"
    text = response.text.strip().replace("\n", " ")
    return text[:200] if body is None else json.dumps(body)[:200]
