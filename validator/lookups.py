"""The loop's lookups (validator/runner.py takes what they hand out): which task is asked next,
and what its answer means for the next one.

Round robin: each task at most once per lookup interval as the Fed Ledger counts it. The API
stamps a lookup somewhere between its sending and its answer, so a task's next lookup is sent
an interval after the last answer came back (plus a margin for the server's clock), never an
interval after the last was sent. A 429 costs the least wait that respects the API's window: to
the end of the window the task's last counted lookup began, not an interval from the refusal.

A task is set aside only on the API's own word, said twice in a row, that it does not know it
(404 `Task not found`: a typo in --task_ids, a task that ended): asked again only every
SET_ASIDE_RECHECK_S while the other tasks go on, back in turn once it is answered as a task.
Any other answer (a generic 404, a 5xx, a page) makes only that task wait --time-sleep, and a
task the start-up list leaves out is looked up all the same: a flaky minute costs a minute.
Only an API that cannot be reached pauses every task. Lookups that find nothing to do are
logged when their answer changes, not every round.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass

from validator.clock import Clock
from validator.errors import TransientError
from validator.ledger.answers import (
    RATE_LIMIT_WINDOW_S,
    ApiUnavailable,
    Assignment,
    LookupAnswer,
    Refusal,
    Task,
)
from validator.ledger.client import FedLedgerClient
from validator.observe.hooks import Hooks

log = logging.getLogger(__name__)

# How often a task set aside is asked again (a task listed late, an id that comes back).
SET_ASIDE_RECHECK_S = 3600.0
# The API's word that it does not know a task, this many times in a row, sets it aside.
UNKNOWN_TIMES = 2
NOT_LISTED = "not in the Fed Ledger's task list"
# Beyond the interval, for the server's clock (a stamp rounded to the second, another replica's
# clock): 1% of the interval, at most a second.
MARGIN_FRACTION = 0.01
MAX_MARGIN_S = 1.0


@dataclass(frozen=True)
class SetAside:
    reason: str
    since: float  # wall time, for the operator


class TaskSchedule:
    """The tasks' next lookup times, on the loop's monotonic clock, and the tasks set aside."""

    def __init__(self, task_ids: list[str], interval: float) -> None:
        self.interval = interval
        self._order = deque(task_ids)
        self._next = dict.fromkeys(task_ids, float("-inf"))
        # When the answer to each task's last lookup that the API counted came back.
        self._counted: dict[str, float] = {}
        self.aside: dict[str, SetAside] = {}

    @property
    def margin(self) -> float:
        return min(MAX_MARGIN_S, self.interval * MARGIN_FRACTION)

    def due(self, now: float) -> str | None:
        """The next task whose lookup is due, in turn; None when none is."""
        for _ in range(len(self._order)):
            task_id = self._order[0]
            self._order.rotate(-1)
            if self._next[task_id] <= now:
                return task_id
        return None

    def next_due(self) -> float:
        """When the next lookup of any task is due (infinity with no task)."""
        return min(self._next.values(), default=float("inf"))

    def due_in(self, task_id: str, now: float) -> float:
        return max(self._next[task_id] - now, 0.0)

    def answered(self, task_id: str, at: float, wait: float = 0.0) -> None:
        """A lookup of `task_id` answered at `at`, which the API may have counted: the next no
        sooner than the interval (or `wait`, if longer) after it."""
        self._counted[task_id] = at
        self._next[task_id] = at + max(wait, self.interval) + self.margin

    def refused(self, task_id: str, sent: float, at: float) -> bool:
        """A lookup sent at `sent` was refused by the rate limit at `at` (not counted): the next
        when the window surely ended. True when the interval was raised to the API's window."""
        counted = self._counted.get(task_id)
        window = max(self.interval, RATE_LIMIT_WINDOW_S)
        if counted is not None and sent - counted < window:
            # Our own last lookup began the window, which is longer than the interval: every
            # task's, the limit being the same for each.
            raised = self.interval < window
            self.interval = window
            for task, at_counted in self._counted.items():
                self._next[task] = max(self._next[task], at_counted + window + self.margin)
            return raised
        # Another lookup began it (an earlier process's, another validator's on this key): it
        # reached the API before this one did, so the window ends within an interval of now.
        self._next[task_id] = at + self.interval + self.margin
        return False

    def set_aside(self, task_id: str, reason: str, since: float, at: float) -> bool:
        """Sets `task_id` aside until its recheck; True when it was not aside already."""
        new = task_id not in self.aside
        if new:
            self.aside[task_id] = SetAside(reason, since)
        self.answered(task_id, at, SET_ASIDE_RECHECK_S)
        return new

    def restore(self, task_id: str) -> SetAside | None:
        """`task_id` was answered as a task: what it had been set aside for, if it was."""
        return self.aside.pop(task_id, None)


