"""Observing hooks around the runner's steps (validator/observe/hooks.py): the real runner,
client and journal against the simulator, in this process so that a middleware of the test's
sits in the hook list beside the validator's own (metrics, records, status board)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from modules.fixture import MODULE as FIXTURE_MODULE

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import write_config
from validator.errors import ExitCode
from validator.ledger.client import FedLedgerClient
from validator.observe.hooks import Hooks, Middleware
from validator.observe.observer import Observer
from validator.observe.telemetry import REGISTRY
from validator.runner import LoopSettings, Runner
from validator.scoring import ModulePool
from validator.state.entry import Entry
from validator.state.journal import Journal
from validator.state.records import AssignmentRecord, RecordStore

TIME_SLEEP = 0.3


class Trace(Middleware):
    """Each hook that concerns one assignment, under that assignment's id; a phase goes to the
    assignment being scored."""

    def __init__(self) -> None:
        self.calls: dict[str, list[str]] = {}
        self.scoring: str | None = None

    def _add(self, assignment_id: str, call: str) -> None:
        self.calls.setdefault(assignment_id, []).append(call)

    def after_lookup(self, task_id, answer, seconds, assignment_id) -> None:
        if assignment_id is not None:
            self._add(assignment_id, "after_lookup")

    def before_attempt(self, entry: Entry) -> None:
        self.scoring = entry.id
        self._add(entry.id, f"before_attempt {entry.attempts}")

    def on_phase(self, phase: str) -> None:
        assert self.scoring is not None
        self._add(self.scoring, f"on_phase {phase}")

    def after_score(self, entry: Entry, phases, commit) -> None:
        # In time order: a phase of about no time (this module's) falls either side of another.
        self._add(entry.id, f"after_score {'+'.join(sorted(phases))}")

    def after_submit(self, entry: Entry, seconds: float) -> None:
        self._add(entry.id, f"after_submit {entry.state.value}")

    def after_finish(self, entry: Entry) -> None:
        self._add(entry.id, f"after_finish {entry.outcome}")

    def after_attempt(self, entry: Entry, exception: BaseException | None = None) -> None:
        self.scoring = None
        raised = f" raised {type(exception).__name__}" if exception else ""
        self._add(entry.id, f"after_attempt {entry.state.value}{raised}")


def run_loop(tmp_path: Path, repos: list[str], limit: int) -> tuple[ExitCode, Observer, Trace]:
    write_config(tmp_path, "fixture", {"slow_seconds": 0.1, "marker_dir": str(tmp_path)})
    with Simulator({"tasks": [task(1, repos)]}, tmp_path) as sim:
        client = FedLedgerClient("k", sim.api_url, backoff=0.01)
        journal = Journal(tmp_path / "state", min_free_mb=0)
        pool = ModulePool(FIXTURE_MODULE, "fixture", tmp_path / "configs")
        stop = threading.Event()
        watchdog = threading.Timer(30, stop.set)  # a loop that never reaches the limit stops
        watchdog.start()
        observer = Observer(tmp_path / "state", "fixture", 100, config_for=pool.config_for)
        trace = Trace()
        try:
            settings = LoopSettings(["1"], TIME_SLEEP, 0.1, limit)
            code = Runner(settings, client, journal, pool, stop, Hooks(observer, trace)).run()
        finally:
            watchdog.cancel()
            journal.close()
            client.close()
    assert not stop.is_set(), "the loop did not finish in 30 s"
    return code, observer, trace


def records(tmp_path: Path) -> dict[str, AssignmentRecord]:
    return {r.id: r for r in RecordStore(tmp_path / "state").read_all()}


def count(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(f"flock_validator_{name}", labels) or 0.0


def test_each_step_of_an_assignment_reaches_every_middleware_in_order(tmp_path, caplog):
    # glitch/x: an unexpected error, scored again after --time-sleep, then completed; its first
    # attempt starts the module, the host's work ("load");
    # slowhost/y: a host phase ("load") inside its scoring.
    caplog.set_level(logging.INFO)  # as the CLI logs: the records keep INFO lines
    completed = count("assignments_total", task="1", outcome="completed")
    loads = count("phase_seconds_count", phase="load")
    code, observer, trace = run_loop(tmp_path, ["glitch/x", "slowhost/y"], limit=2)

    assert code == ExitCode.OK
    assert trace.calls == {
        "1": [
            "after_lookup",
            "before_attempt 1",
            "on_phase host: load",  # the module starts
            "on_phase submission",
            "after_score load+score",
            "after_attempt received",  # kept for another attempt
            "before_attempt 2",
            "after_score score",
            "after_submit submitted",
            "after_finish completed",
            "after_attempt submitted",
        ],
        "2": [
            "after_lookup",
            "before_attempt 1",
            "on_phase host: load",
            "on_phase submission",
            "after_score load+score",
            "after_submit submitted",
            "after_finish completed",
            "after_attempt submitted",
        ],
    }
    # What the validator's own middleware made of the same calls.
    written = records(tmp_path)
    glitch, slowhost = written["1"], written["2"]
    assert (glitch.outcome, glitch.attempts) == ("completed", 2)
    assert set(glitch.phases) == {"lookup", "load", "score", "submit"}
    lines = "\n".join(glitch.log)  # both attempts' lines, the first one's error among them
    assert "scoring (attempt 1)" in lines and "scoring (attempt 2)" in lines
    assert "unexpected error in the module (attempt 1 of 3" in lines
    assert set(slowhost.phases) == {"lookup", "load", "score", "submit"}
    assert glitch.config["slow_seconds"] == 0.1
    status = observer.status
    assert sorted(row["id"] for row in status.recent) == ["1", "2"]
    assert {row["outcome"] for row in status.recent} == {"completed"}
    assert status.current is None and status.backlog == {"undecided": 0, "unsubmitted": 0}
    assert count("assignments_total", task="1", outcome="completed") == completed + 2
    assert count("phase_seconds_count", phase="load") == loads + 2
    assert count("scoring") == 0


def test_an_attempt_that_ends_the_loop_is_told_so_and_leaves_no_record(tmp_path):
    # operator/z: a OperatorError, exit 3, the assignment kept for after the fix.
    code, observer, trace = run_loop(tmp_path, ["operator/z"], limit=1)

    assert code == ExitCode.OPERATOR
    assert trace.calls == {
        "1": [
            "after_lookup",
            "before_attempt 1",
            "on_phase host: load",
            "on_phase submission",
            "after_score load+score",
            "after_attempt scoring raised Stop",
        ]
    }
    assert records(tmp_path) == {}
    assert observer.status.current is None and count("scoring") == 0
