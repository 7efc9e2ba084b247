"""The pace of lookups as the Fed Ledger sees it (validator/lookups.py), in this process: the
real runner against a fake Fed Ledger that enforces the API's rate limit on when it received
each lookup, over a network whose travel moves the runner's clock (tests/helpers/loop.py).

- The rate limit as the server counts it: every gap the API sees between two lookups of a task
  is at least the interval, whatever the travel time; an interval shorter than the API's window
  meets one 429, then the window; a 429 costs the rest of the window, not a second interval.
- A flaky minute costs a minute: only the API's own `Task not found`, twice in a row, sets a
  task aside; a generic 404, a 5xx or a partial task list at start-up make it wait a little.
"""

from __future__ import annotations

import logging

import pytest

from tests.helpers.fake_ledger import NOTHING, Reply, detail
from validator.errors import ExitCode
from validator.ledger.answers import RATE_LIMIT_WINDOW_S, UNKNOWN_TASK
from validator.lookups import SET_ASIDE_RECHECK_S, TaskSchedule
from validator.observe.hooks import Middleware

HOUR = 3600.0
# Seconds on the way to the API and back, lookup after lookup: what makes a gap measured
# between two sends differ from the gap the API sees.
JITTER = [(0.4, 0.1), (0.05, 0.3), (0.2, 0.2), (0.01, 0.02)]


def received(loop, task_id: str, *, counted: bool = False) -> list[float]:
    """When the API received each lookup of `task_id` (its clock is the runner's); with
    `counted`, only those it counted (not refused by its rate limit)."""
    return [
        lookup.at
        for lookup in loop.ledger.lookups
        if lookup.task_id == task_id and not (counted and lookup.answer == "rate_limited")
    ]


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def answers(loop) -> list[str]:
    return [lookup.answer for lookup in loop.ledger.lookups]


