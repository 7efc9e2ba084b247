"""Typed client of the FLock Fed Ledger API (docs/fed-ledger-api.md).

Every call has a timeout per read and an overall deadline, ends shortly after a stop signal
(validator/ledger/transport.py), and is tried again with exponential backoff: listing tasks and
submitting after any connection error, 5xx, 408 or 429 (honouring a bounded Retry-After), but a
lookup only when the API surely did not process it (see LOOKUP_RETRY_STATUSES); bodies that are
empty or not JSON are tolerated. What each answer means (which ones are tried again, what the
client returns or raises) is decided in one place, validator/ledger/answers.py: the client sends
the call and returns its verdict. The API key travels only in the request header and is never
logged, and redirects are not followed so it cannot leak to another host.
"""

from __future__ import annotations

import threading
import time
from typing import Any
from urllib.parse import quote

from validator.ledger.answers import (
    LIST,
    LOOKUP,
    SUBMIT,
    Assignment,
    Refusal,
    SubmitResult,
    SubmitStatus,
    Task,
    normalise_id,
    read_lookup,
    read_submit,
    read_tasks,
)
from validator.ledger.transport import (
    DEFAULT_DEADLINE_S,
    Transport,
)
from validator.options import DEFAULT_API_URL

LOOKUP_PATH = "/tasks/request-validation-assignment/"


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
        return read_tasks(self._http.call("GET", "/tasks/list", None, LIST).response)

    def request_assignment(self, task_id: str) -> Assignment | Refusal:
        path = f"{LOOKUP_PATH}{quote(normalise_id(task_id), safe='')}"
        return read_lookup(self._http.call("POST", path, None, LOOKUP).response)

    def submit(
        self, assignment_id: str, status: SubmitStatus, metrics: dict | None
    ) -> SubmitResult:
        """The API's answer, classified (docs/fed-ledger-api.md, "Submit answers"; decided by
        answers.read_submit). Raises ApiUnavailable when no try had an answer that settles it
        (5xx, 408, 429, a 2xx without JSON, no answer at all), and OperatorError on a
        refused key."""
        path = f"/tasks/update-validation-assignment/{quote(normalise_id(assignment_id), safe='')}"
        body: dict[str, Any] = {"status": status}
        if status == "completed":
            body["data"] = metrics or {}
        reply = self._http.call("POST", path, body, SUBMIT)
        return read_submit(
            reply.response, f"POST {path}", earlier=reply.earlier, retry_after=reply.retry_after
        )
