"""A journal's move between state dirs (launcher/fleet/journal_move.py, which run.py runs in the
module's image): checked by the validator's own journal before anything is trusted, idempotent
when cut short at any step, and, merged by assignment id, never sending a result twice. The
journals are made through the journal's own code; the end-to-end trials through run.py, the
engine and the Fed Ledger simulator are in tests/faults/test_moves.py."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.fleet import journal_move
from launcher.fleet.journal_move import JOURNAL, journal_digest, merge_entry, move
from tests.helpers.damaged_journals import DAMAGES, newer_schema
from validator.state.entry import State
from validator.state.journal import Journal
from validator.state.store import SCHEMA_VERSION

REPO = Path(__file__).resolve().parents[1]
MODULE = "fixture"


def make_journal(state: Path, rows: dict[str, str], maybe_taken: set[str] = frozenset()) -> None:
    """A journal holding each id in its state, written through the journal's transitions."""
    journal = Journal(state)
    try:
        for i, (assignment, wanted) in enumerate(rows.items()):
            entry = journal.receive(assignment, MODULE, "1", {"hg_repo_id": f"ok/{assignment}"})
            if wanted == "received":
                continue
            entry = journal.begin_scoring(entry)
            if wanted == "scoring":
                continue
            if wanted == "failed":
                entry = journal.failed(entry, "cannot load it", "rejected")
            else:
                entry = journal.scored(entry, {"loss": 0.5 + i})
            if assignment in maybe_taken:
                entry = journal.defer_submit(entry, "HTTP 502", 0.0, "HTTP 502: bad gateway")
            if wanted in ("submitted", "dropped"):
                getattr(journal, wanted)(entry, "done")
    finally:
        journal.close()


def states(state: Path) -> dict[str, tuple[str, str | None]]:
    with sqlite3.connect(f"file:{state / JOURNAL}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT id, state, maybe_taken FROM assignments").fetchall()
    db.close()
    return {i: (s, m) for i, s, m in rows}


