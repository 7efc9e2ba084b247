"""Version 4's indexes and compacted history (validator/state/migrate.py makes them, on a new
journal and on an earlier one alike), and the conditions, as SQL, that the loop, the report and
the compaction share with them.

SQLite uses a partial index only for a query whose WHERE holds the index's condition as it is
written: each condition is written once, here (and entry.py's UNFINISHED, FINISHED), for the
index and its queries. What a loop pass reads (the rows not final, oldest first:
Journal.pending) is an index of those rows alone, so a pass costs the backlog, not the history.
The report (validator/report/journal_figures.py) reads the finished rows by task and outcome,
by hour, the penalties, the latest failures and each task's scores in the order of an index of
each, never sorting every row; a row enters each once, when it is final. An assignment's events,
and a quarantined id, are looked up by index too.
"""

from __future__ import annotations

from validator.state.entry import FINISHED, UNFINISHED

# The hour a row finished in (epoch seconds at its start).
HOUR = "CAST(updated_at / 3600 AS INTEGER) * 3600"
# A score the report counts, and compaction keeps the same way: submitted as completed, not a
# penalty, with a main metric.
IS_SCORE = "state = 'submitted' AND outcome = 'completed' AND penalty IS NULL AND score IS NOT NULL"
# A result submitted as a penalty (a -999, a failure), counted by task and kind.
IS_PENALTY = "state = 'submitted' AND penalty IS NOT NULL"
# One of the latest penalties and failures the report lists: failed, dropped, set aside in place
# (version 1), submitted as failed, or a penalty.
IS_FAILURE = (
    "(state IN ('failed', 'dropped', 'quarantined') OR (state = 'submitted' AND outcome = 'failed')"
    " OR penalty IS NOT NULL)"
)

# The columns `history` and `history_totals` count by (beside the hour).
HISTORY_KEY = "task_id, outcome, penalty_kind, metric"


def _counts(table: str, hour: bool) -> str:
    """A table of a count and its scores' count, sum, min and max per task, outcome, penalty
    kind and main metric, and with `hour` per hour of the finish too."""
    column, key = ("\n    hour INTEGER NOT NULL,", "hour, ") if hour else ("", "")
    return f"""
CREATE TABLE IF NOT EXISTS {table} ({column}
    task_id TEXT NOT NULL,
    outcome TEXT NOT NULL,
    penalty_kind TEXT NOT NULL,
    metric TEXT NOT NULL,
    count INTEGER NOT NULL,
    scores INTEGER NOT NULL,
    score_sum REAL NOT NULL,
    score_min REAL,
    score_max REAL,
    PRIMARY KEY ({key}{HISTORY_KEY})
) WITHOUT ROWID"""


# `history` holds what the report needs of the rows compaction removed (compaction.py): per
# hour of their finish, the counts; `history_totals` the same for all hours, which the report
# adds up.
HISTORY_TABLES = (_counts("history", hour=True), _counts("history_totals", hour=False))
V4_STATEMENTS = f"""
CREATE INDEX IF NOT EXISTS assignments_unfinished ON assignments (module, received_at, id)
    WHERE {UNFINISHED};
CREATE INDEX IF NOT EXISTS assignments_finished ON assignments (task_id, state, outcome)
    WHERE {FINISHED};
CREATE INDEX IF NOT EXISTS assignments_hours ON assignments ({HOUR}, updated_at)
    WHERE {FINISHED};
CREATE INDEX IF NOT EXISTS assignments_penalties ON assignments (task_id, penalty_kind)
    WHERE {IS_PENALTY};
CREATE INDEX IF NOT EXISTS assignments_failures ON assignments (updated_at)
    WHERE {IS_FAILURE};
CREATE INDEX IF NOT EXISTS assignments_scores ON assignments (task_id, metric, score)
    WHERE {IS_SCORE};
CREATE INDEX IF NOT EXISTS events_of_assignment ON events (assignment_id);
CREATE INDEX IF NOT EXISTS quarantine_id ON quarantine (id);
{"".join(f"{table};" for table in HISTORY_TABLES)}
"""
