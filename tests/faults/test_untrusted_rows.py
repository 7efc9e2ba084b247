"""A journal that trusts no row: the real CLI against the Fed Ledger simulator, on a
journal of the schema before constraints (version 1, as every store written before this one),
holding each kind of damage an audit found.

Before: a NULL id made every start exit 1 with a traceback (the quarantine itself raised); a
scored row whose metrics were NULL was submitted as completed with `{}`; a row in an unknown
state was skipped without a word. Now the start migrates the store to the constrained schema:
each damaged row is set aside (kept as it was in the `quarantine` table, one log line naming
it and why) and never submitted, a scored row without metrics is scored again, and the rest is
submitted as before.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import REPO_ROOT, loop_args, run_validator, validator_env
from tests.faults.figures import record
from tests.faults.ledger import journal_rows, quarantine_rows
from tests.faults.test_damaged_rows import SUBMITS_FAIL, scored_but_not_submitted
from validator.state.store import SCHEMA_V1

COLUMNS = "id, module, task_id, state, input, metrics, outcome, error, attempts, not_before, "
COLUMNS += "received_at, updated_at"


def rewrite_as_v1(state: Path, rows: list[dict[str, Any]]) -> None:
    """The state dir's journal replaced by a version 1 journal holding `rows`."""
    path = state / "journal.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    with sqlite3.connect(path) as db:
        # The schema every journal had before version 2: no CHECK, nullable id.
        db.executescript(SCHEMA_V1 + "PRAGMA user_version = 1;")
        for row in rows:
            values = [row[c] for c in COLUMNS.split(", ")]
            db.execute(
                f"INSERT INTO assignments ({COLUMNS}) VALUES ({', '.join('?' * 12)})", values
            )
    db.close()


def test_each_kind_of_damaged_row_is_set_aside_or_scored_again_never_submitted(tmp_path):
    state = tmp_path / "state"
    repos = ["ok/good", "ok/nometrics", "ok/oddstate", "ok/badtype", "ok/badmetrics"]
    with Simulator({"tasks": [task(1, repos)]}, tmp_path, faults=[SUBMITS_FAIL]) as sim:
        ids = scored_but_not_submitted(sim, tmp_path, len(repos))
        rows = journal_rows(state)
        by_repo = {repo: dict(rows[ids[repo]]) for repo in repos}
        by_repo["ok/nometrics"]["metrics"] = None
        by_repo["ok/oddstate"]["state"] = "half-done"
        by_repo["ok/badtype"]["attempts"] = "three"
        by_repo["ok/badmetrics"]["metrics"] = "[1, 2]"
        # A row whose id is NULL: a copy of the good one, as a bad restore might leave it.
        null_id = {**by_repo["ok/good"], "id": None, "received_at": 1.0}
        rewrite_as_v1(state, [*by_repo.values(), null_id])
        sim.clear_faults()

        args = loop_args("fixture", sim.api_url, "1", "--max-assignments", "2")
        result = run_validator(args, validator_env(tmp_path))
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr

        # What the API received: the good result as it was scored, and the row without metrics
        # scored again (its metrics, not {}); nothing of the damaged rows.
        submitted = sim.results_by_repo()
        assert sorted(submitted) == ["ok/good", "ok/nometrics"], submitted
        good_metrics = json.loads(by_repo["ok/good"]["metrics"])
        assert submitted["ok/good"]["status"] == "completed"
        assert submitted["ok/good"]["data"] == good_metrics
        # The fixture scores a repo by its name's length (scale 1): scored again, not {}.
        assert submitted["ok/nometrics"]["status"] == "completed"
        assert submitted["ok/nometrics"]["data"] == {
            "loss": 0.12,
            "repo_length": 12,
            "context_length": 0,
        }
        assert len(sim.submissions()) == 2

        # The damaged rows: set aside as they were, each with its reason.
        aside = quarantine_rows(state)
        by_id = {row["id"]: row for row in aside}
        assert sorted(by_id, key=str) == sorted(
            [None, ids["ok/oddstate"], ids["ok/badtype"], ids["ok/badmetrics"]], key=str
        ), aside
        assert by_id[None]["metrics"] == by_repo["ok/good"]["metrics"]
        assert "id" in by_id[None]["reason"]
        assert by_id[ids["ok/oddstate"]]["state"] == "half-done"
        assert "state" in by_id[ids["ok/oddstate"]]["reason"]
        assert by_id[ids["ok/badtype"]]["attempts"] == "three"
        assert "attempts" in by_id[ids["ok/badtype"]]["reason"]
        assert by_id[ids["ok/badmetrics"]]["metrics"] == "[1, 2]"
        assert "metrics is list" in by_id[ids["ok/badmetrics"]]["reason"]
        # One line for each, naming it; the journal keeps only rows it can read.
        told = [line for line in result.stderr.splitlines() if "set aside" in line]
        assert len(told) == 4, result.stderr
        for assignment in ("None", ids["ok/oddstate"], ids["ok/badtype"], ids["ok/badmetrics"]):
            assert sum(f"assignment {assignment} " in line for line in told) == 1, told
        kept = journal_rows(state)
        assert sorted(kept) == sorted([ids["ok/good"], ids["ok/nometrics"]])
        assert {row["state"] for row in kept.values()} == {"submitted"}

        # The next start: nothing crashes, nothing is sent again, one reminder line.
        sim.add_submission(1, {"hg_repo_id": "ok/new"})
        again = run_validator(
            loop_args("fixture", sim.api_url, "1", "--max-assignments", "1"),
            validator_env(tmp_path),
        )
        assert again.returncode == 0, again.stderr
        assert sorted(sim.results_by_repo()) == ["ok/good", "ok/new", "ok/nometrics"]
        assert len(sim.submissions()) == 3
        reminder = [line for line in again.stderr.splitlines() if "quarantined" in line]
        assert len(reminder) == 1 and ids["ok/oddstate"] in reminder[0], again.stderr

    # The report lists them, the one without an id too.
    report = subprocess.run(
        [sys.executable, "-m", "validator", "report", "--state-dir", str(state)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode == 0, report.stderr
    assert "assignment None (task 1): quarantined, a damaged journal row: id" in report.stdout
    record(
        "a version 1 journal with a NULL id, a scored row without metrics, an unknown state, "
        "a wrong type, metrics not an object",
        "migrated: 4 rows set aside with a line each, the one without metrics scored again and "
        "submitted with its metrics; exit 0",
    )
