"""Lookups whose answer is lost, with the real runner and client against the simulator.

A lookup is not idempotent: one the API processed but whose answer timed out has handed out an
assignment and started the task's rate-limit window. The client must not ask again at once; the
runner pauses --time-sleep, keeps the per-task lookup interval, and goes on with the next
submission once the API answers in time. The runner runs in this process because the CLI's read
timeout (60 s) is too long to provoke here.
"""

from __future__ import annotations

import threading

from modules.fixture import MODULE as FIXTURE_MODULE

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import wait_for
from tests.faults.figures import record
from tests.faults.ledger import LOOKUP, UPDATE, Ledger, journal_rows
from validator.errors import ExitCode
from validator.ledger.client import FedLedgerClient
from validator.observe.observer import Observer
from validator.runner import LoopSettings, Runner
from validator.scoring import ModulePool
from validator.state.journal import Journal

READ_TIMEOUT = 0.2
DELAY = 0.6  # longer than READ_TIMEOUT: the API answers after the client gave up
TIME_SLEEP = 1.0
LOOKUP_INTERVAL = 0.5
# The simulator stamps a request when its handler starts on it, so on a busy machine an earlier
# request can be stamped late by a scheduling delay and a gap read short by as much; a runner
# that did not pause would show gaps near READ_TIMEOUT (or 0), far below either bound minus this.
SLACK = 0.2
TIMED_OUT = 2
ASSIGNMENTS = 2


def test_timed_out_lookups_are_sent_once_then_the_loop_pauses(tmp_path):
    tasks = [task(1, [f"ok/{name}" for name in "abcde"])]
    fault = {"endpoint": "request", "kind": "delay", "delay_seconds": DELAY, "count": TIMED_OUT}
    (tmp_path / "configs").mkdir()
    with Simulator({"tasks": tasks}, tmp_path, faults=[fault]) as sim:
        # Retries as generous as the CLI's default: none may be spent on a timed-out lookup.
        client = FedLedgerClient("k", sim.api_url, timeout=(5.0, READ_TIMEOUT), backoff=0.01)
        journal = Journal(tmp_path / "state", min_free_mb=0)
        pool = ModulePool(FIXTURE_MODULE, "fixture", tmp_path / "configs")
        settings = LoopSettings(["1"], TIME_SLEEP, LOOKUP_INTERVAL, ASSIGNMENTS)
        stop = threading.Event()
        watchdog = threading.Timer(30, stop.set)  # a loop that never reaches the limit stops
        watchdog.start()
        try:
            observer = Observer(tmp_path / "state", "fixture", records_keep=100)
            code = Runner(settings, client, journal, pool, stop, observer).run()
        finally:
            watchdog.cancel()
        assert not stop.is_set(), "the loop did not finish its assignments in 30 s"
        journal.close()
        client.close()
        wait_for(lambda: sim.state()["in_flight"] == 0, 10, "the delayed lookups to end")
        ledger = Ledger.of(sim)

    assert code == ExitCode.OK
    lookups = ledger.api_requests(LOOKUP)
    # Each timed-out call was one request: no retry of it, and it was answered 200 (processed).
    assert [(r["status"], r["fault"]) for r in lookups] == [(200, "delay")] * TIMED_OUT + [
        (200, None)
    ] * ASSIGNMENTS
    # When the API received each lookup (not when it answered: a delayed answer, or a loaded
    # machine, moves that later).
    received = [r["received"] for r in lookups]
    gaps = [b - a for a, b in zip(received, received[1:], strict=False)]
    # After a timeout the runner paused --time-sleep; the task's lookup interval always held.
    assert all(gap >= READ_TIMEOUT + TIME_SLEEP - SLACK for gap in gaps[:TIMED_OUT]), gaps
    assert all(gap >= LOOKUP_INTERVAL - SLACK for gap in gaps), gaps
    # The assignments of the lost answers stay validating until they expire (nothing can tell
    # the validator about them); the loop went on with the next submissions, submitted once.
    statuses = {aid: a["status"] for aid, a in ledger.assignments.items()}
    lost = [str(n) for n in range(1, TIMED_OUT + 1)]
    assert [statuses.pop(aid) for aid in lost] == ["validating"] * TIMED_OUT
    assert set(statuses.values()) == {"completed"}
    assert ledger.doubles() == []
    assert sorted(ledger.accepted()) == sorted(statuses)
    assert len(ledger.api_requests(UPDATE)) == ASSIGNMENTS
    rows = journal_rows(tmp_path / "state")
    assert set(rows) == set(statuses) and {r["state"] for r in rows.values()} == {"submitted"}
    record(
        f"API lookup answer lost (read timeout) x{TIMED_OUT}",
        f"{len(lookups)} lookups for {TIMED_OUT + ASSIGNMENTS} calls (0 retried), "
        f"pauses >= {TIME_SLEEP:g} s, {TIMED_OUT} assignments left to expire, "
        f"{ASSIGNMENTS} submitted once",
    )
