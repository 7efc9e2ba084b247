"""The loop's lookups (validator/runner.py takes what they hand out): which task is asked next,
and what its answer means for the next one.

Round robin: each task at most once per lookup interval, whatever it answered. A task the Fed
Ledger does not know (not in its task list at start-up, or a lookup answered with the API's 404:
a typo in --task_ids, a task that ended) is set aside, with one warning: asked again only every
SET_ASIDE_RECHECK_S, while the other tasks go on at their own interval, and back in turn once it
is answered as a task again. A task whose lookup got an answer the client does not know waits
--time-sleep before its next one; the others do not wait with it. Only an API that cannot be
reached pauses every task. Lookups that find nothing to do are logged when their answer changes,
not every round.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass

from validator.clock import Clock
from validator.errors import TransientError
from validator.ledger.answers import ApiUnavailable, Assignment, LookupAnswer
from validator.ledger.client import FedLedgerClient
from validator.observe.hooks import Hooks

log = logging.getLogger(__name__)

# How often a task set aside is asked again (a task listed late, an id that comes back).
SET_ASIDE_RECHECK_S = 3600.0
NOT_LISTED = "not in the Fed Ledger's task list"


@dataclass(frozen=True)
class SetAside:
    reason: str
    since: float


class TaskSchedule:
    """The tasks' next lookup times, and the tasks set aside with why."""

    def __init__(self, task_ids: list[str], interval: float) -> None:
        self.interval = interval
        self._order = deque(task_ids)
        self._next = dict.fromkeys(task_ids, 0.0)
        self.aside: dict[str, SetAside] = {}

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

    def wait(self, task_id: str, now: float, seconds: float) -> None:
        """No lookup of `task_id` before `seconds` from `now` (the interval at least)."""
        self._next[task_id] = now + max(seconds, self.interval)

    def set_aside(self, task_id: str, reason: str, now: float) -> bool:
        """Sets `task_id` aside until its recheck; True when it was not aside already."""
        new = task_id not in self.aside
        if new:
            self.aside[task_id] = SetAside(reason, now)
        self.wait(task_id, now, SET_ASIDE_RECHECK_S)
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

    def check_listed(self) -> None:
        """At start-up: the task ids the API does not list are set aside (their types are
        checked before, validator/ledger/task_types.py). A list the API cannot give, or an
        empty one, sets nothing aside: the lookups then tell."""
        try:
            tasks = {task.id: task for task in self.client.list_tasks()}
        except TransientError as exc:
            log.warning("could not list tasks (%s); going on", exc)
            return
        if not tasks:
            log.warning("the Fed Ledger lists no tasks; looking up %s all the same", self.task_ids)
            return
        for task_id in self.task_ids:
            if task_id not in tasks:
                self._set_aside(task_id, NOT_LISTED)

    def due(self) -> str | None:
        return self.schedule.due(self.clock.time())

    def next_due(self) -> float:
        return self.schedule.next_due()

    def lookup(self, task_id: str) -> Assignment | None:
        """Looks `task_id` up; the assignment handed out, or None."""
        now = self.clock.time()
        self.schedule.wait(task_id, now, self.schedule.interval)
        started = self.clock.monotonic()
        try:
            result = self.client.request_assignment(task_id)
        except ApiUnavailable as exc:
            self.hooks.after_lookup(task_id, "unavailable", self.clock.monotonic() - started, None)
            # Every task asks the same API: all of them wait.
            log.warning(
                "task %s: Fed Ledger unavailable (%s); sleeping %gs", task_id, exc, self.time_sleep
            )
            self.clock.wait(self.stop, self.time_sleep)
            return None
        took = self.clock.monotonic() - started
        if isinstance(result, Assignment):
            self.hooks.after_lookup(task_id, "assignment", took, result.id)
            self._restore(task_id)
            self._last[task_id] = "assignment"
            return result
        self.hooks.after_lookup(task_id, result.kind, took, None)
        if result.kind == "unknown_task":
            answer = f"the Fed Ledger answers HTTP {result.status}: {result.detail}"
            self._set_aside(task_id, answer)
            return None
        self._restore(task_id)
        if result.kind == "unexpected":
            self.schedule.wait(task_id, self.clock.time(), self.time_sleep)
            log.warning(
                "task %s: unexpected answer HTTP %s: %s; its next lookup in %gs",
                task_id,
                result.status,
                result.detail,
                max(self.time_sleep, self.schedule.interval),
            )
        else:
            changed = self._last.get(task_id) != result.kind
            log.log(
                logging.INFO if changed else logging.DEBUG,
                "task %s: %s; next lookup in %gs (said again when this answer changes)",
                task_id,
                result.detail,
                self.schedule.interval,
            )
        self._last[task_id] = result.kind
        return None

    def _set_aside(self, task_id: str, reason: str) -> None:
        if self.schedule.set_aside(task_id, reason, self.clock.time()):
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

    def _restore(self, task_id: str) -> None:
        if self.schedule.restore(task_id) is not None:
            log.info("task %s: the Fed Ledger answers for it again; back in turn", task_id)
            self.hooks.on_task_aside(task_id, None)
