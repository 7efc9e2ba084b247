"""Typed client of the FLock Fed Ledger API (docs/fed-ledger-api.md).

Every call has a timeout and is retried with exponential backoff by urllib3: listing tasks and
submitting after any connection error or 5xx, but a lookup only when the API surely did not
process it (see LOOKUP_RETRY_STATUSES); bodies that are empty or not JSON are tolerated. The
API key travels only in the request header and is never logged, and redirects are not followed
so it cannot leak to another host.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

import requests
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from requests.adapters import HTTPAdapter
from urllib3.util import Retry

from validator.errors import ConfigError, RecoverableException, TransientError

log = logging.getLogger(__name__)

DEFAULT_API_URL = "https://fed-ledger-prod.flock.io/api/v1"
NO_SUBMISSIONS = "No task submissions available to validate"
RATE_LIMITED = "Rate limit reached for validation assignment lookup: 1 per 3 minutes"
NOT_VALIDATING = "Validation assignment is not in validating status"
LOOKUP_PATH = "/tasks/request-validation-assignment/"
# Listing tasks and submitting can be repeated without harm (a result the API already took is
# refused as not validating), so any 5xx is tried again.
RETRIED_STATUSES = frozenset({500, 502, 503, 504})
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
# no sooner than its lookup interval.
LOOKUP_RETRY_STATUSES = frozenset({503})
# Faults of the network or the server, which a later try may not meet. Any other error raised
# while sending (a URL without a host, a header value with a carriage return) happens before a
# byte is sent and would happen again on every try: retrying it kept the loop waiting forever.
TRANSIENT_REQUEST_ERRORS = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
    requests.exceptions.ContentDecodingError,
    requests.exceptions.RetryError,
)
# Their text quotes the offending header value, which can only be the API key here.
HEADER_ERRORS = (requests.exceptions.InvalidHeader, UnicodeError)


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

    def module_input(self) -> dict[str, Any]:
        """The module input: the assignment's data wins over the submission's on a clash."""
        return {**self.task_submission.data, **self.data}


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


class ApiUnavailable(TransientError):
    """The API could not be reached, or answered 5xx, after all retries."""


class RequestNotSendable(ConfigError):
    """A request that cannot be built from the configured URL and key, on any try."""


class FedLedgerClient:
    def __init__(
        self,
        api_key: str,
        api_url: str = DEFAULT_API_URL,
        *,
        timeout: tuple[float, float] = (10.0, 60.0),
        retries: int = 4,
        backoff: float = 1.0,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.timeout = timeout
        repeatable = Retry(
            total=retries,
            connect=retries,
            read=retries,
            status=retries,
            other=retries,
            allowed_methods=None,  # the POST of a submit too: it is idempotent
            status_forcelist=RETRIED_STATUSES,
            backoff_factor=backoff,
            backoff_max=60,
            raise_on_status=False,
        )
        lookup = Retry(
            total=retries,
            connect=retries,  # urllib3's connect errors: the request was never sent
            read=False,  # a read timeout or a connection closed after sending: raised at once
            other=0,  # any other error (TLS, ...) may also come after sending: not retried
            status=retries,
            allowed_methods=None,  # POST, for the statuses below only
            status_forcelist=LOOKUP_RETRY_STATUSES,
            # Else a 429 "rate limit reached" with a Retry-After header would be waited out and
            # asked again inside the client, for minutes: the runner handles it.
            respect_retry_after_header=False,
            backoff_factor=backoff,
            backoff_max=60,
            raise_on_status=False,
        )
        # A session each: urllib3 retries by adapter, and requests picks an adapter by URL.
        self._session = _session(api_key, repeatable)
        self._lookup_session = _session(api_key, lookup)

    def close(self) -> None:
        self._session.close()
        self._lookup_session.close()

    def _send(self, method: str, path: str, body: dict[str, Any] | None = None):
        url = f"{self.api_url}{path}"
        session = self._lookup_session if path.startswith(LOOKUP_PATH) else self._session
        # json.dumps' default allows Infinity/NaN, like the reference client (requests' json=).
        payload = None if body is None else json.dumps(body)
        try:
            response = session.request(
                method, url, data=payload, timeout=self.timeout, allow_redirects=False
            )
        except TRANSIENT_REQUEST_ERRORS as exc:
            raise ApiUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        except (requests.RequestException, ValueError) as exc:
            # `from None`: the cause's text may quote the key, and nothing more is known.
            raise RequestNotSendable(_not_sendable(method, path, exc)) from None
        log.debug("%s %s -> %s", method, path, response.status_code)
        return response

    def list_tasks(self) -> list[Task]:
        response = self._send("GET", "/tasks/list")
        body = _json_or_none(response)
        self._raise_for_auth(response, body)
        if response.status_code != 200 or not isinstance(body, list):
            raise ApiUnavailable(
                f"GET /tasks/list: HTTP {response.status_code}: {_detail(response, body)}"
            )
        return [Task.model_validate(item) for item in body if isinstance(item, dict)]

    def request_assignment(self, task_id: str) -> Assignment | Refusal:
        path = f"{LOOKUP_PATH}{quote(normalise_id(task_id), safe='')}"
        response = self._send("POST", path)
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
        path = f"/tasks/update-validation-assignment/{quote(normalise_id(assignment_id), safe='')}"
        body: dict[str, Any] = {"status": status}
        if status == "completed":
            body["data"] = metrics or {}
        response = self._send("POST", path, body)
        parsed = _json_or_none(response)
        self._raise_for_auth(response, parsed)
        detail = _detail(response, parsed)
        if response.status_code >= 500:
            raise ApiUnavailable(f"POST {path}: HTTP {response.status_code}: {detail}")
        if 200 <= response.status_code < 300:
            if not _is_json(response):
                # The API's own 2xx carries JSON; an empty one or a page is a proxy's, and the
                # result may never have reached the API. Taken for accepted, it was lost. Sent
                # again, a result the API did take is refused as not validating: no harm.
                raise ApiUnavailable(
                    f"POST {path}: HTTP {response.status_code} without a JSON body: {detail}"
                )
            return SubmitResult("accepted", response.status_code, detail)
        if detail == NOT_VALIDATING:
            return SubmitResult("not_validating", response.status_code, detail)
        return SubmitResult("rejected", response.status_code, detail)

    @staticmethod
    def _raise_for_auth(response: requests.Response, body: Any) -> None:
        if response.status_code in (401, 403):
            raise RecoverableException(
                f"the Fed Ledger refused the API key (HTTP {response.status_code}: "
                f"{_detail(response, body)}); check --flock-api-key / FLOCK_API_KEY"
            )


def _session(api_key: str, retry: Retry) -> requests.Session:
    session = requests.Session()
    session.headers.update({"flock-api-key": api_key, "Content-Type": "application/json"})
    adapter = HTTPAdapter(max_retries=retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def _not_sendable(method: str, path: str, exc: Exception) -> str:
    if isinstance(exc, HEADER_ERRORS):
        what = "a header value is not valid in HTTP; check --flock-api-key / FLOCK_API_KEY"
    else:
        what = f"{exc}; check --api-url / FLOCK_API_URL"
    return f"{method} {path} cannot be sent ({type(exc).__name__}: {what})"


def _is_json(response: requests.Response) -> bool:
    try:
        response.json()
    except ValueError:  # an empty body too
        return False
    return True


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
