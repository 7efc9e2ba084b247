"""The loop in the test process, for unit tests of validator.runner.Runner: a fake Fed Ledger
(tests/helpers/fake_ledger.py), a fake clock that moves only when the runner waits, a real
Journal (in memory's file system where there is one, else under tmp_path), and a module whose
every scoring the test chooses. No child process, server or socket: the unit layer
(tests/helpers/layers.py).

    loop = Loop(tmp_path)
    loop.submission("1", "a", TransientError("hub 503"), 0.25)  # task 1 hands out "a"
    assert loop.run(max_assignments=1) == ExitCode.OK
    assert loop.ledger.taken() == [("1", "completed", {"score": 0.25, "size": 0})]

Each `run()` is one process of the validator: a fresh module pool, stop event and client start,
over the same journal and the same Fed Ledger. The clock starts at the real time (the journal
stamps its rows with the real clock, which the runner compares with its own) and then moves
only by the runner's waits, at once; past the run's horizon the clock stops the loop as a stop
signal would. A loop that passes many times at one instant has spun, and the run fails.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

from tests.helpers.fake_ledger import FakeLedger
from validator.clock import Clock
from validator.errors import ExitCode
from validator.kit.base import BaseConfig, BaseInputData, BaseMetrics, BaseValidationModule
from validator.observe.hooks import Hooks, Middleware
from validator.options import DEFAULT_JOURNAL_KEEP_DAYS
from validator.runner import LoopSettings, Runner
from validator.scoring import ModulePool
from validator.state.entry import Entry
from validator.state.journal import Journal
from validator.state.phases import STOP_FILE

MODULE = "plan"
TIME_SLEEP = 60.0
LOOKUP_INTERVAL = 180.0
HORIZON = 2 * 3600.0
# Passes of the loop at one instant of the fake clock before it counts as spinning: a pass that
# works (a lookup, a scoring, a submit) may take no time, but only so many of them are due.
SPIN_PASSES = 200
# Each journal write syncs, and each step's room check writes and syncs a probe: on a disk that
# other work keeps busy, that made these tests 3 times slower than in memory, where a sync is
# free. The journal's code is the same either way (its disk checks: tests/faults/).
MEMORY_FS = Path("/dev/shm")


def _memory_dir() -> Path | None:
    try:
        return Path(tempfile.mkdtemp(prefix="loop-test-", dir=MEMORY_FS))
    except OSError:
        return None


class FakeClock(Clock):
    """The runner's clock (validator.clock.Clock), moved only by its waits."""

    def __init__(self) -> None:
        self.now = time.time()
        self.stop_at = float("inf")
        self.waits: list[float] = []

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        if stop.is_set():
            return True
        self.waits.append(seconds)
        if self.now + seconds >= self.stop_at:
            self.now = self.stop_at
            stop.set()  # as a stop signal would
            return True
        self.now += seconds
        return False

    def advance(self, seconds: float) -> None:
        self.now += seconds


class PlanInput(BaseInputData):
    name: str  # the submission's: which plan it follows
    size: int = 0  # the task's (the assignment's data)


class PlanMetrics(BaseMetrics):
    score: float
    size: int = 0


# What one scoring of a submission does: return that score, raise that exception, or call
# that function (which may change the test's state) and return its score.
Step = float | BaseException | Callable[[], float]


class PlanModule(BaseValidationModule):
    """Scores each submission as its plan says, one step per scoring (the last step repeats).
    Each Loop has its own subclass, with its own plans and calls."""

    input_data_schema = PlanInput
    metrics_schema = PlanMetrics
    plans: ClassVar[dict[str, list[Step]]] = {}
    calls: ClassVar[list[tuple[str, float]]] = []  # (name, the clock's time) of each scoring
    clock: ClassVar[Clock] = Clock()
    init_error: ClassVar[Exception | None] = None  # what __init__ raises, if anything

    def __init__(self, config: BaseConfig) -> None:
        super().__init__(config)
        if self.init_error is not None:
            raise self.init_error.with_traceback(None)

    def validate(self, data: PlanInput) -> PlanMetrics:  # type: ignore[override]
        self.calls.append((data.name, self.clock.time()))
        steps = self.plans[data.name]
        step = steps.pop(0) if len(steps) > 1 else steps[0]
        if isinstance(step, BaseException):
            raise step.with_traceback(None)  # raised anew each time, not on top of the last
        score = step() if callable(step) else step
        return PlanMetrics(score=score, size=data.size)


class SpinGuard(Middleware):
    """Stops a loop that passes again and again at one instant of the fake clock."""

    def __init__(self, clock: FakeClock, stop: threading.Event) -> None:
        self.clock, self.stop = clock, stop
        self.at, self.passes, self.spun = clock.now, 0, False

    def before_pass(self, undecided: int, unsubmitted: int) -> None:
        if self.clock.now != self.at:
            self.at, self.passes = self.clock.now, 0
        self.passes += 1
        if self.passes > SPIN_PASSES:
            self.spun = True
            self.stop.set()


