"""A full disk is the operator's problem and loses nothing: the real CLI against the simulator,
with the state dir on a small tmpfs that really fills up.

Each case checks that the validator stops with exit 3 and one line naming
the state dir, asks the API for nothing it could not journal, and once space is freed a rerun
submits every assignment exactly once.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

from devkit.simulator.process import Simulator, task
from tests.faults.figures import record
from tests.helpers.tmpfs import fill, small_tmpfs

TMPFS_KIB = 2048


def journal_states(state: Path) -> dict[str, str]:
    with sqlite3.connect(f"file:{state / 'journal.sqlite3'}?mode=ro", uri=True) as db:
        return dict(db.execute("SELECT id, state FROM assignments").fetchall())


def submitted_rows(state: Path) -> list[str]:
    if not (state / "journal.sqlite3").exists():
        return []
    try:
        return [k for k, v in journal_states(state).items() if v == "submitted"]
    except sqlite3.OperationalError:  # created but its table not yet
        return []


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " ERROR " in line]


def assert_one_line_naming(stderr: str, state: Path) -> str:
    """The operator gets one error line that says where, and no traceback."""
    errors = error_lines(stderr)
    assert len(errors) == 1, stderr
    assert f"state dir {state} " in errors[0] and "MiB free" in errors[0], errors[0]
    assert "Traceback" not in stderr
    return errors[0]


def handed_out(sim: Simulator) -> set[str]:
    return {str(a["id"]) for a in sim.state()["assignments"]}


def submissions_per_assignment(sim: Simulator) -> dict[str, int]:
    counts: dict[str, int] = {}
    for submission in sim.submissions():
        key = str(submission["assignment_id"])
        counts[key] = counts.get(key, 0) + 1
    return counts


def assert_everything_submitted_once(sim: Simulator, state: Path) -> dict[str, Any]:
    assignments = sim.state()["assignments"]
    assert {a["status"] for a in assignments} == {"completed"}, assignments
    counts = submissions_per_assignment(sim)
    assert set(counts) == handed_out(sim) and set(counts.values()) == {1}, counts
    assert set(journal_states(state).values()) == {"submitted"}
    return counts


def no_floor(cli) -> None:
    # The tmpfs is far below the default floor; these cases are about the disk being full.
    cli.env.update(VALIDATOR_MIN_FREE_MB="0")


def test_restart_on_a_full_state_dir_asks_for_nothing_then_resumes(tmp_path, cli):
    """A journal left open (a kill) on a disk that is now full: a restart must not take an
    assignment that it then cannot journal."""
    no_floor(cli)
    with (
        small_tmpfs(tmp_path / "state", TMPFS_KIB) as state,
        Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path) as sim,
    ):
        first = cli.start(cli.args(sim.api_url, "1"), "v1.log")
        # Killed once the journal holds the submit: a kill between the API's answer and the
        # journal's write is another case: the rerun drops that row (test_submit_answers.py).
        cli.wait_for(lambda: submitted_rows(state), 20, "the first submission journaled")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        filler = fill(state)
        sim.add_submission(1, {"hg_repo_id": "ok/b"})
        sim.add_submission(1, {"hg_repo_id": "ok/c"})
        lookups_before = len(sim.lookups())
        for _restart in range(2):
            result = cli.run(cli.args(sim.api_url, "1"))
            assert result.returncode == 3, result.stderr
            assert_one_line_naming(result.stderr, state)
        assert len(sim.lookups()) == lookups_before
        filler.unlink()
        assert handed_out(sim) <= set(journal_states(state))

        args = cli.args(sim.api_url, "1", "--max-assignments", "2")
        result = cli.run(args)
        assert result.returncode == 0, result.stderr
        counts = assert_everything_submitted_once(sim, state)
    assert len(counts) == 3
    record(
        "state dir on a full tmpfs, 2 restarts",
        "exit 3 each, 0 lookups while full, 0 lost, 0 double after freeing",
    )


def test_below_the_floor_or_with_no_room_to_open_it_stops_then_resumes(tmp_path, cli):
    cli.env.update(VALIDATOR_MIN_FREE_MB="1")
    with (
        small_tmpfs(tmp_path / "state", TMPFS_KIB) as state,
        Simulator({"tasks": [task(1, ["ok/a", "ok/b"])]}, tmp_path) as sim,
    ):
        args = cli.args(sim.api_url, "1", "--max-assignments", "1")
        assert cli.run(args).returncode == 0
        lookups_before = len(sim.lookups())

        low = fill(state, leave_bytes=512 * 1024)  # room to write, but under --min-free-mb 1
        result = cli.run(args)
        assert result.returncode == 3, result.stderr
        line = assert_one_line_naming(result.stderr, state)
        assert "below the free-space floor" in line and "--min-free-mb 1" in line

        full = fill(state, name="filler2")  # a journal closed cleanly cannot even be opened
        result = cli.run(args)
        assert result.returncode == 3, result.stderr
        assert_one_line_naming(result.stderr, state)
        assert len(sim.lookups()) == lookups_before

        low.unlink()
        full.unlink()
        result = cli.run(args)
        assert result.returncode == 0, result.stderr
        assert_everything_submitted_once(sim, state)
    record("state dir below --min-free-mb", "exit 3, 0 lookups, resumes after freeing")


def test_disk_filling_up_during_scoring_keeps_the_result_then_submits_it_once(tmp_path, cli):
    no_floor(cli)
    # slow/b is held inside its scoring until the disk is full, however busy the machine.
    release = tmp_path / "release"
    config = {"slow_seconds": 120.0, "marker_dir": str(tmp_path), "release_file": str(release)}
    cli.config(config)
    tasks = [task(1, ["ok/a", "slow/b", "ok/c"])]
    with (
        small_tmpfs(tmp_path / "state", TMPFS_KIB) as state,
        Simulator({"tasks": tasks}, tmp_path) as sim,
    ):
        args = cli.args(sim.api_url, "1", "--max-assignments", "3")
        process = cli.start(args, "v1.log")
        cli.wait_for(lambda: (tmp_path / "slow_b.started").exists(), 60, "the slow scoring")
        filler = fill(state)
        release.touch()
        assert process.wait(60) == 3
        stderr = (tmp_path / "v1.log").read_text()
        assert_one_line_naming(stderr, state)
        statuses = {
            a["task_submission"]["data"]["hg_repo_id"]: a["status"]
            for a in sim.state()["assignments"]
        }
        assert statuses == {"ok/a": "completed", "slow/b": "validating"}
        filler.unlink()
        journaled = journal_states(state)
        assert handed_out(sim) <= set(journaled)
        assert journaled[_id_of(sim, "slow/b")] == "scored"  # the reserve paid for this write

        result = cli.run(args[:-1] + ["2"])  # slow/b from the journal, then ok/c
        assert result.returncode == 0, result.stderr
        counts = assert_everything_submitted_once(sim, state)
    assert len(counts) == 3
    assert "assignment" in stderr and "scoring" in stderr
    record(
        "state dir filled during a scoring",
        "exit 3 with the result kept, 0 lost, 0 double after freeing",
    )


def test_no_space_while_scoring_keeps_the_assignment_then_scores_it_after_the_fix(tmp_path, cli):
    with Simulator({"tasks": [task(1, ["nospace/x"])]}, tmp_path) as sim:
        args = cli.args(sim.api_url, "1", "--max-assignments", "1")
        result = cli.run(args)
        assert result.returncode == 3, result.stderr
        errors = error_lines(result.stderr)
        assert len(errors) == 1 and "No space left on device" in errors[0], result.stderr
        assert sim.submissions() == []
        assert [a["status"] for a in sim.state()["assignments"]] == ["validating"]
        assert journal_states(tmp_path / "state") == {"1": "received"}

        cli.config({"nospace_fixed": True})
        lookups_before = len(sim.lookups())
        result = cli.run(args)
        assert result.returncode == 0, result.stderr
        assert [s["status"] for s in sim.submissions()] == ["completed"]
        assert len(sim.lookups()) == lookups_before
    record("ENOSPC in the download dir / HF cache", "exit 3, not failed, completed after the fix")


def test_check_with_no_space_is_an_operator_problem_not_a_crash(tmp_path, cli):
    """A trainer's `--check` must not read "the submission would fail" or a traceback."""
    input_path = tmp_path / "input.json"
    input_path.write_text(json.dumps({"hg_repo_id": "nospace/x"}))
    result = cli.run(["fixture", "--check", str(input_path)])
    assert result.returncode == 3, result.stderr
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "No space left on device" in errors[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def _id_of(sim: Simulator, repo: str) -> str:
    for assignment in sim.state()["assignments"]:
        if assignment["task_submission"]["data"]["hg_repo_id"] == repo:
            return str(assignment["id"])
    raise AssertionError(f"no assignment of {repo}")
