"""The points at which the loop can be observed, as dramatiq's middleware: validator/runner.py
calls one hook list at fixed points of an assignment's walk, and each observer (the metrics,
the per-assignment records, the status page: validator/observe/observer.py) is a middleware
that implements the hooks it cares about. Hooks tell; none decides anything or changes an entry,
and one that raises changes nothing either: it is logged once and skipped (`Hooks.emit`).

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

import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from validator.state.entry import Entry

log = logging.getLogger(__name__)


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
    """The middleware list the runner calls: each hook reaches every middleware, in order,
    through one `emit`. A middleware that raises is skipped for that call and logged, once per
    middleware and hook (a hook that fails on every beat would flood the log): watching the loop
    must never change what happens to an assignment, whatever the observer's bug."""

    def __init__(self, *middleware: Middleware) -> None:
        self.middleware = middleware
        self._failed: set[tuple[int, str]] = set()  # (middleware's index, hook): logged

    def emit(self, hook: str, *args: Any, **kwargs: Any) -> None:
        for index, each in enumerate(self.middleware):
            try:
                getattr(each, hook)(*args, **kwargs)
            except Exception:  # noqa: BLE001 - an observer's bug stays the observer's
                self._failed_once(index, each, hook)

    def _failed_once(self, index: int, middleware: Middleware, hook: str) -> None:
        name = type(middleware).__name__
        if (index, hook) in self._failed:
            log.debug("middleware %s failed again in %s", name, hook, exc_info=True)
            return
        self._failed.add((index, hook))
        log.error(
            "middleware %s failed in %s; the loop goes on without it there (logged once)",
            name,
            hook,
            exc_info=True,
        )


def _emitter(hook: str) -> Callable[..., None]:
    def emit(self: Hooks, *args: Any, **kwargs: Any) -> None:
        self.emit(hook, *args, **kwargs)

    emit.__name__ = emit.__qualname__ = hook
    emit.__doc__ = f"Emits `{hook}` to every middleware (Hooks.emit)."
    return emit


# The hooks are Middleware's public methods, named once there: Hooks emits each by name.
HOOKS = tuple(name for name, value in vars(Middleware).items() if inspect.isfunction(value))
for _hook in HOOKS:
    setattr(Hooks, _hook, _emitter(_hook))