class Lookups:
    """The lookups of one runner: asks the API for the task due, tells the hooks, keeps the
    schedule. A refused key (OperatorError) is raised on, for the runner to stop."""

    def __init__(
        self,
        task_ids: list[str],
        interval: float,
        time_sleep: float,
        client: FedLedgerClient,
        hooks: Hooks,
        stop: threading.Event,
        clock: Clock,
    ) -> None:
        self.task_ids = task_ids
        self.clock = clock
        self.schedule = TaskSchedule(task_ids, interval)
        self.time_sleep = time_sleep
        self.client, self.hooks, self.stop = client, hooks, stop
        self._last: dict[str, LookupAnswer] = {}  # each task's last answer: a change is logged
        self._unknown: dict[str, int] = {}  # "not known" answers in a row, per task

    def check_listed(self, listed: list[Task] | None = None) -> None:
        """At start-up: a warning for each task id the API does not list (looked up all the
        same: a list can be partial for a minute; their types are checked before,
        validator/ledger/task_types.py, which hands its list over as `listed`). A list the
        API cannot give, or an empty one, is only logged: the lookups then tell."""
        try:
            listed = self.client.list_tasks() if listed is None else listed
            tasks = {task.id: task for task in listed}
        except TransientError as exc:
            log.warning("could not list tasks (%s); going on", exc)
            return
        if not tasks:
            log.warning("the Fed Ledger lists no tasks; looking up %s all the same", self.task_ids)
            return
        for task_id in self.task_ids:
            task = tasks.get(task_id)
            if task is None:
                log.warning(
                    "task %s: %s; looked up all the same (set aside if its lookups are answered "
                    "%d times in a row that the API does not know it)",
                    task_id,
                    NOT_LISTED,
                    UNKNOWN_TIMES,
                )

    def due(self) -> str | None:
        return self.schedule.due(self.clock.monotonic())

    def seconds_to_next(self) -> float:
        """Seconds until the next lookup of any task is due (negative: overdue)."""
        return self.schedule.next_due() - self.clock.monotonic()

    def lookup(self, task_id: str) -> Assignment | None:
        """Looks `task_id` up; the assignment handed out, or None."""
        sent = self.clock.monotonic()
        try:
            result = self.client.request_assignment(task_id)
        except ApiUnavailable as exc:
            answered = self.clock.monotonic()
            self.schedule.answered(task_id, answered)
            self.hooks.after_lookup(task_id, "unavailable", answered - sent, None)
            # Every task asks the same API: all of them wait.
            log.warning(
                "task %s: Fed Ledger unavailable (%s); sleeping %gs", task_id, exc, self.time_sleep
            )
            self.clock.wait(self.stop, self.time_sleep)
            return None
        answered = self.clock.monotonic()
        if isinstance(result, Assignment):
            self.schedule.answered(task_id, answered)
            self.hooks.after_lookup(task_id, "assignment", answered - sent, result.id)
            self._known(task_id)
            self._last[task_id] = "assignment"
            return result
        self.hooks.after_lookup(task_id, result.kind, answered - sent, None)
        if result.kind == "unknown_task":
            self._not_known(task_id, result, answered)
        elif result.kind == "unexpected":
            self._unexpected(task_id, result, answered)
        else:
            self._nothing_to_do(task_id, result, sent, answered)
        return None

    def _nothing_to_do(self, task_id: str, result: Refusal, sent: float, answered: float) -> None:
        """No submissions, or the rate limit: the task's next lookup in turn."""
        if result.kind == "rate_limited":
            if self.schedule.refused(task_id, sent, answered):
                log.warning(
                    "task %s: %s; the API's window is longer than --assignment-lookup-interval: "
                    "each task is now looked up every %gs",
                    task_id,
                    result.detail,
                    self.schedule.interval,
                )
        else:
            self.schedule.answered(task_id, answered)
        self._known(task_id)
        changed = self._last.get(task_id) != result.kind
        log.log(
            logging.INFO if changed else logging.DEBUG,
            "task %s: %s; next lookup in %.0fs (said again when this answer changes)",
            task_id,
            result.detail,
            self.schedule.due_in(task_id, answered),
        )
        self._last[task_id] = result.kind

    def _unexpected(self, task_id: str, result: Refusal, answered: float) -> None:
        """An answer that says nothing of the task (a generic 404, a 5xx, a page): only this
        task waits, --time-sleep; it is not set aside."""
        self.schedule.answered(task_id, answered, self.time_sleep)
        log.warning(
            "task %s: unexpected answer HTTP %s: %s; its next lookup in %gs",
            task_id,
            result.status,
            result.detail,
            max(self.time_sleep, self.schedule.interval),
        )
        self._last[task_id] = result.kind

    def _not_known(self, task_id: str, result: Refusal, answered: float) -> None:
        """The API says it does not know the task: set aside when it said so before too."""
        times = self._unknown.get(task_id, 0) + 1
        self._unknown[task_id] = times
        answer = f"the Fed Ledger answers HTTP {result.status}: {result.detail}"
        if times >= UNKNOWN_TIMES:
            self._set_aside(task_id, answer, answered)
            return
        self.schedule.answered(task_id, answered, self.time_sleep)
        log.warning(
            "task %s: %s; asked again in %gs, set aside if the API says so again",
            task_id,
            answer,
            max(self.time_sleep, self.schedule.interval),
        )
        self._last[task_id] = "unknown_task"

    def _set_aside(self, task_id: str, reason: str, answered: float) -> None:
        if self.schedule.set_aside(task_id, reason, self.clock.time(), answered):
            log.warning(
                "task %s: %s; set aside, looked up again every %.0f min while the other tasks "
                "go on",
                task_id,
                reason,
                SET_ASIDE_RECHECK_S / 60,
            )
            self.hooks.on_task_aside(task_id, reason)
        else:
            log.debug("task %s: still set aside: %s", task_id, reason)
        self._last[task_id] = "unknown_task"

    def _known(self, task_id: str) -> None:
        """The API answered for the task as one it knows."""
        self._unknown.pop(task_id, None)
        if self.schedule.restore(task_id) is not None:
            log.info("task %s: the Fed Ledger answers for it again; back in turn", task_id)
            self.hooks.on_task_aside(task_id, None)
