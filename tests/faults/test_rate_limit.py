"""The API's rate limit, as the simulator enforces it on when each lookup reached the API, met
by the real runner and client (in this process, as test_lookup_retries.py runs them): lookups
held on their way by a proxy (a delay fault) arrive late, and a next lookup timed from when
the last was sent would reach the API within its window. Timed from the answer, none is
refused, and what the simulator received keeps the window between two lookups of a task.
"""

from __future__ import annotations

import threading

from modules.fixture import MODULE as FIXTURE_MODULE

from devkit.simulator.process import Simulator, task
from tests.faults.figures import record
from tests.faults.ledger import LOOKUP, Ledger, target
from validator.errors import ExitCode
from validator.ledger.client import FedLedgerClient
from validator.observe.hooks import Hooks, Middleware
from validator.runner import LoopSettings, Runner
from validator.scoring import ModulePool
from validator.state.journal import Journal

WINDOW = 0.5  # the simulator's --rate-limit-seconds, and the loop's interval
HELD = 0.2  # seconds a proxy holds the first lookups before the API receives them
TASKS = ["1", "2", "3"]
LOOKUPS = 15


class StopAfter(Middleware):
    def __init__(self, count: int, stop: threading.Event) -> None:
        self.left, self.stop = count, stop

    def after_lookup(self, task_id: str, answer: str, seconds: float, assignment_id) -> None:
        self.left -= 1
        if self.left <= 0:
            self.stop.set()


def test_lookups_held_on_their_way_never_meet_the_window(tmp_path):
    tasks = [task(int(t), []) for t in TASKS]
    held = {"endpoint": "request", "kind": "delay", "delay_seconds": HELD, "count": len(TASKS)}
    (tmp_path / "configs").mkdir()
    with Simulator({"tasks": tasks}, tmp_path, rate_limit_seconds=WINDOW, faults=[held]) as sim:
        client = FedLedgerClient("k", sim.api_url, backoff=0.01)
        journal = Journal(tmp_path / "state", min_free_mb=0)
        pool = ModulePool(FIXTURE_MODULE, "fixture", tmp_path / "configs")
        stop = threading.Event()
        watchdog = threading.Timer(30, stop.set)
        watchdog.start()
        try:
            settings = LoopSettings(TASKS, 1.0, WINDOW)
            hooks = Hooks(StopAfter(LOOKUPS, stop))
            code = Runner(settings, client, journal, pool, stop, hooks).run()
        finally:
            watchdog.cancel()
            journal.close()
            client.close()
        ledger = Ledger.of(sim)

    assert code == ExitCode.OK
    lookups = ledger.api_requests(LOOKUP)
    assert len(lookups) == LOOKUPS, "the watchdog stopped the loop"
    assert [r["status"] for r in lookups] == [400] * LOOKUPS  # no submissions; never 429
    for task_id in TASKS:
        received = [r["received"] for r in lookups if target(r, LOOKUP) == task_id]
        gaps = [b - a for a, b in zip(received, received[1:], strict=False)]
        assert len(gaps) >= 3 and min(gaps) >= WINDOW, gaps
    record(
        f"lookups held {HELD} s by a proxy, interval = the API's window ({WINDOW} s)",
        f"{LOOKUPS} lookups, 0 answered 429",
    )
