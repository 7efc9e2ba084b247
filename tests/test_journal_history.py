"""A journal of a long history costs what its backlog costs: a loop pass reads the unfinished
rows through their index, a start reads a few pages, a migration reads each row once, the report
aggregates in SQL; rows older than the retention window are compacted into what the report shows,
and the space they took is given back.

Big journals are a seed written through the journal's code, copied by SQL (devkit/journals.py);
costs are counted, not timed: SQLite's plans and VM steps, bytes read, Python's peak memory.
"""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
import statistics
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from devkit.journals import file_bytes, spread, write_seed
from tests.helpers.loop import MODULE
from validator.entrypoint import main as validator_main
from validator.errors import ExitCode, JournalBroken
from validator.report.journal_figures import _views as journal_views
from validator.report.summary import buckets, render_text, summarize
from validator.state import compaction, store
from validator.state.entry import UNDECIDED, UNSUBMITTED
from validator.state.journal import Journal
from validator.state.store import SCHEMA_V2, SCHEMA_V3
from validator.state.upkeep import DAY, Upkeep

JOURNAL = "journal.sqlite3"
SEED = 60
TASKS = 3


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    """A state dir of SEED finished assignments (every outcome), written through the journal."""
    folder = tmp_path_factory.mktemp("seed")
    write_seed(folder, SEED, tasks=TASKS, module=MODULE)
    return folder


