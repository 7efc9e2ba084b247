"""What the loop does with each outcome of a scoring (validator/errors.py OUTCOMES), in this
process: the real runner and journal, a fake Fed Ledger and clock (tests/helpers/loop.py). What
the API received and what the journal holds are the checks; time is the runner's own clock."""

from __future__ import annotations

import logging

import pytest

from validator.errors import (
    MAX_SCORING_ATTEMPTS,
    DeviceError,
    ExitCode,
    OperatorError,
    SubmissionRejected,
    TransientError,
)
from validator.runner import PENDING_TTL_SECONDS, Interrupted
from validator.state.entry import State
from validator.state.phases import STOP_FILE

HOUR = 3600.0


def states(loop, assignment_id: str) -> list[str]:
    return [state for state, _ in loop.events(assignment_id)]


def test_a_scored_submission_is_submitted_once_as_completed(loop):
    loop.submission("1", "a", 0.25, size=7)

    assert loop.run(max_assignments=1) == ExitCode.OK
    # The assignment's data ("size", the task's) reached the module beside the submission's.
    assert loop.ledger.taken() == [("1", "completed", {"score": 0.25, "size": 7})]
    entry = loop.entry("1")
    assert (entry.state, entry.outcome, entry.attempts) == (State.SUBMITTED, "completed", 1)
    assert states(loop, "1") == ["received", "scoring", "scored", "submitted"]


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (SubmissionRejected("a has no adapter"), "SubmissionRejected: a has no adapter"),
        # What libraries raise for bad input is the submission's fault too.
        (ValueError("cannot load a"), "ValueError: cannot load a"),
    ],
    ids=["SubmissionRejected", "ValueError"],
)
def test_a_rejected_submission_is_failed_at_once_without_a_traceback(loop, caplog, error, reason):
    loop.submission("1", "a", error)

    assert loop.run(max_assignments=1) == ExitCode.OK
    assert loop.ledger.taken() == [("1", "failed", None)]
    entry = loop.entry("1")
    assert (entry.state, entry.outcome, entry.attempts, entry.error) == (
        State.SUBMITTED,
        "failed",
        1,
        reason,
    )
    assert entry.penalty_kind == "rejected"  # why, kept with the result
    (line,) = [r for r in caplog.records if "submitted as failed (rejected)" in r.getMessage()]
    assert not line.exc_info  # the submission's fault, not a bug


def test_a_submission_hit_once_by_a_bug_is_scored_again_and_completed(loop, caplog):
    loop.submission("1", "a", TypeError("'NoneType' object is not subscriptable"), 0.5)

    assert loop.run(max_assignments=1) == ExitCode.OK
    assert loop.ledger.taken() == [("1", "completed", {"score": 0.5, "size": 0})]
    entry = loop.entry("1")
    assert (entry.outcome, entry.attempts) == ("completed", 2)
    (first, second) = [at for _, at in loop.module.calls]
    assert second - first >= loop.time_sleep  # after --time-sleep, not in a busy loop
    assert "attempt 1 of 3, scoring it again in 60s" in caplog.text


def test_a_bug_every_time_is_failed_after_three_attempts_while_others_go_on(loop, caplog):
    loop.lookup_interval = loop.time_sleep / 6  # new work is due between its attempts
    loop.submission("1", "bug", TypeError("'NoneType' object is not subscriptable"))
    loop.submission("1", "a", 0.5)
    loop.submission("2", "b", 0.75)

    assert loop.run(["1", "2"], max_assignments=3) == ExitCode.OK
    taken = loop.ledger.taken()
    # The others did not wait for it: its failed result is the last to go out.
    assert [status for _, status, _ in taken] == ["completed", "completed", "failed"]
    assert taken[-1][0] == "1"
    entry = loop.entry("1")
    assert (entry.state, entry.outcome, entry.attempts) == (
        State.SUBMITTED,
        "failed",
        MAX_SCORING_ATTEMPTS,
    )
    assert entry.error.startswith(
        "unexpected error in the module after 3 attempts: TypeError: 'NoneType' object"
    )
    tries = [at for name, at in loop.module.calls if name == "bug"]
    assert len(tries) == MAX_SCORING_ATTEMPTS
    assert all(b - a >= loop.time_sleep for a, b in zip(tries, tries[1:], strict=False))
    lines = [r for r in caplog.records if "unexpected error in the module (" in r.getMessage()]
    assert [f"attempt {n} of 3" in r.getMessage() for n, r in enumerate(lines, 1)] == [True] * 3
    assert all(r.exc_info for r in lines)  # a bug: its traceback is logged


def test_a_transient_fault_is_retried_uncounted_then_completed(loop, caplog):
    loop.submission("1", "a", TransientError("hub answered 503"), 0.5)

    assert loop.run(max_assignments=1) == ExitCode.OK
    assert loop.ledger.taken() == [("1", "completed", {"score": 0.5, "size": 0})]
    entry = loop.entry("1")
    assert (entry.outcome, entry.attempts) == ("completed", 1)  # the transient try not counted
    assert ("received", "transient: hub answered 503") in loop.events("1")
    (first, second) = [at for _, at in loop.module.calls]
    assert second - first >= loop.time_sleep
    assert "transient fault (hub answered 503); retrying in 60s" in caplog.text