class Loop:
    """The runner's world for one test: see the module's docstring."""

    def __init__(
        self,
        tmp_path: Path,
        *,
        time_sleep: float = TIME_SLEEP,
        lookup_interval: float = LOOKUP_INTERVAL,
        horizon: float = HORIZON,
        on_disk: bool = False,
        journal_keep_days: int = DEFAULT_JOURNAL_KEEP_DAYS,
    ) -> None:
        # on_disk: the state dir under tmp_path, for a test of what reaches the disk.
        self._memory = None if on_disk else _memory_dir()
        self.journal_keep_days = journal_keep_days
        self.state_dir = (self._memory or tmp_path) / "state"
        self.config_dir = tmp_path / "configs"
        self.time_sleep, self.lookup_interval, self.horizon = time_sleep, lookup_interval, horizon
        self.clock = FakeClock()
        self.ledger = FakeLedger(self.clock.time, advance=self.clock.advance)
        own = {"plans": {}, "calls": [], "clock": self.clock}
        self.module: type[PlanModule] = type("Plan", (PlanModule,), own)
        self.stop = threading.Event()
        self._stops: list[threading.Event] = []
        self._watchers: list[threading.Thread] = []  # the stop watchers its runs started

    def submission(self, task_id: str, name: str, *steps: Step, **task_data: Any) -> None:
        """Task `task_id` hands out a submission named `name` next (after those queued before);
        each scoring of it takes the next of `steps` (default: a score of 1.0)."""
        self.module.plans[name] = list(steps) or [1.0]
        self.ledger.queue(task_id, {"name": name}, task_data)

    def stopping(self, score: float = 1.0) -> Callable[[], float]:
        """A step that stops the loop (a stop signal during the scoring), then scores."""

        def step() -> float:
            self.stop.set()
            return score

        return step

    def run(
        self,
        task_ids: Iterable[str] = ("1",),
        *,
        max_assignments: int | None = None,
        hooks: Iterable[Middleware] = (),
        horizon: float | None = None,
    ) -> ExitCode:
        """One process of the validator, until it returns its exit code."""
        self.stop = stop = threading.Event()
        self._stops.append(stop)
        self.clock.stop_at = self.clock.now + (self.horizon if horizon is None else horizon)
        self.ledger.started_at = time.time()  # a new process's client
        settings = LoopSettings(
            list(task_ids),
            self.time_sleep,
            self.lookup_interval,
            max_assignments,
            self.journal_keep_days,
        )
        guard = SpinGuard(self.clock, stop)
        pool = ModulePool(self.module, MODULE, self.config_dir)
        journal = Journal(self.state_dir, min_free_mb=0)
        before = set(threading.enumerate())
        try:
            hooked = Hooks(*hooks, guard)
            client: Any = self.ledger  # the FedLedgerClient methods the runner calls
            return Runner(settings, client, journal, pool, stop, hooked, self.clock).run()
        finally:
            journal.close()
            self._watchers += [
                thread
                for thread in set(threading.enumerate()) - before
                if thread.name == "stop-mark"
            ]
            assert not guard.spun, f"the loop spun: {SPIN_PASSES} passes at one instant"
            if stop.is_set():
                self._wait_for_stop_mark()

    def close(self) -> None:
        """Ends the stop watchers the runs left waiting (a process's would die with it)."""
        for stop in self._stops:
            stop.set()
        # Each marks the stop on disk as it ends (validator/state/phases.py): before removal.
        # Only this loop's: another test's runner may have left one waiting for good.
        for thread in self._watchers:
            thread.join(10)
        if self._memory is not None:
            shutil.rmtree(self._memory, ignore_errors=True)

    # --- what the journal holds --------------------------------------------------------

    def entry(self, assignment_id: str) -> Entry:
        """The journal's entry, read as the journal reads its rows (Entry.from_row)."""
        rows = self._read("SELECT * FROM assignments WHERE id = ?", assignment_id)
        assert rows, f"assignment {assignment_id} is not in the journal"
        return Entry.from_row(rows[0])

    def events(self, assignment_id: str) -> list[tuple[str, str | None]]:
        query = "SELECT state, note FROM events WHERE assignment_id = ? ORDER BY rowid"
        return [(row["state"], row["note"]) for row in self._read(query, assignment_id)]

    def _read(self, query: str, *params: Any) -> list[sqlite3.Row]:
        # Read-only, beside the journal's lock: opening a Journal here would write (its checks,
        # its reserve) and sync, which many reads in a test pay for on a busy disk.
        uri = f"{(self.state_dir / 'journal.sqlite3').absolute().as_uri()}?mode=ro"
        db = sqlite3.connect(uri, uri=True)
        try:
            db.row_factory = sqlite3.Row
            return db.execute(query, params).fetchall()
        finally:
            db.close()

    def _wait_for_stop_mark(self) -> None:
        # The runner's stop watcher marks the stop on disk from its own thread; the next run
        # (the next process) must find it there, as it would after a process ended.
        mark = self.state_dir / STOP_FILE
        deadline = time.monotonic() + 10
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
