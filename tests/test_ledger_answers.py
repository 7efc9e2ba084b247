"""The verdict table of validator/ledger/answers.py, without a network: every answer that
docs/fed-ledger-api.md lists ("Submit answers", "Error texts the client recognises"), read as the
transport reads it (tried again within the call? may the API have processed it? its label) and as
the client then does (what it returns or raises, with which message). A row that changes here is
a change of the protocol with the network's API."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from validator.errors import OperatorError
from validator.ledger.answers import (
    LIST,
    LOOKUP,
    LOOKUP_ANSWERS,
    NO_SUBMISSIONS,
    NOT_VALIDATING,
    RATE_LIMITED,
    SUBMIT,
    ApiUnavailable,
    Assignment,
    Policy,
    Refusal,
    SubmitAnswer,
    SubmitResult,
    Task,
    TryAgain,
    read_lookup,
    read_submit,
    read_tasks,
    try_again,
)
from validator.ledger.transport import retry_after_seconds
from validator.observe import telemetry

UPDATE = "POST /tasks/update-validation-assignment/7"
HTML = b"<html><body>502 Bad Gateway</body></html>"
ASSIGNMENT = {"id": 7, "data": {"base_model": "qwen1.5"}, "task_submission": {"data": {"r": 1}}}
KEY = "the Fed Ledger refused the API key (HTTP {}: {}); check --flock-api-key / FLOCK_API_KEY"


def answer(status: int, body: Any = b"", retry_after: str | None = None) -> requests.Response:
    """An answer as requests hands it over, built here instead of received."""
    response = requests.Response()
    response.status_code = status
    response._content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response.encoding = "utf-8"
    if retry_after is not None:
        response.headers["Retry-After"] = retry_after
    return response


def detail(text: str) -> dict[str, str]:
    return {"detail": text}


def verdict(policy: Policy, response: requests.Response, earlier: str | None = None) -> tuple:
    """(what the transport makes of the answer, what the client returns or raises) when it is
    the call's last, as Transport.call and FedLedgerClient hand it over."""
    again = try_again(response, policy)
    retry_after = None if again is None else retry_after_seconds(again.retry_after)
    read = {
        "tasks_list": lambda: read_tasks(response),
        "lookup": lambda: read_lookup(response),
        "submit": lambda: read_submit(response, UPDATE, earlier=earlier, retry_after=retry_after),
    }[policy.name]
    try:
        outcome: Any = read()
    except ApiUnavailable as exc:
        outcome = ("ApiUnavailable", str(exc), exc.maybe_processed, exc.retry_after)
    except OperatorError as exc:
        outcome = ("OperatorError", str(exc))
    return again, outcome


def retried(status: int, processed: bool, retry_after: str | None = None) -> TryAgain:
    return TryAgain(f"HTTP {status}", processed, f"http_{status}", retry_after)


NOT_JSON = TryAgain("HTTP 200 without a JSON body", True, "not_json")


def unavailable(what: str, processed: bool = False, wait: float | None = None) -> tuple:
    return ("ApiUnavailable", f"{UPDATE}: {what}", processed, wait)


SUBMIT_ROWS = [
    # 2xx with a JSON body: taken.
    ((200, {"ok": 1}), None, SubmitResult(SubmitAnswer.ACCEPTED, 200, '{"ok": 1}')),
    ((201, detail("done")), None, SubmitResult(SubmitAnswer.ACCEPTED, 201, "done")),
    # 2xx without one (empty, a proxy's page): tried again; the API may have it.
    ((200, b""), NOT_JSON, unavailable("HTTP 200 without a JSON body: (empty body)", True)),
    ((200, HTML), NOT_JSON, unavailable(f"HTTP 200 without a JSON body: {HTML.decode()}", True)),
    # 401, 403: the key is refused, no retry.
    ((401, detail("no")), None, ("OperatorError", KEY.format(401, "no"))),
    ((403, b""), None, ("OperatorError", KEY.format(403, "(empty body)"))),
    # 408, 429 (a 429's rate limiter may count after the commit), 5xx: tried again.
    ((408, detail("slow")), retried(408, False), unavailable("HTTP 408: slow")),
    ((429, detail("s"), "5"), retried(429, True, "5"), unavailable("HTTP 429: s", True, 5.0)),
    (
        (429, b"", "999"),
        retried(429, True, "999"),
        unavailable("HTTP 429: (empty body)", True, 180),
    ),
    ((500, b""), retried(500, True), unavailable("HTTP 500: (empty body)", True)),
    ((502, HTML), retried(502, True), unavailable(f"HTTP 502: {HTML.decode()}", True)),
    ((503, detail("x"), "2"), retried(503, False, "2"), unavailable("HTTP 503: x", False, 2.0)),
    ((504, b""), retried(504, True), unavailable("HTTP 504: (empty body)", True)),
    # A 5xx not listed is not tried again within the call, but kept all the same.
    ((501, b""), None, unavailable("HTTP 501: (empty body)")),
    # Not validating: too late (or taken by an earlier try: the next table).
    (
        (400, detail(NOT_VALIDATING)),
        None,
        SubmitResult(SubmitAnswer.NOT_VALIDATING, 400, NOT_VALIDATING),
    ),
    # Any other 4xx: rejected, for the operator.
    ((400, detail("bad")), None, SubmitResult(SubmitAnswer.REJECTED, 400, "bad")),
    ((404, detail("gone")), None, SubmitResult(SubmitAnswer.REJECTED, 404, "gone")),
    ((409, {"x": 1}), None, SubmitResult(SubmitAnswer.REJECTED, 409, '{"x": 1}')),
    ((422, HTML), None, SubmitResult(SubmitAnswer.REJECTED, 422, HTML.decode())),
]


