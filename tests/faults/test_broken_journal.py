"""A broken or locked journal is the operator's to fix, and loses nothing: the real CLI against
the Fed Ledger simulator, with `<state dir>/journal.sqlite3` made garbage, cut short, of an
unknown schema, or locked by a second SQLite connection.

A damaged journal stops the validator with exit 3 and one line that names the file and says
what to do, before any API call, and leaves the file byte for byte as it was. A lock is waited
for; one held past the bound stops the validator with exit 3 before it asks for an assignment
that it could not record. (Two validators on one journal: test_two_validators.py.)
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from devkit.simulator.process import Simulator, task
from tests.faults.figures import record
from tests.faults.ledger import assert_each_submitted_once, journal_notes, journal_rows
from tests.helpers.cli import LoopCli
from validator.state.store import SCHEMA_V1

LOCK_BOUND_S = "1.5"
HOLD_S = 6.5


def journal_of(tmp_path: Path) -> Path:
    return tmp_path / "state" / "journal.sqlite3"


def the_one_error(output: str) -> str:
    """The operator gets one error line and no traceback."""
    errors = [line for line in output.splitlines() if " ERROR " in line]
    assert len(errors) == 1, output
    assert "Traceback" not in output
    return errors[0]


def real_journal(cli: LoopCli, sim: Simulator) -> bytes:
    """A journal as a validator leaves it, with one assignment submitted."""
    args = cli.args(sim.api_url, "1", "--max-assignments", "1")
    result = cli.run(args)
    assert result.returncode == 0, result.stderr
    return journal_of(cli.tmp_path).read_bytes()


def assert_refused_as_broken(cli: LoopCli, sim: Simulator, problem: str) -> str:
    path = journal_of(cli.tmp_path)
    before = path.read_bytes()
    calls_before = len(sim.state()["requests"])
    for _rerun in range(2):  # a rerun, as a restarting container would, gets the same answer
        result = cli.run(cli.args(sim.api_url, "1"))
        assert result.returncode == 3, result.stderr
        line = the_one_error(result.stderr)
        assert f"journal {path} is broken: {problem}" in line, line
        assert "It is left as it is: move it out of the state dir" in line, line
        assert path.read_bytes() == before
    assert len(sim.state()["requests"]) == calls_before  # not even the task list
    return line


def test_garbage_in_place_of_the_journal_stops_with_exit_3_and_is_kept(tmp_path, cli):
    journal_of(tmp_path).parent.mkdir()
    journal_of(tmp_path).write_bytes(b"not a journal at all\n" * 1000)
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path) as sim:
        assert_refused_as_broken(cli, sim, "SQLite cannot read it: file is not a database")
        # What the message says to do works: the file moved aside, a new journal is started.
        journal_of(tmp_path).rename(tmp_path / "journal.sqlite3.broken")
        args = cli.args(sim.api_url, "1", "--max-assignments", "1")
        result = cli.run(args)
        assert result.returncode == 0, result.stderr
        assert_each_submitted_once(sim, tmp_path / "state", 1)
    record("garbage in place of the journal", "exit 3, one line, 0 API calls, file unchanged")


def test_a_truncated_journal_stops_with_exit_3_and_is_kept(tmp_path, cli):
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path) as sim:
        data = real_journal(cli, sim)
        journal_of(tmp_path).write_bytes(data[: len(data) // 2])
        assert_refused_as_broken(
            cli, sim, "SQLite cannot read it: database disk image is malformed"
        )
    record("the journal cut to half its size", "exit 3, one line, 0 API calls, file unchanged")


def test_a_journal_missing_a_column_stops_with_exit_3_and_is_kept(tmp_path, cli):
    with Simulator({"tasks": [task(1, ["ok/a", "ok/b"])]}, tmp_path) as sim:
        real_journal(cli, sim)
        # As an older or foreign validator might have left it: the table without not_before.
        old_schema = SCHEMA_V1.replace("    not_before REAL NOT NULL DEFAULT 0,\n", "")
        kept = "id, module, task_id, state, input, metrics, outcome, error, attempts, "
        kept += "received_at, updated_at"
        with sqlite3.connect(journal_of(tmp_path)) as db:
            db.execute("ALTER TABLE assignments RENAME TO newer")
            db.executescript(old_schema.split("CREATE TABLE events")[0])
            db.execute(f"INSERT INTO assignments SELECT {kept} FROM newer")
            db.execute("DROP TABLE newer")
            db.execute("PRAGMA user_version = 1")
            assert db.execute("SELECT count(*) FROM assignments").fetchone() == (1,)
        db.close()
        assert_refused_as_broken(
            cli, sim, "an unknown schema, not migrated: table 'assignments' lacks not_before"
        )
    record("a journal table missing a column", "exit 3, one line, 0 API calls, file unchanged")


def test_a_lock_held_for_a_few_seconds_is_waited_for_then_everything_is_recorded(tmp_path, cli):
    cli.config({"slow_seconds": 1.0, "marker_dir": str(tmp_path)})
    with Simulator({"tasks": [task(1, ["slow/a", "ok/b"])]}, tmp_path) as sim:
        args = cli.args(sim.api_url, "1", "--max-assignments", "2")
        log = tmp_path / "validator.log"
        validator = cli.start(args, log)
        cli.wait_for(lambda: (tmp_path / "slow_a.started").exists(), 30, "slow/a to be scoring")
        # An sqlite3 shell, say, in a write transaction while slow/a's result comes in; for
        # longer than SQLite's default busy timeout of 5 s, which the validator used to take.
        holder = sqlite3.connect(journal_of(tmp_path), isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        time.sleep(HOLD_S)
        assert validator.poll() is None, log.read_text()
        states = {row["state"] for row in journal_rows(tmp_path / "state").values()}
        assert states == {"scoring"}  # the result waits for the lock...
        assert sim.submissions() == []  # ...and nothing goes out before it is recorded
        holder.execute("ROLLBACK")
        holder.close()
        assert validator.wait(30) == 0, log.read_text()
        assert "Traceback" not in log.read_text()
        assert_each_submitted_once(sim, tmp_path / "state", 2)
        slow = next(row for row in journal_rows(tmp_path / "state").values() if row["metrics"])
        assert journal_notes(tmp_path / "state", slow["id"])
    record(
        f"the journal locked {HOLD_S:g} s by another connection", "waited; 2 submitted once, 0 lost"
    )


def test_a_lock_held_past_the_bound_at_start_stops_before_any_api_call(tmp_path, cli):
    cli.env.update(VALIDATOR_JOURNAL_LOCK_TIMEOUT=LOCK_BOUND_S)
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path) as sim:
        real_journal(cli, sim)
        sim.add_submission(1, {"hg_repo_id": "ok/b"})
        calls_before = len(sim.state()["requests"])
        holder = sqlite3.connect(journal_of(tmp_path), isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        result = cli.run(cli.args(sim.api_url, "1"))
        holder.execute("ROLLBACK")
        holder.close()
        assert result.returncode == 3, result.stderr
        line = the_one_error(result.stderr)
        assert f"journal {journal_of(tmp_path)} stayed locked by another program for 1.5 s" in line
        assert "end that program's transaction, then rerun" in line
        assert len(sim.state()["requests"]) == calls_before

        args = cli.args(sim.api_url, "1", "--max-assignments", "1")
        result = cli.run(args)
        assert result.returncode == 0, result.stderr
        assert_each_submitted_once(sim, tmp_path / "state", 2)
    record("the journal locked past the bound at start", "exit 3, 0 API calls; then 0 lost")


def test_a_lock_taken_while_running_stops_before_the_next_lookup_and_loses_nothing(tmp_path, cli):
    """The case guarded: a lookup that goes ahead and whose assignment cannot be recorded
    stays `validating` at the API, lost to this validator."""
    cli.env.update(VALIDATOR_JOURNAL_LOCK_TIMEOUT=LOCK_BOUND_S)
    with Simulator({"tasks": [task(1, [])]}, tmp_path) as sim:
        log = tmp_path / "validator.log"
        validator = cli.start(cli.args(sim.api_url, "1"), log)
        cli.wait_for(lambda: len(sim.lookups()) >= 2, 30, "the validator to be looking up")
        holder = sqlite3.connect(journal_of(tmp_path), isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        time.sleep(0.5)  # a lookup already past its check ends, with nothing to hand out
        lookups = len(sim.lookups())
        sim.add_submission(1, {"hg_repo_id": "ok/a"})
        assert validator.wait(30) == 3, log.read_text()
        holder.execute("ROLLBACK")
        holder.close()
        line = the_one_error(log.read_text())
        assert f"journal {journal_of(tmp_path)} stayed locked by another program" in line
        assert len(sim.lookups()) == lookups
        assert sim.state()["assignments"] == []  # nothing handed out, so nothing lost

        args = cli.args(sim.api_url, "1", "--max-assignments", "1")
        result = cli.run(args)
        assert result.returncode == 0, result.stderr
        assert_each_submitted_once(sim, tmp_path / "state", 1)
    record(
        "the journal locked past the bound while running",
        "exit 3 before the next lookup, 0 handed out meanwhile, 0 lost",
    )
