"""Two validators on one state dir: the real CLI, twice, against the Fed Ledger simulator.

The second must refuse before it asks the API for anything (an assignment it took could not be
journaled), say why, and leave the first to finish its work undisturbed; also when a
cleanup script deleted the files beside the journal (a lock file of old): the lock is on the
directory.
"""

from __future__ import annotations

import time

import pytest

from devkit.simulator.process import Simulator, task
from tests.faults.figures import record
from tests.faults.ledger import assert_each_submitted_once


@pytest.mark.parametrize("other_files", ["kept", "deleted"])
def test_second_validator_on_the_same_state_dir_refuses_without_an_api_call(
    tmp_path, cli, other_files
):
    # The first is held inside its scoring of slow/a until the test releases it, so the second
    # provably starts while the first runs, however long a loaded machine takes to start it.
    release = tmp_path / "release"
    config = {"slow_seconds": 120.0, "marker_dir": str(tmp_path), "release_file": str(release)}
    cli.config(config)
    tasks = {"tasks": [task(1, ["slow/a", "ok/b"])]}
    (tmp_path / "second").mkdir()
    # The second validator gets an API of its own, so that any call it made would show there.
    with Simulator(tasks, tmp_path) as sim, Simulator(tasks, tmp_path / "second") as other:
        args = cli.args(sim.api_url, "1", "--max-assignments", "2")
        first = cli.start(args, "first.log")
        cli.wait_for(lambda: (tmp_path / "slow_a.started").exists(), 30, "the first to be scoring")
        if other_files == "deleted":  # all but the journal's, which the first still writes
            for path in (tmp_path / "state").iterdir():
                if path.is_file() and not path.name.startswith("journal.sqlite3"):
                    path.unlink()

        started = time.monotonic()
        second = cli.run(cli.args(other.api_url, "1"))
        refusal_s = time.monotonic() - started
        assert second.returncode == 2, second.stderr
        assert (
            f"state directory {tmp_path / 'state'} is in use by another validator" in second.stderr
        )
        assert "give each validator its own --state-dir" in second.stderr
        assert "Traceback" not in second.stderr
        assert other.state()["requests"] == []
        # The first was running all along: still scoring slow/a, its one lookup so far, with
        # nothing submitted.
        assert first.poll() is None
        assert len(sim.lookups()) == 1 and sim.submissions() == []

        release.touch()
        assert first.wait(60) == 0, (tmp_path / "first.log").read_text()
        assert_each_submitted_once(sim, tmp_path / "state", 2)
    record(
        f"two validators on one state dir, the files beside its journal {other_files}",
        f"the second exits 2 in {refusal_s:.1f} s with 0 API calls; "
        "the first finishes, 2 submitted once",
    )