@pytest.mark.parametrize(("given", "again", "outcome"), SUBMIT_ROWS)
def test_each_submit_answer_has_its_verdict(given, again, outcome):
    assert verdict(SUBMIT, answer(*given)) == (again, outcome)


def test_after_a_try_the_api_may_have_taken_the_submit_answers_say_so():
    earlier = "ReadTimeout: read timed out"
    late = answer(400, detail(NOT_VALIDATING))
    assert verdict(SUBMIT, late, earlier)[1] == SubmitResult(
        SubmitAnswer.NOT_VALIDATING, 400, NOT_VALIDATING, earlier
    )
    assert verdict(SUBMIT, answer(201, {}), earlier)[1] == SubmitResult(
        SubmitAnswer.ACCEPTED, 201, "{}", earlier
    )
    assert verdict(SUBMIT, answer(404, b""), earlier)[1] == SubmitResult(
        SubmitAnswer.REJECTED, 404, "(empty body)", earlier
    )
    # A 408 and a 503 surely were not processed, but the earlier try may have been.
    assert verdict(SUBMIT, answer(503, b""), earlier)[1] == unavailable(
        "HTTP 503: (empty body)", True
    )
    assert verdict(SUBMIT, answer(408, b""), earlier)[1][2] is True


LOOKUP_ROWS = [
    ((200, ASSIGNMENT), None, Assignment.model_validate(ASSIGNMENT)),
    # A 200 that is not an assignment is an unexpected answer, not work.
    ((200, {"data": {}}), None, Refusal("unexpected", 200, "malformed assignment: Field required")),
    (
        (200, HTML),
        None,
        Refusal(
            "unexpected",
            200,
            "malformed assignment: the answer to lookup: not valid JSON: Expecting value: line 1 "
            "column 1 (char 0)",
        ),
    ),
    # An id is an integer or text (`null` would be submitted to .../None), and a lone
    # surrogate anywhere in it (valid JSON) would end the validator at the journal's INSERT.
    *[
        (
            (200, {**ASSIGNMENT, "id": bad}),
            None,
            Refusal("unexpected", 200, f"malformed assignment: Value error, {why}"),
        )
        for bad, why in [
            (None, "an id is an integer or text, not NoneType"),
            (True, "an id is an integer or text, not bool"),
            ([1], "an id is an integer or text, not list"),
            ({"a": 1}, "an id is an integer or text, not dict"),
            (1.5, "an id is an integer or text, not float"),
            ("", "an id is letters, digits and ._:- (128 at most)"),
            ("../7", "an id is letters, digits and ._:- (128 at most)"),
            ("7" * 129, "an id is letters, digits and ._:- (128 at most)"),
        ]
    ],
    *[
        (
            (200, body),
            None,
            Refusal(
                "unexpected",
                200,
                "malformed assignment: the answer to lookup: holds text that is not Unicode "
                "(a lone surrogate escape)",
            ),
        )
        for body in [
            {**ASSIGNMENT, "id": "\ud800"},
            {**ASSIGNMENT, "task_submission": {"data": {"hg_repo_id": "a/\udc00"}}},
            {**ASSIGNMENT, "data": {"\udbff": 1}},
        ]
    ],
    (
        (200, {**ASSIGNMENT, "id": " a-7.b:1_ "}),
        None,
        Assignment.model_validate({**ASSIGNMENT, "id": "a-7.b:1_"}),
    ),
    # The known texts are matched on the detail, whatever the status.
    ((400, detail(NO_SUBMISSIONS)), None, Refusal("no_submissions", 400, NO_SUBMISSIONS)),
    ((404, detail(NO_SUBMISSIONS)), None, Refusal("no_submissions", 404, NO_SUBMISSIONS)),
    # 429 is the API's rate limit, handled by the runner: not tried again within the call.
    ((429, detail(RATE_LIMITED), "5"), None, Refusal("rate_limited", 429, RATE_LIMITED)),
    ((401, b""), None, ("OperatorError", KEY.format(401, "(empty body)"))),
    ((403, detail("no")), None, ("OperatorError", KEY.format(403, "no"))),
    # Only a 503 surely was not processed: tried again; 500, 502, 504 end the call.
    ((503, b"", "3"), retried(503, False, "3"), Refusal("unexpected", 503, "(empty body)")),
    ((500, detail("oops")), None, Refusal("unexpected", 500, "oops")),
    ((502, HTML), None, Refusal("unexpected", 502, HTML.decode())),
    ((504, b""), None, Refusal("unexpected", 504, "(empty body)")),
    ((408, b""), None, Refusal("unexpected", 408, "(empty body)")),
    # The API's own 404 (a JSON detail): it does not know the task; the runner sets it aside.
    ((404, detail("Task not found")), None, Refusal("unknown_task", 404, "Task not found")),
    # A 404 without the API's detail is a proxy's or a wrong --api-url's: unexpected.
    ((404, HTML), None, Refusal("unexpected", 404, HTML.decode())),
]


