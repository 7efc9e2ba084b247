"""Process deaths while scoring count against a submission only when it plausibly caused
them: a crash in its own compute counts (failed after 3), a stop signal followed by a kill (a
`docker stop` whose grace ran out) does not, nor a death in the host's work (loading a base)."""

from __future__ import annotations

import signal

import pytest

from devkit.simulator.process import Simulator, task
from tests.faults.figures import record
from tests.faults.ledger import journal_notes, journal_rows

DEATHS = 3  # MAX_SCORING_ATTEMPTS: one more counted death would fail the submission


def die_while_scoring(cli, args, repo: str, stop_first: bool, round_: int) -> None:
    marker = cli.tmp_path / (repo.replace("/", "_") + ".started")
    marker.unlink(missing_ok=True)
    process = cli.start(args, f"run-{round_}.log")
    cli.wait_for(marker.exists, 30, f"scoring of {repo} to start")
    if stop_first:  # docker stop: SIGTERM, then SIGKILL when the grace period runs out
        process.send_signal(signal.SIGTERM)
        stopped = cli.tmp_path / "state" / "stop.requested"
        cli.wait_for(stopped.exists, 10, "the stop mark")
    process.kill()
    process.wait(10)


@pytest.mark.parametrize(
    ("repo", "stop_first", "counted"),
    [
        ("slow/crashes", False, True),
        ("slow/honest", True, False),
        ("slowhost/honest", False, False),
    ],
    ids=["killed-in-its-compute", "stopped-then-killed", "killed-in-host-work"],
)
def test_only_deaths_the_submission_caused_count(tmp_path, cli, request, repo, stop_first, counted):
    config = {"slow_seconds": 60.0, "marker_dir": str(tmp_path)}
    cli.config(config)
    with Simulator({"tasks": [task(1, [repo])]}, tmp_path) as sim:
        args = cli.args(sim.api_url, "1", "--max-assignments", "1")
        for round_ in range(DEATHS):
            die_while_scoring(cli, args, repo, stop_first, round_)
        # The next run scores quickly: an honest submission is completed now.
        cli.config({**config, "slow_seconds": 0.0})
        result = cli.run(args)
        assert result.returncode == 0, result.stderr
        (submitted,) = sim.submissions()
    row = journal_rows(tmp_path / "state")["1"]
    notes = " | ".join(journal_notes(tmp_path / "state", "1"))
    if counted:
        assert submitted["status"] == "failed", notes
        assert row["error"] == f"scoring ended the process {DEATHS} times (crash or device fault)"
    else:
        assert submitted["status"] == "completed", notes
        assert row["attempts"] == 1  # only the run that finished counts
        expected = "stopped" if stop_first else "host's work (load)"
        assert notes.count("attempt not counted") == DEATHS and expected in notes
    how = request.node.callspec.id.replace("-", " ")
    record(f"{DEATHS} deaths while scoring, {how}", f"then {submitted['status']}")
