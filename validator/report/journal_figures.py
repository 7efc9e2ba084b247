"""What the report reads of the journal, aggregated where the data is: SQL over the rows kept in
full and the compacted history (validator/state/compaction.py), never every row in memory.

A journal of any version is read as it is, without migrating it (the validator may be running):
`detail`, a view made on the read-only connection, names every column the queries need, for an
earlier version too (its penalty columns NULL, its main score worked out from the metrics by the
journal's own rule); a table an earlier version lacks (`history`, `quarantine`) is an empty one
made beside it. The median is of the scores kept in full: compacted hours keep sums, not values.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from validator.state.entry import FINISHED, UNFINISHED
from validator.state.migrate import register_scores
from validator.state.records import outcome_label
from validator.state.schema import HISTORY_TABLES, HOUR, IS_FAILURE, IS_PENALTY, IS_SCORE

JOURNAL_FILE = "journal.sqlite3"
LATEST_FAILURES = 10
UNRECORDED = "unrecorded"  # a failure's kind, journaled before kinds were (version 3)
# A row set aside, as the report shows it: its columns may hold anything (a NULL id, text for a
# time), so each is made what the report reads.
QUARANTINED = """
SELECT coalesce(CAST(id AS TEXT), 'None') AS id, coalesce(CAST(task_id AS TEXT), '?') AS task_id,
    'quarantined' AS state, NULL AS outcome, 'quarantined, ' || reason AS error,
    NULL AS penalty, NULL AS penalty_kind, set_aside_at AS updated_at
FROM quarantine ORDER BY set_aside_at DESC, rowid LIMIT ?
"""


@dataclass
class Scores:
    """One task's main metric: count, sum, min and max of every score, the median of those kept
    in full."""

    count: int = 0
    total: float = 0.0
    low: float | None = None
    high: float | None = None
    median: float | None = None

    def add(self, count: int, total: float, low: float | None, high: float | None) -> None:
        self.count += count
        self.total += total
        self.low = min((v for v in (self.low, low) if v is not None), default=None)
        self.high = max((v for v in (self.high, high) if v is not None), default=None)


@dataclass
class JournalFigures:
    by_task: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    per_hour: Counter[int] = field(default_factory=Counter)
    penalties: Counter[tuple[str, str]] = field(default_factory=Counter)
    scores: dict[tuple[str, str], Scores] = field(default_factory=lambda: defaultdict(Scores))
    failures: list[dict[str, Any]] = field(default_factory=list)
    # The penalty (reason, kind) of each of the asked ids that has one: the records' truth.
    record_penalties: dict[str, tuple[str, str | None]] = field(default_factory=dict)


def read_journal(state_dir: Path, record_ids: list[str]) -> JournalFigures:
    """The journal's figures, read-only (the validator may be running and writing)."""
    path = state_dir / JOURNAL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no journal at {path}: is {state_dir} a validator's state dir?")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        _views(db)
        figures = JournalFigures()
        _counts(db, figures)
        _history(db, figures)
        _scores(db, figures)
        figures.failures = _latest_failures(db)
        figures.record_penalties = _penalties_of(db, record_ids)
        return figures
    finally:
        db.close()


def _views(db: sqlite3.Connection) -> None:
    """`detail`, `history` and `quarantine` as the queries read them, whatever the version."""
    columns = {row[1] for row in db.execute("PRAGMA main.table_info(assignments)")}
    tables = {row[0] for row in db.execute("SELECT name FROM main.sqlite_master")}

    def column(name: str, otherwise: str) -> str:
        return name if name in columns else otherwise

    register_scores(db)
    db.execute(
        "CREATE TEMP VIEW detail AS SELECT rowid AS row_key, id, task_id, state, outcome, error,"
        " received_at, updated_at,"
        f" {column('penalty', 'NULL')} AS penalty,"
        f" {column('penalty_kind', 'NULL')} AS penalty_kind,"
        f" {column('metric', 'main_metric(metrics)')} AS metric,"
        f" {column('score', 'main_score(metrics)')} AS score"
        " FROM main.assignments"
    )
    if "history" not in tables:
        for table in HISTORY_TABLES:
            db.execute(table.replace("CREATE TABLE IF NOT EXISTS", "CREATE TEMP TABLE"))
    if "quarantine" not in tables:  # version 1: rows were marked in place, migrated on open
        db.execute("CREATE TEMP TABLE quarantine (id, task_id, reason, set_aside_at)")