def journal_of(seed: Path, folder: Path, copies: int, span_days: float = 100) -> Path:
    """`folder` holding the seed copied `copies` times over the last `span_days` days."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(seed / JOURNAL, folder / JOURNAL)
    spread(folder, copies, span_days * DAY)
    return folder


@pytest.fixture
def traced(monkeypatch) -> Iterator[list[sqlite3.Connection]]:
    """Every connection this test opens, each keeping the SQL it ran (`.statements`) and its
    VM steps (`.steps`, counted by SQLite's progress handler every 10 instructions)."""
    opened: list[sqlite3.Connection] = []
    connect = sqlite3.connect

    class Counted(sqlite3.Connection):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.statements: list[str] = []
            self.steps = 0
            self.set_trace_callback(self.statements.append)
            self.set_progress_handler(self._step, 10)

        def _step(self) -> int:
            self.steps += 1
            return 0

    def counted(*args, **kwargs) -> sqlite3.Connection:
        db = connect(*args, factory=Counted, **kwargs)
        opened.append(db)
        return db

    monkeypatch.setattr(sqlite3, "connect", counted)
    yield opened


def plans(path: Path, statements: list[str]) -> dict[str, list[str]]:
    """SQLite's plan of each distinct statement that reads a table (the report's view of the
    journal made, for the report's)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        journal_views(db)
        found = {}
        for sql in dict.fromkeys(statements):
            if sql.split(None, 1)[0].upper() in ("SELECT", "UPDATE", "DELETE", "INSERT", "WITH"):
                found[sql] = [row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}")]
        return found
    finally:
        db.close()


# --- a loop pass, a start, a migration ------------------------------------------------------


def test_a_loop_pass_reads_only_the_unfinished_rows_through_their_index(loop, seed, traced):
    """Every statement the loop runs for a pass or an assignment, on a journal with a history:
    none scans assignments or events whole, none sorts rows in a temporary B-tree."""
    journal_of(seed, loop.state_dir, copies=5)
    loop.submission("1", "a", 0.5)
    loop.submission("1", "b", RuntimeError("a bug"), 0.25)  # retried after --time-sleep
    opened = len(traced)
    assert loop.run(["1"], max_assignments=2) == ExitCode.OK
    assert [taken[1] for taken in loop.ledger.taken()] == ["completed", "completed"]
    statements = [sql for db in traced[opened:] for sql in db.statements]
    # The daily upkeep reads the table in bounded steps by rowid, and compacts what a step read
    # (its rows named in a JSON list): apart, below.
    upkeep = [sql for sql in statements if "WHERE rowid >" in sql or "json_each" in sql]
    path = loop.state_dir / JOURNAL
    found = plans(path, [sql for sql in statements if sql not in upkeep])
    assert any("assignments_unfinished" in " ".join(plan) for plan in found.values())
    for sql, plan in found.items():
        for step in plan:
            whole = step.startswith(("SCAN assignments", "SCAN events"))
            assert not whole or "assignments_unfinished" in step, (sql, plan)
            # (The few rows set aside, in `quarantine`, are read at start and sorted.)
            if "quarantine" not in sql:
                assert "TEMP B-TREE" not in step, (sql, plan)
    compacted = plans(path, upkeep)
    assert any("INSERT INTO history" in sql for sql in compacted)
    for sql, plan in compacted.items():
        for step in plan:
            assert not step.startswith(("SCAN assignments", "SCAN events")), (sql, plan)
        if "WHERE rowid >" in sql:
            assert sql.endswith(f"LIMIT {compaction.STEP_ROWS}"), sql


def test_pending_costs_the_same_whatever_the_history(seed, tmp_path, traced):
    """VM steps of one read of the backlog: the same on a journal with 40 times the history."""
    steps = []
    for copies in (1, 40):
        state = journal_of(seed, tmp_path / str(copies), copies)
        journal = Journal(state, min_free_mb=0)
        for name in ("u1", "u2", "u3"):
            journal.receive(name, MODULE, "1", {"name": name})
        db = traced[-1]
        before = db.steps
        assert [e.id for e in journal.pending(MODULE, UNDECIDED + UNSUBMITTED)] == [
            "u1",
            "u2",
            "u3",
        ]
        steps.append(db.steps - before)
        journal.close()
    assert steps[1] <= steps[0] * 1.1 + 5, steps


def read_bytes() -> int:
    """Bytes this process has read through read() and its kin (page cache included)."""
    io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(io["rchar"])


def test_a_start_reads_a_few_pages_whatever_the_history(seed, tmp_path):
    state = journal_of(seed, tmp_path, copies=100)
    size = file_bytes(state)
    assert size > 2_000_000
    before = read_bytes()
    journal = Journal(state, min_free_mb=0)
    read = read_bytes() - before
    journal.close()
    assert read < size / 20, (read, size)


def corrupt_a_middle_page(path: Path) -> None:
    """A page in the middle of the file overwritten: a disk's damage no cheap check finds."""
    with path.open("rb") as file:
        page_size = int.from_bytes(file.read(100)[16:18], "big")
    pages = path.stat().st_size // page_size
    with path.open("r+b") as file:
        file.seek(page_size * (pages // 2))
        file.write(b"\xa5" * page_size)


def test_a_damaged_page_is_found_by_the_whole_check_and_the_daily_upkeep(loop, seed, caplog):
    """The start checks cost the same at any size, so a damaged page among old rows passes
    them; the whole-file check finds it (the API for a copied journal), and the upkeep, at the
    first idle moment, stops the validator with exit 3 as a start would."""
    journal_of(seed, loop.state_dir, copies=40)
    path = loop.state_dir / JOURNAL
    corrupt_a_middle_page(path)
    assert store.check(path, 1.0) == "ready"
    with pytest.raises(JournalBroken, match="quick_check finds it damaged"):
        store.check(path, 1.0, whole=True)
    with caplog.at_level(logging.ERROR):
        assert loop.run(["1"]) == ExitCode.OPERATOR
    assert f"journal {path} is broken: SQLite's quick_check finds it damaged" in caplog.text
    assert len(loop.ledger.lookups) == 1  # the first lookup, then the first idle moment


V2_INSERT = (
    "INSERT INTO assignments (id, module, task_id, state, input, metrics, outcome, error,"
    " received_at, updated_at) VALUES (?, 'lora', '12', 'submitted', '{}', NULL, 'failed',"
    " 'submit: HTTP 503', 1.0, 2.0)"
)


def v2_journal(folder: Path, failed: int) -> Path:
    folder.mkdir()
    with sqlite3.connect(folder / JOURNAL) as db:
        db.executescript(SCHEMA_V2 + "PRAGMA user_version = 2;")
        for index in range(failed):
            db.execute(V2_INSERT, (str(index),))
            trail = (("received", "task 12"), ("failed", f"bad {index}"), ("submitted", "failed"))
            for state, note in trail:
                db.execute("INSERT INTO events VALUES (?, 1.5, ?, ?)", (str(index), state, note))
    db.close()
    return folder


def test_a_migration_costs_what_the_journal_holds(tmp_path, traced):
    """Version 2 to this one: each failed result's reason is looked up in the events by index
    (without one, every event is read for every failure: hours for a million rows)."""
    steps = []
    for failed in (100, 400):
        state = v2_journal(tmp_path / str(failed), failed)
        opened = len(traced)
        Journal(state, min_free_mb=0).close()
        steps.append(sum(db.steps for db in traced[opened:]))
        with sqlite3.connect(state / JOURNAL) as db:
            reason = db.execute("SELECT penalty FROM assignments WHERE id = '7'").fetchone()
        db.close()
        assert reason == ("bad 7",)
    assert steps[1] < 6 * steps[0], steps  # 4 times the rows: linear, not 16 times


def test_a_version_3_journal_gains_its_scores_and_indexes(tmp_path):
    with sqlite3.connect(tmp_path / JOURNAL) as db:
        db.executescript(SCHEMA_V3 + "PRAGMA user_version = 3;")
        insert = (
            "INSERT INTO assignments (id, module, task_id, state, input, metrics, outcome,"
            " received_at, updated_at) VALUES (?, 'lora', '12', 'submitted', '{}', ?, ?, 1.0, 2.0)"
        )
        db.execute(insert, ("1", '{"loss": 0.25, "bpc": 1}', "completed"))
        db.execute(insert, ("2", '{"valid": true, "loss": Infinity}', "completed"))
        db.execute(insert, ("3", None, "failed"))
    db.close()
    before = summarize(tmp_path)[0]  # read as it is, not migrated
    Journal(tmp_path, min_free_mb=0).close()
    with sqlite3.connect(tmp_path / JOURNAL) as db:
        rows = db.execute("SELECT id, metric, score FROM assignments ORDER BY id").fetchall()
        names = db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        indexes = {row[0] for row in names}
    db.close()
    assert rows == [("1", "loss", 0.25), ("2", "loss", float("inf")), ("3", None, None)]
    assert {"assignments_unfinished", "events_of_assignment"} <= indexes
    after = summarize(tmp_path)[0]
    assert before.scores == after.scores and after.scores[0].count == 2


# --- the report ---------------------------------------------------------------------------


def test_the_report_holds_the_same_memory_for_100_times_the_rows(seed, tmp_path):
    """Over the same day (the report keeps a count per hour of history, not per row)."""
    small = journal_of(seed, tmp_path / "small", copies=1, span_days=1)
    big = journal_of(seed, tmp_path / "big", copies=100, span_days=1)
    summarize(small)  # imports and first-use caches, outside the measure
    peaks = []
    for state in (small, big):
        tracemalloc.start()
        summary, _ = summarize(state)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert summary.assignments == 100 * SEED
    assert peaks[1] < 1.5 * peaks[0] + 100_000, peaks


def test_the_report_reads_the_rows_through_indexes_and_sorts_none(seed, tmp_path, traced):
    """Each count, score and failure of the report comes in the order of an index: no table
    scan, no sort of every row (the rows not final, few, are the only ones sorted)."""
    state = journal_of(seed, tmp_path, copies=5)
    journal = Journal(state, min_free_mb=0)
    journal.receive("u1", MODULE, "1", {"name": "u1"})
    journal.close()
    opened = len(traced)
    summarize(state)
    statements = [sql for db in traced[opened:] for sql in db.statements]
    found = plans(state / JOURNAL, statements)
    rows = {sql: plan for sql, plan in found.items() if "FROM detail" in sql}
    assert len(rows) >= 8, found
    for sql, plan in rows.items():
        unfinished = any("assignments_unfinished" in step for step in plan)
        for step in plan:
            assert not step.startswith("SCAN main.assignments") or "INDEX" in step, (sql, plan)
            assert unfinished or "TEMP B-TREE" not in step, (sql, plan)


def test_finished_assignments_over_a_year_are_drawn_in_a_bounded_number_of_bars():
    start = 1_800_000_000 // 3600 * 3600
    year = {start + hour * 3600: 1 for hour in range(365 * 24)}
    width, bars = buckets(year, 60)
    assert len(bars) <= 60 and sum(count for _, count in bars) == len(year)
    assert width == 24 * 7
    assert buckets({start: 3, start + 3600: 2}, 60) == (1, [(start, 3), (start + 3600, 2)])


# --- retention ----------------------------------------------------------------------------


def figures(state: Path) -> dict:
    summary = summarize(state)[0].model_dump()
    summary.pop("generated_at")
    for score in summary["scores"]:
        score["mean"] = round(score["mean"], 9)
        score.pop("median")
    return summary


def kept_medians(state: Path) -> dict[str, float]:
    """Each task's median loss among the scores kept in full, by Python's statistics."""
    with sqlite3.connect(state / JOURNAL) as db:
        rows = db.execute(
            "SELECT task_id, metrics FROM assignments WHERE state = 'submitted'"
            " AND outcome = 'completed' AND penalty IS NULL"
        ).fetchall()
    db.close()
    losses: dict[str, list[float]] = {}
    for task_id, metrics in rows:
        losses.setdefault(task_id, []).append(json.loads(metrics)["loss"])
    return {task: statistics.median(values) for task, values in losses.items()}


def test_rows_past_the_window_are_compacted_into_what_the_report_shows(loop, seed):
    """A validator with 100 days of history and --journal-keep-days 30: at its first idle
    moment the older finished rows become the history's counts and scores; the report says the
    same (the median: of the scores kept in full), an unfinished row of any age stays, the
    events of compacted rows go, and the file gives its space back."""
    state = journal_of(seed, loop.state_dir, copies=10)
    old = time.time() - 90 * DAY
    journal = Journal(state, min_free_mb=0)
    waiting = journal.scored(journal.receive("other-1", "other", "9", {}), {"loss": 1.0})
    journal.close()
    with sqlite3.connect(state / JOURNAL) as db:
        moved = (old, old, waiting.id)
        db.execute("UPDATE assignments SET received_at = ?, updated_at = ? WHERE id = ?", moved)
    db.close()
    before, size = figures(state), file_bytes(state)
    assert loop.run(["1"], horizon=600) == ExitCode.OK
    assert figures(state) == before
    summary = summarize(state)[0]
    assert {s.task_id: s.median for s in summary.scores} == kept_medians(state)
    with sqlite3.connect(state / JOURNAL) as db:
        oldest = db.execute("SELECT min(updated_at) FROM assignments WHERE module = ?", (MODULE,))
        assert oldest.fetchone()[0] > time.time() - 31 * DAY
        other = db.execute("SELECT state FROM assignments WHERE id = 'other-1'").fetchall()
        assert other == [("scored",)]
        orphans = "SELECT count(*) FROM events WHERE assignment_id NOT IN"
        assert db.execute(f"{orphans} (SELECT id FROM assignments)").fetchone() == (0,)
        assert db.execute("SELECT sum(count) FROM history").fetchone()[0] > SEED * 5
    db.close()
    assert file_bytes(state) < size * 0.6


def test_a_compaction_step_is_one_transaction_of_a_bounded_number_of_rows(seed, tmp_path):
    state = journal_of(seed, tmp_path, copies=3, span_days=90)  # 2 copies past 30 days
    with sqlite3.connect(state / JOURNAL) as db:
        db.execute("CREATE TABLE hold (fail INTEGER)")
        db.execute("INSERT INTO hold VALUES (1)")
        db.execute(
            "CREATE TRIGGER refuse BEFORE DELETE ON events WHEN (SELECT fail FROM hold)"
            " BEGIN SELECT RAISE(ABORT, 'a crash in the middle'); END"
        )
    db.close()
    journal = Journal(state, min_free_mb=0)
    upkeep = Upkeep(journal, 30, step_rows=25)

    def count(sql: str) -> int:
        return journal.maintain(lambda db: db.execute(sql).fetchone()[0])

    assert upkeep.step(time.time())  # the whole-file check
    with pytest.raises(sqlite3.IntegrityError, match="a crash in the middle"):  # noqa: PT012
        for _ in range(10):  # the seed's own rows are first, and recent: nothing to compact
            upkeep.step(time.time())
    assert (count("SELECT count(*) FROM assignments"), count("SELECT count(*) FROM history")) == (
        3 * SEED,
        0,
    )
    journal.maintain(lambda db: db.execute("UPDATE hold SET fail = 0"))
    upkeep = Upkeep(journal, 30, step_rows=25)
    left = [count("SELECT count(*) FROM assignments")]
    while upkeep.step(time.time()):
        left.append(count("SELECT count(*) FROM assignments"))
    journal.close()
    gone = [a - b for a, b in zip(left, left[1:], strict=False)]
    assert max(gone) <= 25 and left[-1] == SEED, left


def test_an_earlier_validators_file_is_written_anew_where_there_is_room(seed, tmp_path, caplog):
    """A journal made before this version keeps its free pages until VACUUM: done at the upkeep
    when there is room above the floor, said once otherwise (the file keeps its size)."""
    sizes = []
    for name, floor in (("room", 0), ("no-room", 1 << 30)):
        state = journal_of(seed, tmp_path / name, copies=10)
        with sqlite3.connect(state / JOURNAL, isolation_level=None) as db:
            db.execute("PRAGMA auto_vacuum = NONE")
            db.execute("VACUUM")
        db.close()
        journal = Journal(state, min_free_mb=floor)
        size = file_bytes(state)
        upkeep = Upkeep(journal, 30)
        with caplog.at_level(logging.INFO):
            while upkeep.step(time.time()):
                pass
        mode = journal.maintain(lambda db: db.execute("PRAGMA auto_vacuum").fetchone()[0])
        journal.close()
        sizes.append((mode, file_bytes(state) / size))
    assert sizes[0][0] == 2 and sizes[0][1] < 0.5, sizes
    assert sizes[1][0] == 0 and sizes[1][1] >= 0.95, sizes
    assert "free pages, kept for its next rows" in caplog.text
    assert "written anew" in caplog.text


def test_the_retention_window_is_an_option_with_a_variable(monkeypatch):
    monkeypatch.setenv("VALIDATOR_JOURNAL_KEEP_DAYS", "7")
    context = validator_main.make_context("validator", ["fixture", "--task_ids", "1"])
    assert context.params["journal_keep_days"] == 7
    with pytest.raises(click.BadParameter, match="not in the range") as refused:
        validator_main.make_context(
            "validator", ["fixture", "--task_ids", "1", "--journal-keep-days", "-1"]
        )
    assert refused.value.param is not None and refused.value.param.name == "journal_keep_days"


def test_the_text_report_of_a_year_has_a_bounded_number_of_lines(seed, tmp_path):
    state = journal_of(seed, tmp_path, copies=365, span_days=365)
    text = render_text(summarize(state)[0])
    over_time = text.split("(UTC):\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert 20 < len(over_time) <= 48 and "Finished per 2 weeks (UTC):" in text
