"""The points at which the loop can be observed, as dramatiq's middleware: validator/runner.py
calls one hook list at fixed points of an assignment's walk, and each observer (the metrics,
the per-assignment records, the status page: validator/observe/observer.py) is a middleware
that implements the hooks it cares about. Hooks tell; none decides anything or changes an entry.

| hook            | when                                                                    |
|-----------------|-------------------------------------------------------------------------|
| before_pass     | a pass of the loop begins, with the journal's backlog                   |
| after_lookup    | a lookup was answered (or the API was unavailable)                      |
| on_task_aside   | a task was set aside (the API does not know it); reason None: it is back |
| before_attempt  | an attempt at scoring begins (the journal counted it)                   |
| on_phase        | during the module's work: it entered a phase (validator/state/phases.py)|
| on_beat         | during the module's work: it is alive (a download's progress, say)      |
| after_score     | the module's work ended, with a result or an error: seconds per phase   |
| after_submit    | a decided result was sent: taken, dropped as too late, or kept          |
| after_finish    | nothing more will happen to the assignment: submitted or dropped        |
| after_attempt   | the attempt is over (exception: what it raised, the loop then ends)     |
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from validator.state.entry import Entry


class Middleware:
    """Every hook, doing nothing: a middleware overrides the ones it cares about."""

    def before_pass(self, undecided: int, unsubmitted: int) -> None:
        pass

    def after_lookup(
        self, task_id: str, answer: str, seconds: float, assignment_id: str | None
    ) -> None:
        pass

    def on_task_aside(self, task_id: str, reason: str | None) -> None:
        pass

    def before_attempt(self, entry: Entry) -> None:
        pass

    def on_phase(self, phase: str) -> None:
        pass

    def on_beat(self) -> None:
        pass

    def after_score(self, entry: Entry, phases: dict[str, float], commit: str | None) -> None:
        pass

    def after_submit(self, entry: Entry, seconds: float) -> None:
        pass

    def after_finish(self, entry: Entry) -> None:
        pass

    def after_attempt(self, entry: Entry, exception: BaseException | None = None) -> None:
        pass


class Hooks(Middleware):
    """The middleware list the runner calls: each hook reaches every middleware, in order."""

    def __init__(self, *middleware: Middleware) -> None:
        self.middleware = middleware

    def before_pass(self, undecided: int, unsubmitted: int) -> None:
        for each in self.middleware:
            each.before_pass(undecided, unsubmitted)

    def after_lookup(
        self, task_id: str, answer: str, seconds: float, assignment_id: str | None
    ) -> None:
        for each in self.middleware:
            each.after_lookup(task_id, answer, seconds, assignment_id)

    def on_task_aside(self, task_id: str, reason: str | None) -> None:
        for each in self.middleware:
            each.on_task_aside(task_id, reason)

    def before_attempt(self, entry: Entry) -> None:
        for each in self.middleware:
            each.before_attempt(entry)

    def on_phase(self, phase: str) -> None:
        for each in self.middleware:
            each.on_phase(phase)

    def on_beat(self) -> None:
        for each in self.middleware:
            each.on_beat()

    def after_score(self, entry: Entry, phases: dict[str, float], commit: str | None) -> None:
        for each in self.middleware:
            each.after_score(entry, phases, commit)

    def after_submit(self, entry: Entry, seconds: float) -> None:
        for each in self.middleware:
            each.after_submit(entry, seconds)

    def after_finish(self, entry: Entry) -> None:
        for each in self.middleware:
            each.after_finish(entry)

    def after_attempt(self, entry: Entry, exception: BaseException | None = None) -> None:
        for each in self.middleware:
            each.after_attempt(entry, exception)
