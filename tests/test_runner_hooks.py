"""The hooks around the runner's steps (validator/observe/hooks.py), in this process: each hook
reaches every middleware in order, and a middleware that raises changes nothing of what happens
to an assignment (it is logged once per hook, and the loop goes on as without it)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.helpers.fake_ledger import Reply, Unreachable, detail
from tests.helpers.loop import Loop
from validator.errors import ExitCode, TransientError
from validator.observe.hooks import HOOKS, Hooks, Middleware
from validator.observe.observer import Observer
from validator.runner import Interrupted
from validator.scope import current_scope
from validator.state.records import RecordStore


class Trace(Middleware):
    """Every hook call, by name, with the assignment's id when it has one."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        if name not in HOOKS:
            return super().__getattribute__(name)

        def record(*args: Any) -> None:
            entry = args[0] if args and hasattr(args[0], "id") else None
            self.calls.append(name if entry is None else f"{name} {entry.id}")

        return record


class Raising(Trace):
    """Records each call, then raises: an observer with a bug in every hook."""

    def __getattribute__(self, name: str) -> Any:
        if name not in HOOKS:
            return super().__getattribute__(name)
        record = super().__getattribute__(name)

        def fail(*args: Any) -> None:
            record(*args)
            raise RuntimeError(f"observer bug in {name}")

        return fail


def loaded_and_beating() -> float:
    """A scoring with host work (a phase) and a heartbeat, as modules do."""
    scope = current_scope()
    with scope.host_work("load"):
        scope.heartbeat()
    return 0.5


def walk(loop: Loop, *middleware: Middleware) -> ExitCode:
    """Every hook point: a task the API does not know (set aside), a lookup the API cannot
    answer, an attempt that meets a transient fault, phases and beats, a submit kept, then
    taken, a failed submission, a pass at rest."""
    loop.ledger.tasks_answer = Reply(200, [{"id": 1, "task_type": "training"}])
    loop.ledger.unknown.add("9")
    loop.ledger.lookup_answers.append(Unreachable("POST lookup: HTTP 503"))
    loop.submission("1", "a", TransientError("hub answered 503"), loaded_and_beating)
    loop.submission("1", "b", ValueError("not a model"))
    loop.ledger.submit_answers.append(detail(503, "down"))
    return loop.run(["1", "9"], max_assignments=2, hooks=middleware)


def outcome(loop: Loop) -> dict[str, Any]:
    """What happened, as the API and the journal know it (times on the runner's clock, from its
    start)."""
    start = loop.ledger.lookups[0].at
    entries = {aid: loop.entry(aid) for aid in ("1", "2")}
    return {
        "lookups": [(lu.at - start, lu.task_id, lu.answer) for lu in loop.ledger.lookups],
        "submits": [
            (s.at - start, s.assignment_id, s.status, s.metrics, s.answer)
            for s in loop.ledger.submits
        ],
        "rows": {
            aid: (
                e.state,
                e.outcome,
                e.attempts,
                e.error,
                e.metrics,
                e.not_before and e.not_before - start,
            )
            for aid, e in entries.items()
        },
        "events": {aid: loop.events(aid) for aid in entries},
        "records": sorted(
            (r.id, r.outcome, r.attempts, r.reason) for r in RecordStore(loop.state_dir).read_all()
        ),
    }


def test_each_hook_reaches_every_middleware_in_order(loop):
    first, second = Trace(), Trace()
    assert walk(loop, first, second) == ExitCode.OK

    assert first.calls == second.calls
    assert set(HOOKS) == {call.split()[0] for call in first.calls}  # every hook was reached
    assert [c for c in first.calls if c.endswith(" 1")] == [
        "before_attempt 1",
        "after_score 1",  # the transient fault
        "after_attempt 1",
        "before_attempt 1",
        "after_score 1",
        "after_submit 1",  # kept: the API was down
        "after_attempt 1",
        "after_submit 1",  # taken by a later pass
        "after_finish 1",
    ]


def test_a_middleware_that_raises_in_every_hook_changes_nothing(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    runs: dict[str, Any] = {}
    for name, raising in (("quiet", None), ("raising", Raising())):
        loop = Loop(tmp_path / name)
        observer = Observer(loop.state_dir, "plan", records_keep=100)
        trace = Trace()
        chain = [observer, trace] if raising is None else [raising, observer, trace]
        try:
            assert walk(loop, *chain) == ExitCode.OK
            runs[name] = (outcome(loop), trace.calls, observer.status.recent)
        finally:
            loop.close()
        if raising is not None:
            raised = raising.calls

    quiet, noisy = runs["quiet"], runs["raising"]
    # The same lookups and submits, at the same moments, the same journal and records; the
    # middleware after the raising one heard every call, and the status board the same.
    assert noisy[0] == quiet[0]
    assert [s[1:] for s in quiet[0]["submits"]] == [
        ("1", "completed", {"score": 0.5, "size": 0}, "ApiUnavailable"),
        ("1", "completed", {"score": 0.5, "size": 0}, "accepted"),
        ("2", "failed", None, "accepted"),
    ]
    assert noisy[1] == quiet[1] == raised
    assert [row["id"] for row in noisy[2]] == [row["id"] for row in quiet[2]] == ["2", "1"]
    # Logged once per hook, with its traceback, though most hooks failed more than once.
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "middleware" in r.msg]
    assert sorted(r.args[1] for r in errors) == sorted(HOOKS)
    assert all(r.args[0] == "Raising" and r.exc_info for r in errors)
    assert len(raised) > len(HOOKS)
    again = [r for r in caplog.records if r.levelno == logging.DEBUG and "failed again" in r.msg]
    assert len(again) == len(raised) - len(HOOKS)


def test_a_stop_raised_in_a_hook_is_not_swallowed(loop):
    class SecondSignal(Middleware):
        def before_attempt(self, entry) -> None:
            raise Interrupted()  # a second stop signal lands while a hook runs

    loop.submission("1", "a", 0.5)
    with pytest.raises(Interrupted):
        loop.run(max_assignments=1, hooks=[SecondSignal()])
    assert loop.ledger.submits == []


def test_hooks_are_the_middlewares_methods_each_emitted_by_name():
    assert HOOKS == (
        "before_pass",
        "after_lookup",
        "on_task_aside",
        "before_attempt",
        "on_phase",
        "on_beat",
        "after_score",
        "after_submit",
        "after_finish",
        "after_attempt",
    )
    trace = Trace()
    hooks = Hooks(trace)
    for hook in HOOKS:
        assert getattr(Hooks, hook).__name__ == hook
    hooks.after_lookup("1", "no_submissions", 0.1, None)
    hooks.emit("on_beat")
    assert trace.calls == ["after_lookup", "on_beat"]
