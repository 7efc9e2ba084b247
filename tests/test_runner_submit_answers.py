"""Each row of docs/fed-ledger-api.md "Submit answers", as the loop lives it: the real runner,
submitting and journal in this process, the API's last answer to a submit call read by the
client's own reader (validator/ledger/answers.py read_submit, through tests/helpers/
fake_ledger.py), and what the journal then holds. What happens within one call (the transport's
tries against real HTTP faults) is tests/faults/test_submit_answers.py's."""

from __future__ import annotations

import ast
import inspect
import logging
import sqlite3
from pathlib import Path

import pytest

from tests.helpers.fake_ledger import LATE, OK, FakeLedger, Reply, Unreachable, detail
from validator import runner
from validator.errors import ExitCode
from validator.ledger import submitting
from validator.ledger.client import FedLedgerClient
from validator.ledger.submitting import (
    MAYBE_TAKEN,
    REJECTED_RETRY_SECONDS,
    SubmitAction,
    SubmitVerdict,
    submit_result,
)
from validator.ledger.transport import CallInterrupted
from validator.state.entry import Entry, State

CALL = "POST /tasks/update-validation-assignment/1"
LOST_ANSWER = "the API's answer to an earlier try was lost"
TOO_LATE = "too late: the API says 'Validation assignment is not in validating status'"


def one_result(loop, *answers, **run) -> ExitCode:
    """Task 1 hands out one submission, scored 0.5; the submit calls get `answers`, then OK."""
    loop.submission("1", "a", 0.5)
    loop.ledger.submit_answers.extend(answers)
    return loop.run(max_assignments=1, **run)


def submitted_once(loop) -> None:
    assert loop.ledger.taken() == [("1", "completed", {"score": 0.5, "size": 0})]


def last_note(loop) -> str:
    return loop.events("1")[-1][1] or ""


def test_a_2xx_with_json_is_submitted(loop):
    assert one_result(loop, OK) == ExitCode.OK
    submitted_once(loop)
    assert (loop.entry("1").state, last_note(loop)) == (State.SUBMITTED, "completed")
    assert len(loop.ledger.submits) == 1


@pytest.mark.parametrize(
    ("answer", "story"),
    [
        # Still no JSON after the call's retries: the API may have it.
        (Reply(200, None, earlier="HTTP 200 without a JSON body"), "HTTP 200 without a JSON body"),
        # A 429 may come from a rate limiter that counts after the API committed the result.
        (detail(429, "Too Many Requests", earlier="HTTP 429"), "HTTP 429"),
        (detail(500, "Internal Server Error"), "HTTP 500"),
        (Reply(502, "<html>Bad Gateway</html>"), "HTTP 502"),
        (Unreachable(f"{CALL}: ConnectionError: reset", maybe_processed=True), "ConnectionError"),
    ],
    ids=["2xx-without-json", "429", "500", "502", "no-answer-after-sending"],
)
def test_an_answer_that_may_hide_a_commit_is_kept_then_a_repeat_refused_is_submitted(
    loop, answer, story
):
    # The first call's last answer leaves it unsettled; the next pass's is "not validating".
    assert one_result(loop, answer, LATE) == ExitCode.OK
    first, repeat = loop.ledger.submits
    assert repeat.at - first.at >= loop.time_sleep  # kept, sent again by a later pass
    submitted_once_noted = loop.entry("1")
    assert (submitted_once_noted.state, submitted_once_noted.outcome) == (
        State.SUBMITTED,
        "completed",
    )
    note = last_note(loop)
    assert note.startswith(f"completed; submitted; {LOST_ANSWER}") and story in note, note


@pytest.mark.parametrize(
    "answer",
    [
        detail(503, "Service Unavailable"),
        detail(408, "Request Timeout"),
        Unreachable(f"{CALL}: ConnectionError: refused"),  # nothing was sent
    ],
    ids=["503", "408", "connection-refused"],
)
def test_an_answer_the_api_surely_did_not_process_is_kept_then_sent_again(loop, answer):
    loop.submission("1", "a", 0.5)
    loop.ledger.submit_answers.append(answer)
    assert loop.run(max_assignments=1, horizon=loop.time_sleep / 2) == ExitCode.OK  # stopped
    entry = loop.entry("1")
    assert (entry.state, entry.maybe_taken) == (State.SCORED, None)
    assert entry.error.startswith("submit: "), entry.error
    assert entry.not_before >= loop.clock.now - loop.time_sleep / 2 + loop.time_sleep

    # Not maybe taken: a "not validating" now is the API's final word, too late.
    loop.ledger.submit_answers.append(LATE)
    assert loop.run(max_assignments=1) == ExitCode.OK
    entry = loop.entry("1")
    assert (entry.state, entry.error.startswith(TOO_LATE)) == (State.DROPPED, True)
    assert loop.ledger.taken() == []


