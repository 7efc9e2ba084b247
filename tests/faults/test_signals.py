"""SIGTERM in the middle of a scoring: the real CLI against the Fed Ledger simulator.

One SIGTERM lets the validator finish the step it is in (score, then submit) and exit 0; a
result it could not submit stays in the journal and the next run submits it. A second SIGTERM
cuts the scoring short with exit 130; the assignment goes back to the journal, not counted as a
crash, and the next run scores and submits it. Nothing is ever marked failed, and nothing is
looked up twice.
"""

from __future__ import annotations

import signal
import time

import pytest

from devkit.simulator.process import Simulator, task
from tests.faults.figures import record
from tests.faults.ledger import Ledger, assert_each_submitted_once, journal_notes, journal_rows
from tests.helpers.cli import LoopCli

SLOW_SECONDS = 1.0
SUBMIT_DOWN = {"endpoint": "update", "kind": "status", "status": 503, "count": None}


def slow_config(cli: LoopCli, seconds: float = SLOW_SECONDS) -> None:
    cli.config({"slow_seconds": seconds, "marker_dir": str(cli.tmp_path)})


def start_and_wait_for_scoring(sim: Simulator, cli: LoopCli, log: str):
    process = cli.start(cli.args(sim.api_url, "1"), log)
    started = cli.tmp_path / "slow_a.started"
    cli.wait_for(started.exists, 30, "the slow scoring to start")
    return process


def rerun_for_one(sim: Simulator, cli: LoopCli) -> None:
    """A second run finishes the first one's assignment from the journal, without a lookup."""
    lookups = len(sim.lookups())
    args = cli.args(sim.api_url, "1", "--max-assignments", "1")
    result = cli.run(args)
    assert result.returncode == 0, result.stderr
    assert len(sim.lookups()) == lookups


@pytest.mark.parametrize("api", ["up", "down on submit"])
def test_sigterm_mid_scoring_finishes_the_step_and_exits_0(tmp_path, cli, api):
    slow_config(cli)
    faults = [SUBMIT_DOWN] if api != "up" else None
    with Simulator({"tasks": [task(1, ["slow/a", "ok/b"])]}, tmp_path, faults=faults) as sim:
        process = start_and_wait_for_scoring(sim, cli, "v1.log")
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        stop_s = time.monotonic() - signalled
        log = (tmp_path / "v1.log").read_text()
        assert "SIGTERM received" in log and "stopped by signal" in log, log
        # The scoring went on to the end (its result in the journal, below) and no new work
        # was taken.
        assert len(sim.state()["assignments"]) == 1
        after_first = journal_rows(tmp_path / "state")["1"]["state"]
        if api == "up":
            assert after_first == "submitted"
        else:
            assert after_first == "scored" and sim.submissions() == []
            sim.clear_faults()
            rerun_for_one(sim, cli)
        ledger, rows = assert_each_submitted_once(sim, tmp_path / "state", 1)
    assert [r["status"] for r in ledger.results] == ["completed"]
    assert rows["1"]["attempts"] == 1
    where = "submitted before exit" if api == "up" else "kept, submitted by the next run"
    record(
        f"SIGTERM mid-scoring, API {api}",
        f"exit 0 after the step ({stop_s:.1f} s, scoring {SLOW_SECONDS:g} s); {where}; "
        "1 submitted once, 0 failed",
    )


def test_second_sigterm_mid_scoring_exits_130_and_the_next_run_submits_once(tmp_path, cli):
    slow_config(cli, seconds=5.0)
    with Simulator({"tasks": [task(1, ["slow/a", "ok/b"])]}, tmp_path) as sim:
        process = start_and_wait_for_scoring(sim, cli, "v1.log")
        process.send_signal(signal.SIGTERM)
        cli.wait_for(
            lambda: "SIGTERM received" in (tmp_path / "v1.log").read_text(), 10, "the first stop"
        )
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 130
        stop_s = time.monotonic() - signalled
        log = (tmp_path / "v1.log").read_text()
        assert "interrupted" in log and "Traceback" not in log, log
        row = journal_rows(tmp_path / "state")["1"]
        # Left in scoring, the stop on disk: the next run takes the cut-short attempt back, as
        # after any stopped process, and does not count it as a crash.
        assert (row["state"], row["attempts"]) == ("scoring", 1), row
        assert (tmp_path / "state" / "stop.requested").is_file()
        assert Ledger.of(sim).unfinished() == ["1"] and sim.submissions() == []

        slow_config(cli, seconds=0.1)
        rerun_for_one(sim, cli)
        ledger, rows = assert_each_submitted_once(sim, tmp_path / "state", 1)
    assert [r["status"] for r in ledger.results] == ["completed"]
    assert rows["1"]["attempts"] == 1
    assert "attempt not counted" in " | ".join(journal_notes(tmp_path / "state", "1"))
    record(
        "second SIGTERM mid-scoring, then a restart",
        f"exit 130 {stop_s:.1f} s after it (scoring 5 s); rescored by the next run, "
        "1 submitted once, 0 failed, 0 attempts counted as crashes",
    )
