"""HTTP front of the Fed Ledger simulator.

Maps requests onto `SimState` calls, applies fault rules to /api/v1 requests
and serves the unauthenticated /_sim control endpoints.
"""

from __future__ import annotations

import hmac
import json
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any, Literal, TypeVar
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError, model_validator

from devkit.local_server import LocalHandler, LocalHTTPServer, padded_json
from devkit.simulator.faults import (
    FAULT_DETAIL,
    HTML_BODY,
    FaultBook,
    FaultRule,
    InvalidFaults,
    endpoint_of,
    parse_rules,
)
from devkit.simulator.state import NotFound, SimError, SimState, describe_errors

API_PREFIX = "/api/v1"
CONTROL_PREFIX = "/_sim"
REQUEST_ROUTE = "/tasks/request-validation-assignment/"
UPDATE_ROUTE = "/tasks/update-validation-assignment/"
MAX_BODY_BYTES = 10 * 1024 * 1024


@dataclass
class Reply:
    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # Seconds between two bytes of the body: a link or proxy that trickles the answer.
    trickle_seconds: float | None = None
    # Bytes of JSON values added to the body as it is sent (an `oversized` fault).
    padding: int = 0


def json_reply(status: int, payload: Any) -> Reply:
    return Reply(status, json.dumps(payload).encode(), "application/json")


def detail(status: int, text: str) -> Reply:
    return json_reply(status, {"detail": text})


class UpdateBody(BaseModel):
    # Unknown keys are ignored, as a lenient real server would.
    status: Literal["completed", "failed"]
    data: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _completed_needs_data(self) -> UpdateBody:
        if self.status == "completed" and self.data is None:
            raise ValueError("a completed update needs a 'data' object")
        return self


