"""One bad task never stalls the others: a task id the Fed Ledger does not know (a typo, not in
its list at start-up; or a task that ended while the validator runs) is set aside once the API
has answered two of its lookups in a row with its own 404 `Task not found`, with one warning,
shown on the status page and as a metric, and looked up again hourly, while the other tasks go
on at their own interval (validator/lookups.py)."""

from __future__ import annotations

import re
import signal

from prometheus_client.parser import text_string_to_metric_families

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import loop_args, start_validator, validator_env, wait_for
from tests.test_status_page import LISTENING, get
from validator.lookups import SET_ASIDE_RECHECK_S, TaskSchedule


def metric(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def test_unknown_and_ended_tasks_are_set_aside_and_the_others_go_on(tmp_path):
    tasks = [task(7, ["ok/a"]), task(8, ["ok/b"])]
    with Simulator({"tasks": tasks}, tmp_path) as sim:
        args = loop_args("fixture", sim.api_url, "99,7,8", "--http-port", "0")
        log = tmp_path / "validator.log"
        process = start_validator(args, validator_env(tmp_path), log)
        try:
            base = wait_for(lambda: LISTENING.search(log.read_text()), 30, "the status page")
            wait_for(lambda: len(sim.submissions()) == 2, 60, "tasks 7 and 8 scored")
            sim.end_task(8)  # the task ends while the validator runs: its lookups answer 404
            wait_for(lambda: len(sim.lookups(99)) == 2, 30, "task 99 asked twice")
            wait_for(lambda: [lk for lk in sim.lookups(8) if lk["status"] == 404][1:], 30, "404s")
            sim.add_submission(7, {"hg_repo_id": "ok/c"})
            wait_for(lambda: len(sim.submissions()) == 3, 60, "task 7 going on")
            # Task 7 keeps being looked up meanwhile; task 8 is not asked again.
            count = len(sim.lookups(7))
            wait_for(lambda: len(sim.lookups(7)) >= count + 3, 30, "more lookups of task 7")
            page = get(base.group(1) + "/")[1]
            metrics = get(base.group(1) + "/metrics")[1]
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
        # Not listed at start-up, then the API's own word twice: set aside, not asked again.
        assert [lk["status"] for lk in sim.lookups(99)] == [404, 404]
        assert [lk["status"] for lk in sim.lookups(8)][-2:] == [404, 404]
        assert sum(lk["status"] == 404 for lk in sim.lookups(8)) == 2
    text = log.read_text()
    warnings = [line for line in text.splitlines() if " WARNING " in line]
    assert len([w for w in warnings if "task 99: not in the Fed Ledger's task list" in w]) == 1
    for task_id in ("99", "8"):
        told = [w for w in warnings if re.search(rf"task {task_id}: .*404: Task not found", w)]
        assert len(told) == 2 and "set aside if the API says so again" in told[0], told
        assert "set aside, looked up again every 60 min" in told[1], told
    assert all("set aside" in w for w in warnings), warnings
    assert "data-task='99'" in page and "data-task='8'" in page and "data-task='7'" not in page
    aside = "flock_validator_task_set_aside"
    assert [metric(metrics, aside, task=t) for t in ("99", "7", "8")] == [1, 0, 1]
    lookups = "flock_validator_lookups_total"
    assert metric(metrics, lookups, task="8", answer="unknown_task") == 2


def test_a_task_set_aside_is_asked_again_after_the_recheck_and_can_come_back():
    schedule = TaskSchedule(["99", "7"], interval=180)
    margin = schedule.margin
    assert schedule.set_aside("99", "not known", since=0.0, at=1000.0)
    assert not schedule.set_aside("99", "still not known", since=0.0, at=1000.0)  # told once
    assert schedule.due(1000.0) == "7"
    schedule.answered("7", 1000.0)
    assert schedule.due(1000.0 + 180) is None  # the margin for the server's clock
    assert schedule.due(1000.0 + 180 + margin) == "7"
    schedule.answered("7", 1181.0)
    recheck = 1000.0 + SET_ASIDE_RECHECK_S + margin
    assert schedule.due(recheck - 1) == "7"
    schedule.answered("7", recheck - 1)
    assert schedule.due(recheck) == "99"
    assert schedule.restore("99").reason == "not known"
    assert schedule.restore("99") is None and schedule.aside == {}