@pytest.mark.parametrize(("given", "again", "outcome"), LOOKUP_ROWS)
def test_each_lookup_answer_has_its_verdict(given, again, outcome):
    assert verdict(LOOKUP, answer(*given)) == (again, outcome)


LIST_FAILED = "GET /tasks/list: HTTP {}: {}"
LIST_ROWS = [
    (
        (200, [{"id": 12, "task_type": "training"}, "junk"]),
        None,
        [Task(id="12", task_type="training")],
    ),
    # Entries whose id is no id are left out, as entries that are not tasks.
    (
        (200, [{"id": None}, {"id": False}, {"id": [12]}, {"id": "x7"}, {"id": "x 7"}]),
        None,
        [Task(id="x7")],
    ),
    # A 2xx that is not a list is no listing, and not tried again (listing is not submitting).
    ((200, b""), None, ("ApiUnavailable", LIST_FAILED.format(200, "(empty body)"), False, None)),
    ((200, {"a": 1}), None, ("ApiUnavailable", LIST_FAILED.format(200, '{"a": 1}'), False, None)),
    ((401, b""), None, ("OperatorError", KEY.format(401, "(empty body)"))),
    (
        (429, b"", "4"),
        retried(429, False, "4"),
        ("ApiUnavailable", LIST_FAILED.format(429, "(empty body)"), False, None),
    ),
    (
        (500, b""),
        retried(500, True),
        ("ApiUnavailable", LIST_FAILED.format(500, "(empty body)"), False, None),
    ),
    ((404, detail("x")), None, ("ApiUnavailable", LIST_FAILED.format(404, "x"), False, None)),
]


@pytest.mark.parametrize(("given", "again", "outcome"), LIST_ROWS)
def test_each_task_list_answer_has_its_verdict(given, again, outcome):
    assert verdict(LIST, answer(*given)) == (again, outcome)


def test_what_an_answer_carries_beyond_the_models_is_dropped_at_the_boundary():
    # A lookup's extra keys, if kept, cost +2.7 GB (100 MB of them), and a listed entry without
    # an id must not end the validator at start (a ValidationError, exit 1).
    extra = {**ASSIGNMENT, "padding": [{}] * 1000, "task_submission": {"data": {"r": 1}, "x": 2}}
    assignment = read_lookup(answer(200, extra))
    assert assignment == read_lookup(answer(200, ASSIGNMENT))
    assert not assignment.model_extra and not assignment.task_submission.model_extra
    listed = [{"id": 12, "task_type": "training", "title": "t" * 100}, {"task_type": "no id"}]
    (task,) = read_tasks(answer(200, listed))
    assert task == Task(id="12", task_type="training") and not task.model_extra


def test_an_answer_of_too_many_json_values_is_not_decoded():
    # The transport reads no more than the call's bytes; what the bytes may hold is capped too.
    body = b'{"id": 7, "data": {}, "padding": [' + b",".join([b"0"] * 30_000) + b"]}"
    assert read_lookup(answer(200, body)) == Refusal(
        "unexpected", 200, "malformed assignment: the answer to lookup: holds more than 20000 "
        "JSON values",
    )  # fmt: skip


def test_the_metrics_label_each_lookup_answer_the_ledger_has():
    # Written twice, as observe may not import the ledger: the series start from this tuple.
    assert telemetry.LOOKUP_ANSWERS == LOOKUP_ANSWERS
