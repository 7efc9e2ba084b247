"""Which module a listed task belongs to: its `task_type` in the Fed Ledger's task list against
the type each module's spec declares (modules/<name>/module.yaml, `task_type`). The validator
at start and both doctors judge the task ids with `judge_task_types`, the same code.

A task whose type is another module's is refused, naming the command that validates it: its
trainers' honest submissions would otherwise be scored by a module that cannot read them and
submitted as failed. While a module's own type is not known, the names the network's code gives
its tasks stand for it. A type no module declares is a warning (a type the network added, a
rename): the task is looked up all the same.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from validator.errors import OperatorError, TransientError
from validator.ledger.answers import Task
from validator.spec import ModuleSpec
from validator.text import one_line, quoted

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TypeVerdicts:
    """What the task list says of the task ids, for module `module`."""

    module: str
    fit: tuple[str, ...] = ()  # listed with a type of this module's
    unlisted: tuple[str, ...] = ()  # not in the list: no type to check
    warnings: tuple[str, ...] = ()  # one line each: a type no module declares, or none listed
    # the modules whose type it is -> (task id, its type) of each task listed with one
    others: dict[tuple[str, ...], list[tuple[str, str]]] = field(default_factory=dict)

    def refusal(self) -> str | None:
        """The one line that stops the start, naming each task of another module's type and
        the command that validates it; None when there is none."""
        if not self.others:
            return None
        parts = [self._part(owners, tasks) for owners, tasks in self.others.items()]
        them = "it" if sum(len(tasks) for tasks in self.others.values()) == 1 else "them"
        return one_line(f"{'; '.join(parts)}; leave {them} out of {self.module}'s --task_ids")

    def _part(self, owners: tuple[str, ...], tasks: list[tuple[str, str]]) -> str:
        ids = [task_id for task_id, _ in tasks]
        types = list(dict.fromkeys(quoted(task_type) for _, task_type in tasks))
        commands = " or ".join(f"python run.py {o} --task_ids {','.join(ids)}" for o in owners)
        subject = f"task {ids[0]} has" if len(ids) == 1 else f"tasks {', '.join(ids)} have"
        return (
            f"{subject} type{'s' if len(types) > 1 else ''} {', '.join(types)}, the "
            f"{' or '.join(owners)} module's, not {self.module}'s: validate "
            f"{'it' if len(ids) == 1 else 'them'} with {commands}"
        )


def judge_task_types(
    tasks: Iterable[Task],
    task_ids: Sequence[str],
    spec: ModuleSpec,
    modules: Mapping[str, ModuleSpec],
) -> TypeVerdicts:
    """The verdict on each of `task_ids` from the listed `tasks`, for the module of `spec`;
    `modules`: every module's spec (the others' declared types)."""
    listed = {task.id: task.task_type for task in tasks}
    own = spec.task_type_names()
    others = {name: other for name, other in modules.items() if name != spec.name}
    fit, unlisted, warnings = [], [], []
    wrong: dict[tuple[str, ...], list[tuple[str, str]]] = {}
    for task_id in task_ids:
        if task_id not in listed:
            unlisted.append(task_id)
            continue
        task_type = listed[task_id]
        if not task_type:
            warnings.append(f"task {task_id} is listed without a type: not checked")
        elif task_type in own:
            fit.append(task_id)
        elif owners := _owners(task_type, others):
            wrong.setdefault(owners, []).append((task_id, task_type))
        else:
            warnings.append(_undeclared(task_id, task_type, spec))
    return TypeVerdicts(spec.name, tuple(fit), tuple(unlisted), tuple(warnings), wrong)


def _owners(task_type: str, others: Mapping[str, ModuleSpec]) -> tuple[str, ...]:
    """The modules whose declared type `task_type` is; else those whose names for a type not
    yet known include it."""
    declared = tuple(sorted(n for n, s in others.items() if s.task_type == task_type))
    return declared or tuple(
        sorted(n for n, s in others.items() if task_type in s.task_type_names())
    )


def _undeclared(task_id: str, task_type: str, spec: ModuleSpec) -> str:
    mine = (
        f"{spec.name}'s tasks are {quoted(spec.task_type)}"
        if isinstance(spec.task_type, str)
        else f"{spec.name}'s own type is not yet known"
    )
    return one_line(
        f"task {task_id} has type {quoted(task_type)}, which no module declares ({mine}): "
        f"looked up all the same; check that it is a {spec.name} task"
    )


def check_task_types_at_start(
    list_tasks: Callable[[], list[Task]],
    task_ids: Sequence[str],
    spec: ModuleSpec,
    modules: Mapping[str, ModuleSpec],
    stop: threading.Event,
    wait_s: float,
) -> list[Task] | None:
    """Before the first lookup: OperatorError (exit 3, one line) when a task's type is another
    module's; a warning for a type no module declares. While the list cannot be had, no task
    is looked up: asked again every `wait_s` until it answers or `stop` is set (an operator
    who named the wrong module would otherwise have its tasks scored in the meantime). The
    list, for the lookups' own start-up look (validator/lookups.py); None once stopped."""
    while True:
        try:
            tasks = list_tasks()
            break
        except TransientError as exc:
            log.warning(
                "could not list tasks (%s): no task is looked up before its type is checked; "
                "asking again in %gs", exc, wait_s,
            )  # fmt: skip
            if stop.wait(wait_s):
                return None
    verdicts = judge_task_types(tasks, task_ids, spec, modules)
    refusal = verdicts.refusal()
    if refusal is not None:
        raise OperatorError(refusal)
    for warning in verdicts.warnings:
        log.warning("%s", warning)
    if verdicts.fit:
        log.info("task types: %s listed as %s tasks", ", ".join(verdicts.fit), spec.name)
    return tasks