def _counts(db: sqlite3.Connection, figures: JournalFigures) -> None:
    """Counts by task and outcome, finished per hour, penalties by task and kind: the rows kept
    in full, each count in the order of its index (validator/state/schema.py), the history's
    hours, the rows set aside."""
    for where in (FINISHED, UNFINISHED):
        for task_id, state, outcome, count in db.execute(
            f"SELECT task_id, state, outcome, count(*) FROM detail WHERE {where} GROUP BY 1, 2, 3"
        ):
            figures.by_task[task_id][outcome_label(state, outcome)] += count
    for task_id, kind, count in db.execute(
        f"SELECT task_id, coalesce(penalty_kind, '{UNRECORDED}'), count(*) FROM detail"
        f" WHERE {IS_PENALTY} GROUP BY task_id, penalty_kind"
    ):
        figures.penalties[(task_id, kind)] += count
    hours = f"SELECT {HOUR}, count(*) FROM detail WHERE {FINISHED} GROUP BY {HOUR}"
    for query in (hours, "SELECT hour, sum(count) FROM history GROUP BY hour"):
        for hour, count in db.execute(query):
            figures.per_hour[int(hour)] += count
    for task_id, count in db.execute(
        "SELECT coalesce(CAST(task_id AS TEXT), '?'), count(*) FROM quarantine GROUP BY 1"
    ):
        figures.by_task[task_id]["quarantined"] += count


def _history(db: sqlite3.Connection, figures: JournalFigures) -> None:
    """The compacted rows' counts, penalties and scores, from their totals."""
    for task_id, outcome, kind, metric, count, scores, total, low, high in db.execute(
        "SELECT task_id, outcome, penalty_kind, metric, count, scores, score_sum, score_min,"
        " score_max FROM history_totals"
    ):
        figures.by_task[task_id][outcome] += count
        if outcome != "dropped" and kind:
            figures.penalties[(task_id, kind)] += count
        if metric and scores:
            figures.scores[(task_id, metric)].add(scores, total, low, high)


def _scores(db: sqlite3.Connection, figures: JournalFigures) -> None:
    """Each task's scores kept in full (penalties apart), in the order of their index where the
    journal has it, and their median."""
    kept: dict[tuple[str, str], int] = {}  # scores in full, by task and metric
    for task_id, metric, count, total, low, high in db.execute(
        "SELECT task_id, metric, count(*), total(score), min(score), max(score) FROM detail"
        f" WHERE {IS_SCORE} GROUP BY task_id, metric"
    ):
        figures.scores[(task_id, metric)].add(count, total, low, high)
        kept[(task_id, metric)] = count
    indexed = db.execute(
        "SELECT 1 FROM main.sqlite_master WHERE name = 'assignments_scores'"
    ).fetchone()
    middle = _middles_by_index(db, kept) if indexed else _middles_by_window(db)
    for key, values in middle.items():
        if values:
            figures.scores[key].median = sum(values) / len(values)


def _middles_by_index(
    db: sqlite3.Connection, counts: dict[tuple[str, str], int]
) -> dict[tuple[str, str], list[float]]:
    """The middle one or two of each task's sorted scores, read at their place in the index."""
    return {
        (task_id, metric): [
            row[0]
            for row in db.execute(
                f"SELECT score FROM detail WHERE {IS_SCORE} AND task_id = ? AND metric = ?"
                " ORDER BY score LIMIT ? OFFSET ?",
                (task_id, metric, 2 - count % 2, (count - 1) // 2),
            )
        ]
        for (task_id, metric), count in counts.items()
        if count
    }


def _middles_by_window(db: sqlite3.Connection) -> dict[tuple[str, str], list[float]]:
    """The same, for a journal of an earlier version (no index): one sort of the scores."""
    middle: dict[tuple[str, str], list[float]] = defaultdict(list)
    for task_id, metric, score in db.execute(
        "SELECT task_id, metric, score FROM (SELECT task_id, metric, score,"
        " row_number() OVER (PARTITION BY task_id, metric ORDER BY score) AS k,"
        " count(*) OVER (PARTITION BY task_id, metric) AS n"
        f" FROM detail WHERE {IS_SCORE}) WHERE k IN ((n + 1) / 2, (n + 2) / 2)"
    ):
        middle[(task_id, metric)].append(score)
    return middle


def _latest_failures(db: sqlite3.Connection) -> list[dict[str, Any]]:
    """The latest penalties (a -999 as a failure), results dropped or failed, rows set aside."""
    db.row_factory = sqlite3.Row
    found = db.execute(
        "SELECT id, task_id, state, outcome, error, penalty, penalty_kind, updated_at FROM detail"
        f" WHERE {IS_FAILURE} ORDER BY updated_at DESC LIMIT ?",
        (LATEST_FAILURES,),
    ).fetchall()
    found += db.execute(QUARANTINED, (LATEST_FAILURES,)).fetchall()
    db.row_factory = None
    rows = [dict(row) for row in found]
    # Stable: on a tie the journal's rows first. A damaged time (text) as the oldest.
    rows.sort(key=lambda row: _time(row["updated_at"]), reverse=True)
    return rows[:LATEST_FAILURES]


def _time(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else float("-inf")


def _penalties_of(db: sqlite3.Connection, ids: list[str]) -> dict[str, tuple[str, str | None]]:
    rows = db.execute(
        "SELECT id, penalty, penalty_kind FROM detail WHERE penalty IS NOT NULL"
        " AND id IN (SELECT value FROM json_each(?))",
        (json.dumps(ids),),
    )
    return {row[0]: (row[1], row[2]) for row in rows}