class Aside(Middleware):
    """The tasks the runner told its hooks it set aside (the status page, the metric)."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str | None]] = []

    def on_task_aside(self, task_id: str, reason: str | None) -> None:
        self.told.append((task_id, reason))


# --- the rate limit as the server counts it -----------------------------------------------


@pytest.mark.parametrize("interval", [RATE_LIMIT_WINDOW_S, 240.0])
def test_the_api_sees_each_task_no_sooner_than_the_interval_whatever_the_travel(loop, interval):
    # A next lookup timed from when the last was sent lets the API see 179.99 s when the last
    # took longer to arrive than the next, and answer 429.
    loop.lookup_interval = interval
    loop.ledger.window = RATE_LIMIT_WINDOW_S
    loop.ledger.travel = list(JITTER)
    tasks = [str(n) for n in range(1, 8)]

    assert loop.run(tasks, horizon=HOUR) == ExitCode.OK
    assert "rate_limited" not in answers(loop)
    for task_id in tasks:
        seen = gaps(received(loop, task_id))
        assert len(seen) >= int(HOUR / (interval + 2)) - 1, seen
        assert min(seen) >= interval, seen
        # No more than the interval and its margin, and what the travel varies (0.7 s).
        assert max(seen) <= interval + TaskSchedule([], interval).margin + 0.75, seen


def test_an_interval_shorter_than_the_window_meets_one_429_then_keeps_the_window(loop, caplog):
    loop.lookup_interval = 60.0
    loop.ledger.window = RATE_LIMIT_WINDOW_S
    loop.ledger.travel = list(JITTER)

    assert loop.run(["1", "2", "3"], horizon=HOUR) == ExitCode.OK
    assert answers(loop).count("rate_limited") == 1
    refused = answers(loop).index("rate_limited")
    task_id = loop.ledger.lookups[refused].task_id
    times = received(loop, task_id)
    # The refusal cost the rest of the window its task's last lookup began, not an interval
    # from the refusal: the next one came once the window (and its margin) had passed.
    counted, after = times[0], times[2]
    assert RATE_LIMIT_WINDOW_S <= after - counted <= RATE_LIMIT_WINDOW_S + 1.5
    for each in ("1", "2", "3"):  # the others kept the window without meeting a 429
        assert min(gaps(received(loop, each, counted=True))[1:]) >= RATE_LIMIT_WINDOW_S
    told = [r.getMessage() for r in caplog.records if "window is longer" in r.getMessage()]
    assert len(told) == 1 and "looked up every 180s" in told[0], told


# --- a flaky minute costs a minute ---------------------------------------------------------


GENERIC_404 = detail(404, "Not Found")  # FastAPI's answer to a path it has no route for


@pytest.mark.parametrize(
    "flaky",
    [GENERIC_404, detail(500, "Internal Server Error"), Reply(502, "<html>Bad Gateway</html>")],
    ids=["generic-404", "500", "502-page"],
)
def test_a_flaky_round_of_lookups_costs_each_task_one_wait(loop, flaky):
    tasks = [str(n) for n in range(1, 21)]
    loop.ledger.lookup_answers.extend([flaky] * len(tasks))  # the first round, all of it
    aside = Aside()

    assert loop.run(tasks, horizon=HOUR, hooks=[aside]) == ExitCode.OK
    assert aside.told == []
    wait = max(loop.time_sleep, loop.lookup_interval)
    for task_id in tasks:
        times = received(loop, task_id)
        # Back after --time-sleep (or the interval), then at the interval: about 20 in the
        # hour, as if the minute had not been flaky (it set each aside for an hour: 1).
        assert times[1] - times[0] == wait + TaskSchedule([], wait).margin
        assert len(times) >= 19, (task_id, len(times))


def test_a_partial_task_list_at_start_sets_nothing_aside(loop, caplog):
    tasks = [str(n) for n in range(1, 21)]
    listed = [{"id": int(t), "task_type": "training"} for t in tasks[:5]]
    loop.ledger.tasks_answer = Reply(200, listed)
    aside = Aside()

    assert loop.run(tasks, horizon=HOUR, hooks=[aside]) == ExitCode.OK
    assert aside.told == []
    for task_id in tasks:
        assert len(received(loop, task_id)) >= 19, task_id
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("not in the Fed Ledger's task list" in w for w in warned) == 15
    assert all("looked up all the same" in w for w in warned if "task list" in w)


def test_task_not_found_once_is_asked_again_twice_in_a_row_sets_it_aside(loop, caplog):
    # Task 1: the API says once it does not know it, then answers for it again. Task 2: the API
    # says so every time (a typo, a task that ended): set aside at the second, asked hourly.
    caplog.set_level(logging.INFO)
    loop.ledger.unknown.add("2")
    once = detail(404, UNKNOWN_TASK)
    loop.ledger.lookup_answers.append(once)
    aside = Aside()

    assert loop.run(["1", "2"], horizon=2 * HOUR, hooks=[aside]) == ExitCode.OK
    assert [task_id for task_id, _ in aside.told] == ["2"]
    assert aside.told[0][1] == f"the Fed Ledger answers HTTP 404: {UNKNOWN_TASK}"
    first = [lookup.answer for lookup in loop.ledger.lookups if lookup.task_id == "1"]
    assert first[0] == "unknown_task" and set(first[1:]) == {"no_submissions"}
    assert len(first) >= 2 * 19
    second = received(loop, "2")
    wait = max(loop.time_sleep, loop.lookup_interval)
    assert gaps(second)[0] == wait + TaskSchedule([], wait).margin
    assert gaps(second)[1:] == [SET_ASIDE_RECHECK_S + TaskSchedule([], wait).margin] * (
        len(second) - 2
    )
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("set aside if the API says so again" in w for w in warned) == 2
    assert sum("set aside, looked up again every 60 min" in w for w in warned) == 1


def test_a_task_set_aside_comes_back_when_the_api_answers_for_it(loop):
    loop.ledger.unknown.add("1")
    aside = Aside()

    def comes_back(fake):
        fake.unknown.discard("1")
        return NOTHING

    # Two "Task not found", then the task is known again by its hourly recheck.
    loop.ledger.lookup_answers.extend([detail(404, UNKNOWN_TASK)] * 2 + [comes_back])
    assert loop.run(["1"], horizon=2 * HOUR, hooks=[aside]) == ExitCode.OK
    assert aside.told == [("1", f"the Fed Ledger answers HTTP 404: {UNKNOWN_TASK}"), ("1", None)]
    times = received(loop, "1")
    assert times[2] - times[1] == SET_ASIDE_RECHECK_S + TaskSchedule([], 180).margin
    assert len(times) >= 3 + 10  # at the interval again once back
