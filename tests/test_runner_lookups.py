"""How the loop asks for work (docs/fed-ledger-api.md, "Rate limits and the lookup loop") and
what it finds in the journal first, in this process: the real runner and journal, a fake Fed
Ledger and clock (tests/helpers/loop.py). Gaps are read on the runner's own clock, which moves
only when it waits: a busy loop would show as lookups at one instant (and fail the run)."""

from __future__ import annotations

import logging

import pytest

from tests.helpers.fake_ledger import LIMITED, Reply, Unreachable, detail
from validator.errors import ExitCode, OperatorError
from validator.lookups import TaskSchedule
from validator.state.entry import State


def times_of(loop, task_id: str) -> list[float]:
    return [lookup.at for lookup in loop.ledger.lookups if lookup.task_id == task_id]


def spacing(interval: float) -> float:
    """The gap the loop leaves between two lookups of a task: the interval and its margin."""
    return TaskSchedule([], interval).margin + interval


def test_tasks_are_looked_up_round_robin(loop):
    for task_id, name in (("1", "a"), ("2", "b"), ("3", "c"), ("1", "d")):
        loop.submission(task_id, name, 0.5)

    assert loop.run(["1", "2", "3"], max_assignments=4) == ExitCode.OK
    assert loop.ledger.looked_up() == ["1", "2", "3", "1"]
    assert [name for name, _ in loop.module.calls] == ["a", "b", "c", "d"]
    assert len(loop.ledger.taken()) == 4


@pytest.mark.parametrize("refusal", ["no_submissions", "rate_limited"])
def test_a_task_with_nothing_to_give_is_asked_once_per_lookup_interval(loop, refusal):
    if refusal == "rate_limited":
        loop.ledger.lookup_answers.extend([LIMITED] * 100)
    gap = spacing(loop.lookup_interval)
    horizon = 5 * gap + 1

    assert loop.run(["1", "2"], horizon=horizon) == ExitCode.OK  # stopped at the horizon
    assert {lookup.answer for lookup in loop.ledger.lookups} == {refusal}
    for task_id in ("1", "2"):
        times = times_of(loop, task_id)
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert len(times) == 6 and set(gaps) == {gap}, gaps
    # Between them the loop slept until the next lookup was due, in one wait each.
    assert len(loop.clock.waits) == 6


@pytest.mark.parametrize(
    ("answer", "logged"),
    [
        (Reply(418, "<html>teapot</html>"), "unexpected answer HTTP 418: <html>"),
        (detail(400, "Task is closed"), "unexpected answer HTTP 400: Task is"),
        (Reply(200, {"data": {}}), "HTTP 200: malformed assignment"),
    ],
    ids=["not-json", "other-detail", "malformed"],
)
def test_an_unexpected_answer_delays_only_its_own_task(loop, caplog, answer, logged):
    # An answer the client does not know must not make every task wait --time-sleep.
    loop.ledger.lookup_answers.append(answer)
    loop.submission("1", "a", 0.25)
    loop.submission("2", "b", 0.5)

    assert loop.run(["1", "2"], max_assignments=2) == ExitCode.OK
    first, second, third = loop.ledger.lookups
    assert (first.task_id, first.answer) == ("1", "unexpected")
    assert second.task_id == "2" and second.at == first.at  # the other task did not wait
    wait = max(loop.time_sleep, loop.lookup_interval)
    assert third.task_id == "1" and third.at - first.at == spacing(wait)
    assert logged in caplog.text and f"its next lookup in {wait:g}s" in caplog.text


