"""What the Fed Ledger simulator and the journal say happened, for the fault suite's checks.

The simulator's request log is the ground truth: it sees every call the validator made, in
order, with the status it answered, so double submits and busy loops are counted there rather
than trusted from the validator's own logs.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devkit.simulator.process import Simulator

LOOKUP = "/tasks/request-validation-assignment/"
UPDATE = "/tasks/update-validation-assignment/"
FINAL = frozenset({"completed", "failed"})


def journal_rows(state_dir: Path) -> dict[str, dict[str, Any]]:
    """The journal's rows by id; none while the validator has not written its schema yet (the
    file exists a moment before its tables do, a moment a busy machine makes long)."""
    path = state_dir / "journal.sqlite3"
    if not path.exists():
        return {}
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        db.row_factory = sqlite3.Row
        tables = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'assignments'").fetchall()
        if not tables:
            return {}
        return {row["id"]: dict(row) for row in db.execute("SELECT * FROM assignments")}


def quarantine_rows(state_dir: Path) -> list[dict[str, Any]]:
    """The rows the journal set aside, as they were, with the reason; oldest first."""
    path = state_dir / "journal.sqlite3"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute("SELECT * FROM quarantine ORDER BY rowid")]


def journal_notes(state_dir: Path, assignment_id: str) -> list[str]:
    """Every note the journal's history holds for an assignment, oldest first."""
    path = state_dir / "journal.sqlite3"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT note FROM events WHERE assignment_id = ? ORDER BY rowid", (assignment_id,)
        )
        return [note for (note,) in rows if note]


def reached_api(request: dict[str, Any]) -> bool:
    """Whether the API itself answered 200 (not a fault that imitates one)."""
    return request["status"] == 200 and request["fault"] in (None, "delay")


def target(request: dict[str, Any], route: str) -> str | None:
    """The task or assignment id a lookup or update request was about, else None."""
    _, sep, rest = request["path"].partition(route)
    return rest if sep else None


@dataclass(frozen=True)
class Ledger:
    """A snapshot of the simulator's state."""

    assignments: dict[str, dict[str, Any]]
    results: list[dict[str, Any]]
    requests: list[dict[str, Any]]

    @classmethod
    def of(cls, sim: Simulator) -> Ledger:
        state = sim.state()
        return cls(
            {str(a["id"]): a for a in state["assignments"]},
            state["submissions"],
            state["requests"],
        )

    def repo(self, assignment_id: str) -> str:
        return self.assignments[assignment_id]["task_submission"]["data"]["hg_repo_id"]

    def api_requests(self, route: str | None = None) -> list[dict[str, Any]]:
        if route is None:
            return [r for r in self.requests if r["path"].startswith("/api/v1/")]
        return [r for r in self.requests if target(r, route) is not None]

    def accepted(self) -> Counter[str]:
        """Updates the API took, per assignment id: more than one is a double submit."""
        taken = Counter(str(result["assignment_id"]) for result in self.results)
        answered = Counter(target(r, UPDATE) for r in self.api_requests(UPDATE) if reached_api(r))
        # Two views of the same thing; they differ only if the simulator itself is wrong.
        assert taken == answered, (taken, answered)
        return taken

    def doubles(self) -> list[str]:
        return sorted(a for a, n in self.accepted().items() if n > 1)

    def repeats(self) -> list[int]:
        """Indexes in `requests` of updates sent again for an assignment the API had already
        taken (answered "not in validating status"): harmless, but each one needs a reason."""
        taken: set[str] = set()
        found = []
        for index, request in enumerate(self.requests):
            assignment = target(request, UPDATE)
            if assignment is None:
                continue
            if reached_api(request):
                taken.add(assignment)
            elif assignment in taken:
                found.append(index)
        return found

    def unfinished(self) -> list[str]:
        return sorted(a for a, row in self.assignments.items() if row["status"] not in FINAL)


def assert_each_submitted_once(
    sim: Simulator, state_dir: Path, expected: int
) -> tuple[Ledger, dict[str, dict[str, Any]]]:
    """Every assignment handed out was submitted exactly once and the journal agrees."""
    ledger = Ledger.of(sim)
    rows = journal_rows(state_dir)
    assert len(ledger.assignments) == expected, ledger.assignments
    assert ledger.unfinished() == [], ledger.assignments
    assert ledger.doubles() == [], ledger.accepted()
    assert set(ledger.accepted()) == set(ledger.assignments)
    assert set(rows) == set(ledger.assignments), rows
    assert {row["state"] for row in rows.values()} == {"submitted"}, rows
    return ledger, rows
