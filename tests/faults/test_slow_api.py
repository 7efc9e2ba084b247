"""A Fed Ledger that answers a byte at a time: no call outlives its deadline, and the first
SIGTERM ends a call in progress at once. The real client and CLI against the simulator.

requests' read timeout bounds each read, and a byte every 2 s resets it: before the overall
deadline, a trickled lookup held the loop for as long as the server kept trickling.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import loop_args, run_validator, start_validator, validator_env, wait_for
from tests.faults.figures import record
from tests.faults.ledger import LOOKUP, UPDATE, journal_notes, journal_rows, target
from validator.ledger.answers import ApiUnavailable
from validator.ledger.client import FedLedgerClient
from validator.ledger.transport import CallInterrupted
from validator.outbound.deadline import STOP_GRACE_S, WATCHER_NAME

TRICKLE_S = 2.0  # between two bytes: far below the 60 s read timeout


def trickle(endpoint: str, count: int | None = None) -> dict:
    return {"endpoint": endpoint, "kind": "trickle", "delay_seconds": TRICKLE_S, "count": count}


def deadline_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == WATCHER_NAME]


def test_trickled_lookup_ends_at_the_deadline_and_is_not_retried(tmp_path):
    with Simulator(
        {"tasks": [task(12, ["alice/a"])]}, tmp_path, faults=[trickle("request")]
    ) as sim:
        deadline = 3.0
        api = FedLedgerClient("k", sim.api_url, retries=3, backoff=0.01, deadline=deadline)
        started = time.monotonic()
        with pytest.raises(ApiUnavailable, match="deadline") as raised:
            api.request_assignment("12")
        elapsed = time.monotonic() - started
        # The abandoned try leaves no thread behind: it ran in this one, its socket shut, and
        # its deadline's watcher ended with it.
        assert deadline_threads() == []
        lookups = sim.lookups()
    assert deadline <= elapsed < deadline + 1.5, elapsed
    # The API handed an assignment out (lost to a stuck link: the cost of any lookup whose
    # answer never comes), so asking again would be wrong: one lookup only.
    assert [(r["status"], r["fault"]) for r in lookups] == [(200, "trickle")]
    assert raised.value.maybe_processed
    record(
        f"lookup trickled 1 byte / {TRICKLE_S:g} s (read timeout 60 s)",
        f"ended by the {deadline:g} s deadline after {elapsed:.1f} s; 1 lookup, not retried",
    )


def test_stop_abandons_a_trickled_call_promptly(tmp_path):
    with Simulator({"tasks": [task(12, [])]}, tmp_path, faults=[trickle("list")]) as sim:
        stop = threading.Event()
        api = FedLedgerClient("k", sim.api_url, deadline=120, stop=stop)
        threading.Timer(0.5, stop.set).start()
        started = time.monotonic()
        with pytest.raises(CallInterrupted):
            api.list_tasks()
        elapsed = time.monotonic() - started
    assert elapsed < 0.5 + STOP_GRACE_S + 1.5, elapsed


def journal_is_intact(state_dir: Path) -> None:
    with sqlite3.connect(f"file:{state_dir / 'journal.sqlite3'}?mode=ro", uri=True) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def sigterm_during(sim: Simulator, tmp_path: Path, route: str) -> tuple[int, float, str]:
    """Start the loop, SIGTERM it once a trickled call on `route` is under way: its exit code,
    seconds from the signal to the exit, and its log."""
    process = start_validator(
        loop_args("fixture", sim.api_url, "1"), validator_env(tmp_path), tmp_path / "v1.log"
    )
    try:
        wait_for(
            lambda: any(target(r, route) and r["fault"] for r in sim.state()["requests"]),
            30,
            "a trickled call",
        )
        time.sleep(TRICKLE_S)  # well inside the trickle: a byte or two in
    finally:
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(60)
    return code, time.monotonic() - signalled, (tmp_path / "v1.log").read_text()


def test_sigterm_during_a_trickled_lookup_exits_promptly(tmp_path):
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path, faults=[trickle("request")]) as sim:
        code, stop_s, log = sigterm_during(sim, tmp_path, LOOKUP)
    assert code == 0, log
    assert "stopped by signal" in log and "Traceback" not in log, log
    # The default deadline is 300 s: the stop, not the deadline, ended the call.
    assert stop_s < STOP_GRACE_S + 3, stop_s
    journal_is_intact(tmp_path / "state")
    record(
        f"SIGTERM during a lookup trickled 1 byte / {TRICKLE_S:g} s",
        f"exit 0 {stop_s:.1f} s after it (deadline 300 s, grace {STOP_GRACE_S:g} s)",
    )


def test_sigterm_during_a_trickled_submit_keeps_the_result_and_the_next_run_settles_it(
    tmp_path,
):
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path, faults=[trickle("update")]) as sim:
        code, stop_s, log = sigterm_during(sim, tmp_path, UPDATE)
        assert code == 0, log
        assert stop_s < STOP_GRACE_S + 3, stop_s
        journal_is_intact(tmp_path / "state")
        row = journal_rows(tmp_path / "state")["1"]
        # The API committed before trickling its answer; the journal knows it may have.
        assert row["state"] == "scored" and "maybe taken" in row["error"], row
        assert len(sim.submissions()) == 1

        sim.clear_faults()
        args = loop_args("fixture", sim.api_url, "1", "--max-assignments", "1")
        result = run_validator(args, validator_env(tmp_path))
        assert result.returncode == 0, result.stderr
        assert len(sim.submissions()) == 1
    assert journal_rows(tmp_path / "state")["1"]["state"] == "submitted"
    assert "answer to an earlier try was lost" in journal_notes(tmp_path / "state", "1")[-1]
    record(
        f"SIGTERM during a submit trickled 1 byte / {TRICKLE_S:g} s",
        f"exit 0 {stop_s:.1f} s after it; kept, the next run records it submitted once",
    )