def test_a_whole_journal_is_placed_and_a_second_move_finds_it_finished(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    make_journal(old, {"a": "scored", "b": "failed", "c": "received", "d": "submitted"})
    before = journal_digest(old)
    outcome = move(old, new, "old-volume", MODULE)
    assert (outcome.outcome, outcome.to_submit, outcome.to_score) == ("moved", 2, 1)
    assert outcome.rows == 4 and outcome.problem is None
    assert states(new) == {
        "a": ("scored", None), "b": ("failed", None), "c": ("received", None),
        "d": ("submitted", None),
    }  # fmt: skip
    assert journal_digest(old) == before  # only ever read
    assert [p.name for p in new.iterdir() if p.name.startswith(".moving")] == []
    again = move(old, new, "old-volume", MODULE)
    assert again.outcome == "finished" and again.problem is None
    assert states(new)["a"] == ("scored", None)


def test_merged_by_id_no_row_goes_back_and_nothing_submitted_or_maybe_taken_is_sent_again(
    tmp_path,
):
    # The advice "run --state-volume OLD once" after a move cut short: both journals hold the
    # same ids, one of them further on.
    old, new = tmp_path / "old", tmp_path / "new"
    make_journal(
        old,
        {"a": "submitted", "b": "scored", "c": "scored", "d": "dropped", "e": "scored",
         "f": "received", "g": "scored"},
        maybe_taken={"e"},
    )  # fmt: skip
    make_journal(
        new, {"a": "scored", "b": "submitted", "c": "received", "d": "scored", "e": "scored"}
    )
    outcome = move(old, new, "old-volume", MODULE)
    assert outcome.outcome == "merged" and outcome.rows == 7
    assert states(new) == {
        "a": ("submitted", None),  # submitted by the old journal's validator: not sent again
        "b": ("submitted", None),  # the new journal's submission stands
        "c": ("scored", None),  # the old decision carried over: not scored again
        "d": ("dropped", None),
        "e": ("scored", "HTTP 502: bad gateway"),  # a repeat refused is known to be this one
        "f": ("received", None),
        "g": ("scored", None),
    }
    assert (outcome.to_submit, outcome.to_score) == (3, 1)
    assert move(old, new, "old-volume", MODULE).outcome == "finished"


def test_merging_an_entry_twice_changes_nothing(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    make_journal(old, {"a": "scored", "b": "submitted"})
    make_journal(new, {})
    source, journal = Journal(old), Journal(new)
    try:
        entries = [source.get("a"), source.get("b")]
        first = [merge_entry(journal, entry, "old") for entry in entries]
        second = [merge_entry(journal, entry, "old") for entry in entries]
        assert [e.state for e in first] == [State.SCORED, State.SUBMITTED]
        assert second == [journal.get("a"), journal.get("b")]
        assert [s for s, _ in journal.events("b")].count("submitted") == 1
    finally:
        source.close()
        journal.close()


def test_a_merged_score_keeps_its_penalty_and_a_penalty_without_a_kind_stays_one(tmp_path):
    # A module's -999 carried into the new journal is still a penalty, of the same kind and
    # reason; a reason with no kind (no journal makes one for a score) is the readers'
    # `unrecorded` penalty, never a plain score; a kind with no reason is no penalty anywhere.
    old, new = tmp_path / "old", tmp_path / "new"
    source = Journal(old)
    try:
        for assignment in ("a", "b", "c"):
            entry = source.receive(assignment, MODULE, "1", {"hg_repo_id": f"ok/{assignment}"})
            source.scored(source.begin_scoring(entry), {"loss": 999.0}, ("cannot_load", "no"))
        carried = source.get("a")
        reason_only = source.get("b").model_copy(update={"penalty_kind": None})
        kind_only = source.get("c").model_copy(update={"penalty": None})
    finally:
        source.close()
    journal = Journal(new)
    try:
        merged = [merge_entry(journal, e, "old") for e in (carried, reason_only, kind_only)]
        assert [(e.state, e.penalty_kind, e.penalty) for e in merged] == [
            (State.SCORED, "cannot_load", "no"),
            (State.SCORED, "unrecorded", "no"),
            (State.SCORED, None, None),
        ]
        assert [e.metrics for e in merged] == [{"loss": 999.0}] * 3
    finally:
        journal.close()


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_journal_that_cannot_be_opened_whole_moves_what_it_can_and_is_kept(tmp_path, damage):
    old, new = tmp_path / "old", tmp_path / "new"
    make_journal(old, {"a": "scored", "b": "scored"})
    spoil, said = DAMAGES[damage]
    spoil(old / JOURNAL)
    before = journal_digest(old)
    outcome = move(old, new, "old-volume", MODULE)
    assert outcome.outcome == "kept" and said in outcome.problem and "/" not in outcome.problem
    assert outcome.rows == 2 and outcome.to_submit == 2  # each row survived the damage
    assert states(new) == {"a": ("scored", None), "b": ("scored", None)}
    assert journal_digest(old) == before
    # The next start: the move is finished, and a row the new journal no longer holds (its
    # retention, or an operator) is never taken from the old one again.
    with sqlite3.connect(new / JOURNAL) as db:
        db.execute("UPDATE assignments SET state = 'submitted', outcome = 'completed'")
        db.execute("DELETE FROM assignments WHERE id = 'a'")
    db.close()
    again = move(old, new, "old-volume", MODULE)
    assert again.outcome == "finished" and said in again.problem
    assert states(new) == {"b": ("submitted", None)}


def test_a_repaired_journal_moves_what_it_then_holds_and_nothing_twice(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    make_journal(old, {"a": "scored", "b": "scored"})
    newer_schema(old / JOURNAL)
    assert move(old, new, "old-volume", MODULE).outcome == "kept"
    with sqlite3.connect(new / JOURNAL) as db:  # submitted by the worker since
        db.execute("UPDATE assignments SET state = 'submitted', outcome = 'completed'")
    db.close()
    with sqlite3.connect(old / JOURNAL) as db:  # the operator repairs it
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    db.close()
    repaired = move(old, new, "old-volume", MODULE)
    assert repaired.outcome == "merged" and repaired.to_submit == 0
    assert set(states(new).values()) == {("submitted", None)}


def run_move(old: Path, new: Path, kill_at: str | None) -> subprocess.CompletedProcess[str]:
    """The move as run.py runs it in the image: its text, given to `python -c`."""
    env = {k: v for k, v in os.environ.items() if k != journal_move.KILL_AT_ENV}
    if kill_at:
        env[journal_move.KILL_AT_ENV] = f"move:{kill_at}"
    env["PYTHONPATH"] = str(REPO)
    script = Path(journal_move.__file__).read_text(encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-c", script, str(old), str(new), "old-volume", MODULE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=old.parent,
    )


@pytest.mark.parametrize("step", ["staged", "placed", "merging"])
def test_a_move_killed_at_each_step_finishes_on_the_next_start_and_takes_nothing_twice(
    tmp_path, step
):
    old, new = tmp_path / "old", tmp_path / "new"
    make_journal(old, {"a": "scored", "b": "failed", "c": "submitted"})
    if step == "merging":  # the new state dir holds a journal of its own: merged row by row
        make_journal(new, {"z": "scored"})
    killed = run_move(old, new, step)
    assert killed.returncode == 137 and killed.stdout == "", killed.stderr
    finished = run_move(old, new, None)
    assert finished.returncode == 0, finished.stderr
    outcome = journal_move.Outcome(**json.loads(finished.stdout))
    # Cut short before its journal was placed, the move starts again; after, the journal there
    # is merged with the old one, which adds nothing.
    assert outcome.outcome == ("moved" if step == "staged" else "merged")
    expected = {"a": ("scored", None), "b": ("failed", None), "c": ("submitted", None)}
    if step == "merging":
        expected["z"] = ("scored", None)
    assert states(new) == expected
    journal = Journal(new)
    try:
        assert [s for s, _ in journal.events("a")].count("scored") == 1
    finally:
        journal.close()
    shutil.rmtree(old)  # as run.py removes the volume once the move is finished