def test_an_assignment_with_transient_faults_for_a_day_is_dropped_not_failed(loop, caplog):
    loop.time_sleep = loop.lookup_interval = 3 * HOUR  # a day in few passes
    loop.submission("1", "a", TransientError("hub answered 503"))

    assert loop.run(max_assignments=1, horizon=3 * 24 * HOUR) == ExitCode.OK
    # Never submitted (neither completed nor failed): the API lets it expire.
    assert loop.ledger.submits == []
    entry = loop.entry("1")
    assert entry.state == State.DROPPED
    assert entry.error == "transient faults for 27 h: hub answered 503"
    # Retried every --time-sleep until, and only until, a day had passed since it came.
    tries = [at - entry.received_at for _, at in loop.module.calls]
    assert tries[-2] <= PENDING_TTL_SECONDS < tries[-1], tries
    assert len(tries) == 10
    assert "dropped after 27 h of transient faults" in caplog.text


def test_an_operator_error_exits_3_and_the_assignment_waits_for_the_fix(loop):
    loop.submission("1", "a", OperatorError("disk full"), 0.5)

    assert loop.run(max_assignments=1) == ExitCode.OPERATOR
    assert loop.ledger.submits == []
    entry = loop.entry("1")
    assert (entry.state, entry.attempts, entry.error) == (State.RECEIVED, 0, "disk full")

    lookups = len(loop.ledger.lookups)
    assert loop.run(max_assignments=1) == ExitCode.OK  # the next process, after the fix
    assert loop.ledger.taken() == [("1", "completed", {"score": 0.5, "size": 0})]
    assert len(loop.ledger.lookups) == lookups  # scored from the journal, not looked up again


def test_a_module_that_cannot_start_exits_3_and_counts_no_attempt(loop):
    loop.module.init_error = AttributeError("'PlanConfig' object has no attribute 'model_path'")
    loop.submission("1", "a", 0.5)

    assert loop.run(max_assignments=1) == ExitCode.OPERATOR
    assert loop.ledger.submits == []
    entry = loop.entry("1")
    assert (entry.state, entry.attempts) == (State.RECEIVED, 0)
    assert entry.error.startswith("module plan cannot start: AttributeError:")

    loop.module.init_error = None
    assert loop.run(max_assignments=1) == ExitCode.OK
    assert loop.ledger.taken() == [("1", "completed", {"score": 0.5, "size": 0})]


def test_a_device_fault_restarts_the_process_and_fails_after_three(loop):
    loop.submission("1", "a", DeviceError("CUDA error: device-side assert triggered"))

    for attempt in range(1, MAX_SCORING_ATTEMPTS + 1):
        assert loop.run(max_assignments=1) == ExitCode.RESTART
        entry = loop.entry("1")
        # Left in `scoring` with its attempt counted, for the next process.
        assert (entry.state, entry.attempts) == (State.SCORING, attempt)
    assert loop.ledger.submits == []
    assert len(loop.ledger.lookups) == 1

    assert loop.run(max_assignments=1) == ExitCode.OK
    assert loop.ledger.taken() == [("1", "failed", None)]
    entry = loop.entry("1")
    assert entry.error == "scoring ended the process 3 times (crash or device fault)"
    assert len(loop.module.calls) == MAX_SCORING_ATTEMPTS  # not scored a fourth time


def test_a_stop_during_scoring_submits_that_result_then_ends(loop, caplog):
    caplog.set_level(logging.INFO)
    loop.submission("1", "a", loop.stopping(0.5))
    loop.submission("1", "b", 0.75)

    assert loop.run() == ExitCode.OK
    assert loop.ledger.taken() == [("1", "completed", {"score": 0.5, "size": 0})]
    assert loop.ledger.looked_up() == ["1"]  # nothing more was asked for
    assert "stopped by signal" in caplog.text


def test_a_second_stop_cuts_scoring_short_and_the_attempt_is_not_counted(loop):
    def interrupted() -> float:
        loop.stop.set()  # the first signal; the second one raises in the scoring
        raise Interrupted()

    loop.submission("1", "a", interrupted, 0.5)

    with pytest.raises(Interrupted):
        loop.run(max_assignments=1)
    assert loop.entry("1").state == State.SCORING
    assert (loop.state_dir / STOP_FILE).exists()
    assert loop.ledger.submits == []

    assert loop.run(max_assignments=1) == ExitCode.OK
    assert loop.ledger.taken() == [("1", "completed", {"score": 0.5, "size": 0})]
    assert loop.entry("1").attempts == 1  # the cut attempt was taken back
    notes = [note or "" for _, note in loop.events("1")]
    assert any("stopped" in note and "attempt not counted" in note for note in notes), notes