def test_a_result_kept_while_the_api_is_down_is_submitted_once_when_it_is_back(loop):
    down = detail(503, "Service Unavailable")
    assert one_result(loop, down, down, OK) == ExitCode.OK
    submitted_once(loop)
    times = [s.at for s in loop.ledger.submits]
    assert len(times) == 3
    assert all(b - a >= loop.time_sleep for a, b in zip(times, times[1:], strict=False))
    assert last_note(loop) == "completed"  # surely not taken before: nothing to tell


def test_a_retry_after_longer_than_time_sleep_is_waited_out(loop):
    answer = detail(429, "Too Many Requests", retry_after="150")
    assert one_result(loop, answer, OK) == ExitCode.OK
    first, second = loop.ledger.submits
    assert second.at - first.at >= 150 > loop.time_sleep
    submitted_once(loop)


def test_a_retry_after_that_no_date_can_hold_is_ignored_not_a_crash(loop):
    # A year past what a C integer holds raises OverflowError in the client: uncaught, the
    # validator would exit 1 ("validator crashed") on any 408, 429 or 5xx carrying it.
    far = detail(503, "Service Unavailable", retry_after="Sun, 06 Nov 99999999999 08:49:37 GMT")
    assert one_result(loop, far, OK) == ExitCode.OK
    first, second = loop.ledger.submits
    assert second.at - first.at >= loop.time_sleep  # the usual pause, no wait of its own
    submitted_once(loop)


def test_not_validating_after_an_earlier_try_of_the_call_is_submitted_noted(loop):
    answer = detail(400, "Validation assignment is not in validating status", earlier="HTTP 502")
    assert one_result(loop, answer) == ExitCode.OK
    assert [s.answer for s in loop.ledger.submits] == ["not_validating"]
    entry = loop.entry("1")
    assert (entry.state, entry.outcome) == (State.SUBMITTED, "completed")
    assert last_note(loop).startswith(f"completed; submitted; {LOST_ANSWER} (HTTP 502)")


def test_a_lost_answer_is_remembered_across_processes_by_its_column(loop):
    # The first process's only try lost its answer after sending: kept as maybe taken.
    lost = Unreachable(f"{CALL}: ConnectionError: reset", maybe_processed=True)
    assert one_result(loop, lost, horizon=loop.time_sleep / 2) == ExitCode.OK
    entry = loop.entry("1")
    assert entry.state == State.SCORED and entry.error.startswith(MAYBE_TAKEN)
    assert entry.maybe_taken and entry.maybe_taken in entry.error
    # The column decides, not the error's text: an operator's note over it changes
    # nothing.
    with sqlite3.connect(loop.state_dir / "journal.sqlite3") as db:
        db.execute("UPDATE assignments SET error = 'looked at by the operator' WHERE id = '1'")
    db.close()

    loop.ledger.submit_answers.append(LATE)
    assert loop.run(max_assignments=1) == ExitCode.OK
    assert loop.entry("1").state == State.SUBMITTED
    assert LOST_ANSWER in last_note(loop)


def test_not_validating_with_no_earlier_try_is_too_late_and_dropped(loop):
    assert one_result(loop, LATE) == ExitCode.OK
    entry = loop.entry("1")
    assert entry.state == State.DROPPED
    assert entry.error == TOO_LATE  # not "an earlier process": this one decided it
    assert len(loop.ledger.submits) == 1


def test_not_validating_for_a_result_an_earlier_process_decided_says_it_may_have_sent_it(loop):
    assert one_result(loop, detail(503, "down"), horizon=loop.time_sleep / 2) == ExitCode.OK
    loop.ledger.submit_answers.append(LATE)
    assert loop.run(max_assignments=1) == ExitCode.OK
    entry = loop.entry("1")
    assert entry.state == State.DROPPED
    assert entry.error == (
        f"{TOO_LATE}; or an earlier process submitted it and ended before recording that"
    )


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_exits_3_and_keeps_the_result(loop, status):
    assert one_result(loop, detail(status, "Invalid API key")) == ExitCode.OPERATOR
    assert loop.entry("1").state == State.SCORED  # kept, not dropped
    assert loop.ledger.taken() == []