class NewSubmission(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: StrictInt | StrictStr
    data: dict[str, Any] = {}
    assignment_data: dict[str, Any] = {}


Body = TypeVar("Body", bound=BaseModel)


class BadBody(Exception):
    """The request body is not JSON or not the expected shape (answered 422)."""


def parse_json(raw: bytes) -> Any:
    # json.loads accepts Infinity/NaN, which Python clients emit by default.
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadBody(f"request body is not valid JSON: {exc}") from exc


def parse_body(model: type[Body], raw: bytes) -> Body:
    try:
        return model.model_validate(parse_json(raw))
    except ValidationError as exc:
        raise BadBody(describe_errors(exc)) from exc


def fault_reply(rule: FaultRule) -> Reply | None:
    """The answer a fault gives; None means drop the connection."""
    if rule.kind == "status":
        reply = detail(rule.status, FAULT_DETAIL)
        if rule.retry_after is not None:
            reply.headers["Retry-After"] = rule.retry_after
        return reply
    if rule.kind == "non_json":
        return Reply(rule.status, HTML_BODY, "text/html")
    if rule.kind == "empty":
        return Reply(rule.status)
    return None


class SimulatorServer(LocalHTTPServer):
    def __init__(
        self,
        address: tuple[str, int],
        state: SimState,
        faults: FaultBook,
        api_key: str | None,
    ) -> None:
        super().__init__(address, SimulatorHandler)
        self.state = state
        self.faults = faults
        self.api_key = api_key
        # The request log: the process's stderr, or a file when it runs in a test's thread.
        self.log: IO[str] = sys.stderr


class SimulatorHandler(LocalHandler):
    server: SimulatorServer
    server_version = "FedLedgerSimulator"
    quiet = False  # http.server's own errors go to stderr; requests are logged by _log_line

    def do_GET(self) -> None:  # names fixed by http.server
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    # -- plumbing

    def _dispatch(self, method: str) -> None:
        path = urlsplit(self.path).path
        raw = self._read_body()
        if path == API_PREFIX or path.startswith(API_PREFIX + "/"):
            reply = self._api(method, path, raw)
        elif path.startswith(CONTROL_PREFIX + "/"):
            reply = self._control(method, path, raw)
        else:
            reply = detail(404, "Not Found")
        if reply is None:
            self.close_connection = True
            self._log_line(method, path, "dropped")
            return
        try:
            self._send(reply)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up on a trickled answer.
            self.close_connection = True
            self._log_line(method, path, f"{reply.status}, abandoned by the client")
            return
        self._log_line(method, path, str(reply.status))

    def _read_body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        return self.rfile.read(min(max(length, 0), MAX_BODY_BYTES)) if length else b""

    def _send(self, reply: Reply) -> None:
        headers = {"Content-Type": reply.content_type} if reply.content_type else {}
        if reply.padding:
            length, chunks = padded_json(reply.body, reply.padding)
            sent = self.reply_chunks(reply.status, {**headers, **reply.headers}, length, chunks)
            self.server.state.note_sent(self.command, urlsplit(self.path).path, length, sent)
            return
        self.start_reply(
            reply.status, {**headers, "Content-Length": str(len(reply.body)), **reply.headers}
        )
        if not reply.body or self.command == "HEAD":
            return
        if reply.trickle_seconds is None:
            self.wfile.write(reply.body)
            return
        for index in range(len(reply.body)):
            self.wfile.write(reply.body[index : index + 1])
            self.wfile.flush()
            time.sleep(reply.trickle_seconds)

    def _log_line(self, method: str, path: str, outcome: str) -> None:
        # Only method, path and outcome: headers (the api key) never reach the log.
        self.server.log.write(f"{method} {path} {outcome}\n")
        self.server.log.flush()

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # Replaced by _log_line, which runs once the outcome is known.
        pass

    # -- /api/v1

    def _api(self, method: str, path: str, raw: bytes) -> Reply | None:
        sub_path = path[len(API_PREFIX) :]
        state = self.server.state
        received = arrived = state.request_begun()
        rule = self.server.faults.take(endpoint_of(sub_path))
        fault = rule.kind if rule else None
        reply = None
        processed = rule is None or rule.kind in ("delay", "trickle", "oversized") or rule.processed
        try:
            if rule is not None and rule.kind == "delay":
                time.sleep(rule.delay_seconds)
                rule = None
                # A proxy in front held it: the API receives it now.
                arrived = state.now()
            if rule is not None and rule.kind == "trickle":
                reply = self._api_call(method, sub_path, raw, arrived)
                reply.trickle_seconds = rule.delay_seconds
            elif rule is not None and rule.kind == "oversized":
                reply = self._api_call(method, sub_path, raw, arrived)
                reply.padding = rule.size_bytes
            elif rule is not None and rule.processed:
                # The API commits; its answer is lost on the way back.
                self._api_call(method, sub_path, raw, arrived)
                reply = fault_reply(rule)
            elif rule is not None:
                # Faults answer before any state is touched, as a proxy in front would.
                reply = fault_reply(rule)
            else:
                reply = self._api_call(method, sub_path, raw, arrived)
        finally:
            # Logged before the answer goes out, so a client that inspects the state right
            # after its response always finds its request there; an error here is logged as a
            # dropped connection, which is what the client sees.
            status = reply.status if reply else None
            state.log_request(
                method,
                path,
                status,
                fault,
                processed=processed,
                received=received,
                agent=self.headers.get("User-Agent"),
            )
        return reply

    def _api_call(self, method: str, sub_path: str, raw: bytes, arrived: float) -> Reply:
        if not self._authorised():
            return detail(401, "Could not validate credentials")
        try:
            return json_reply(200, self._route(method, sub_path, raw, arrived))
        except BadBody as exc:
            return detail(422, str(exc))
        except SimError as exc:
            return detail(exc.status, exc.detail)

    def _authorised(self) -> bool:
        expected = self.server.api_key
        if expected is None:
            return True
        given = self.headers.get("flock-api-key") or ""
        return hmac.compare_digest(given.encode(), expected.encode())

    def _route(self, method: str, sub_path: str, raw: bytes, arrived: float) -> Any:
        """The API's answer; `arrived`: when the request reached it (its rate limit's stamp)."""
        state = self.server.state
        if sub_path == "/tasks/list":
            _require_method(method, "GET")
            return state.list_tasks()
        task_id = _segment_after(sub_path, REQUEST_ROUTE)
        if task_id is not None:
            _require_method(method, "POST")
            return state.request_assignment(task_id, self.headers.get("flock-api-key"), arrived)
        assignment_id = _segment_after(sub_path, UPDATE_ROUTE)
        if assignment_id is not None:
            _require_method(method, "POST")
            # The body is checked first, as a FastAPI server validates it
            # before its handler looks anything up.
            update = parse_body(UpdateBody, raw)
            return state.update_assignment(assignment_id, update.status, update.data)
        raise NotFound("Not Found")

    # -- /_sim

    def _control(self, method: str, path: str, raw: bytes) -> Reply:
        state, faults = self.server.state, self.server.faults
        try:
            if path == "/_sim/state" and method == "GET":
                return json_reply(200, state.snapshot())
            if path == "/_sim/faults" and method == "GET":
                return json_reply(200, faults.describe())
            if path == "/_sim/faults" and method == "DELETE":
                faults.clear()
                return json_reply(200, [])
            if path == "/_sim/faults" and method == "POST":
                faults.add(parse_rules(parse_json(raw)))
                return json_reply(200, faults.describe())
            if path == "/_sim/submissions" and method == "POST":
                new = parse_body(NewSubmission, raw)
                added = state.add_submission(str(new.task_id), new.data, new.assignment_data)
                return json_reply(200, added)
            ended = _segment_after(path, "/_sim/tasks/")
            if ended is not None and method == "DELETE":
                return json_reply(200, state.end_task(ended))
        except (BadBody, InvalidFaults) as exc:
            return detail(422, str(exc))
        except SimError as exc:
            return detail(exc.status, exc.detail)
        return detail(404, "Not Found")


class MethodNotAllowed(SimError):
    status = 405


def _require_method(method: str, expected: str) -> None:
    if method != expected:
        raise MethodNotAllowed("Method Not Allowed")


def _segment_after(sub_path: str, prefix: str) -> str | None:
    """The id in `prefix<id>`, if the path is exactly that (one segment)."""
    if not sub_path.startswith(prefix):
        return None
    rest = sub_path[len(prefix) :]
    return unquote(rest) if rest and "/" not in rest else None