@pytest.mark.parametrize(
    "handed_out",
    [
        {"id": None},
        {"id": True},
        {"id": [1]},
        {"id": {"a": 1}},
        {"id": "\ud800"},
        {"id": 7, "task_submission": {"data": {"name": "\ud800"}}},
    ],
    ids=["null", "true", "list", "object", "surrogate", "surrogate-in-data"],
)
def test_an_assignment_without_an_id_or_not_all_unicode_is_never_taken(loop, caplog, handed_out):
    # An id is an integer or text (`null` would be scored and submitted to .../None), and a
    # lone surrogate would end the validator at the journal's INSERT (exit 1, "validator
    # crashed").
    loop.ledger.lookup_answers.append(Reply(200, handed_out))
    loop.submission("1", "a", 0.5)

    assert loop.run(["1"], max_assignments=1) == ExitCode.OK
    first, second = loop.ledger.lookups
    assert (first.answer, second.answer) == ("unexpected", "assignment 1")
    assert "HTTP 200: malformed assignment" in caplog.text
    assert [name for name, _ in loop.module.calls] == ["a"]
    assert loop.ledger.taken() == [("1", "completed", {"score": 0.5, "size": 0})]
    assert [row["id"] for row in loop._read("SELECT id FROM assignments")] == ["1"]


def test_an_unreachable_api_pauses_every_task_time_sleep(loop, caplog):
    loop.ledger.lookup_answers.append(
        Unreachable("POST /tasks/request-validation-assignment/1: HTTP 503")
    )
    loop.submission("2", "b", 0.5)

    assert loop.run(["1", "2"], max_assignments=1) == ExitCode.OK
    first, second = loop.ledger.lookups
    assert (first.task_id, first.answer) == ("1", "ApiUnavailable")
    # Every task asks the same API: the next one waited out the pause, though due at once.
    assert second.task_id == "2" and second.at - first.at == loop.time_sleep
    assert "Fed Ledger unavailable" in caplog.text
    assert f"sleeping {loop.time_sleep:g}s" in caplog.text


def test_a_refused_key_on_a_lookup_exits_3_without_asking_again(loop):
    loop.ledger.lookup_answers.append(detail(401, "Invalid API key"))
    loop.submission("2", "b", 0.5)

    assert loop.run(["1", "2"]) == ExitCode.OPERATOR
    assert loop.ledger.looked_up() == ["1"]


def test_max_assignments_ends_the_loop_once_that_many_are_finished(loop, caplog):
    caplog.set_level(logging.INFO)
    for name in "abc":
        loop.submission("1", name, 0.5)

    assert loop.run(max_assignments=2) == ExitCode.OK
    assert [aid for aid, _, _ in loop.ledger.taken()] == ["1", "2"]
    assert loop.ledger.looked_up() == ["1", "1"]  # the third was never asked for
    assert "finished 2 assignments; exiting" in caplog.text


def test_the_assignments_data_wins_over_the_submissions_on_a_clash(loop):
    loop.module.plans["a"] = [0.5]
    loop.ledger.queue("1", {"name": "a", "size": 1}, {"size": 2048})

    assert loop.run(max_assignments=1) == ExitCode.OK
    assert loop.ledger.taken() == [("1", "completed", {"score": 0.5, "size": 2048})]


def test_a_restart_finishes_the_journals_work_before_asking_for_more(loop):
    # The first process: a's result kept (the API was down), b kept for the operator's fix.
    loop.submission("1", "a", 0.5)
    loop.submission("2", "b", OperatorError("token missing"), 0.75)
    loop.ledger.submit_answers.append(detail(503, "down"))
    loop.submission("1", "c", 0.25)  # new work, which the second process needs not ask for

    assert loop.run(["1", "2"]) == ExitCode.OPERATOR
    assert (loop.entry("1").state, loop.entry("2").state) == (State.SCORED, State.RECEIVED)
    lookups = len(loop.ledger.lookups)

    restarted = loop.clock.now
    assert loop.run(["1", "2"], max_assignments=2) == ExitCode.OK
    assert len(loop.ledger.lookups) == lookups  # none: the journal had the work
    # The kept result went out first thing, before b was scored again.
    taken_a, taken_b = loop.ledger.submits[-2:]
    assert (taken_a.assignment_id, taken_a.at) == ("1", restarted)
    assert taken_b.assignment_id == "2"
    assert [status for _, status, _ in loop.ledger.taken()] == ["completed", "completed"]
    assert [name for name, _ in loop.module.calls] == ["a", "b", "b"]