@pytest.mark.parametrize(
    "answer",
    [
        detail(404, "Not Found"),
        detail(409, "Conflict"),
        detail(422, "Unprocessable Entity"),
        detail(400, "Invalid metrics"),
    ],
    ids=["404", "409", "422", "400-other-text"],
)
def test_any_other_4xx_keeps_the_result_an_hour_and_a_restart_sends_it_at_once(
    loop, caplog, answer
):
    assert one_result(loop, answer, horizon=REJECTED_RETRY_SECONDS / 2) == ExitCode.OK
    entry = loop.entry("1")
    assert entry.state == State.SCORED
    assert (
        entry.error == f"the API rejected the submit: HTTP {answer.status}: {answer.body['detail']}"
    )
    assert entry.not_before >= loop.ledger.submits[0].at + REJECTED_RETRY_SECONDS
    assert "operator action may be needed" in caplog.text and "stays in the journal" in caplog.text
    assert len(loop.ledger.submits) == 1  # not sent again within the hour

    # A restart sends kept results first thing, whatever their wait, before any lookup.
    lookups = len(loop.ledger.lookups)
    restarted = loop.clock.now
    assert loop.run(max_assignments=1) == ExitCode.OK
    submitted_once(loop)
    assert loop.ledger.submits[-1].at == restarted
    assert len(loop.ledger.lookups) == lookups


def test_any_other_4xx_is_sent_again_after_an_hour_by_the_same_process(loop):
    horizon = 2 * REJECTED_RETRY_SECONDS
    assert one_result(loop, detail(404, "Not Found"), OK, horizon=horizon) == ExitCode.OK
    first, second = loop.ledger.submits
    assert second.at - first.at >= REJECTED_RETRY_SECONDS
    submitted_once(loop)


def test_a_stop_during_the_submit_keeps_the_result_for_the_next_run(loop):
    def stopped(ledger: FakeLedger) -> CallInterrupted:
        loop.stop.set()  # the stop signal comes while the call waits for its answer
        return CallInterrupted(f"{CALL}: abandoned on a stop signal")

    assert one_result(loop, stopped) == ExitCode.OK
    assert loop.entry("1").state == State.SCORED
    assert loop.ledger.looked_up() == ["1"]

    assert loop.run(max_assignments=1) == ExitCode.OK
    submitted_once(loop)


def test_the_fake_ledger_has_the_signatures_of_the_client_methods_the_runner_calls():
    for name in ("request_assignment", "submit", "close"):
        real = inspect.signature(getattr(FedLedgerClient, name)).parameters
        fake = inspect.signature(getattr(FakeLedger, name)).parameters
        assert list(fake) == list(real), name
    client = FedLedgerClient("k", "http://127.0.0.1:9/api/v1")
    assert isinstance(client.started_at, float)
    assert isinstance(FakeLedger(float).started_at, float)


def test_submitting_returns_its_verdict_and_the_runner_records_it():
    """Submitting reads the API's answer into a verdict and writes nothing: it does not even
    import the journal. The runner records the verdict (the tests above: what the journal then
    holds), and tells the operator only once the journal holds it."""
    tree = ast.parse(Path(submitting.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "validator.state.journal" not in imported
    ledger = FakeLedger(lambda: 0.0, started_at=50.0)
    ledger.submit_answers.extend([LATE, detail(404, "Not Found")])
    entry = Entry(
        id="7", module="m", task_id="1", state=State.SCORED, input={}, metrics={"score": 0.5},
        outcome=None, error=None, attempts=1, not_before=0.0, received_at=100.0,
        updated_at=100.0,
    )  # fmt: skip
    assert submit_result(ledger, entry, 60.0, now=lambda: 1000.0) == SubmitVerdict(
        SubmitAction.DROPPED, TOO_LATE, level=logging.WARNING, told=f"{TOO_LATE}; result dropped"
    )
    rejected = submit_result(ledger, entry, 60.0, now=lambda: 1000.0)
    assert (rejected.action, rejected.retry_at, rejected.taken, rejected.level) == (
        SubmitAction.KEPT,
        1000.0 + REJECTED_RETRY_SECONDS,
        None,
        logging.ERROR,
    )
    assert rejected.reason == "the API rejected the submit: HTTP 404: Not Found"


def test_a_verdict_without_a_case_in_the_runner_stops_it_and_is_never_a_deferral(loop, monkeypatch):
    # The runner's match over SubmitAction is exhaustive (mypy holds it): an action it has no
    # case for is a bug, raised, not a submit silently kept for later.
    monkeypatch.setattr(runner, "submit_result", lambda *args: SubmitVerdict("parked"))
    with pytest.raises(AssertionError, match="no case for 'parked'"):
        one_result(loop)
    entry = loop.entry("1")
    assert (entry.state, entry.error, entry.not_before) == (State.SCORED, None, 0.0)
