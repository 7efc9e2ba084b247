"""What the validator did, from its state dir (`python -m validator report --state-dir DIR`,
validator/report/cli.py).

The journal says what happened to every assignment (it is the truth for counts and outcomes);
the records (validator/state/records.py) add seconds per phase, scores and log lines. Plain text by
default, `--json` for machines, `--html FILE` for one self-contained page with plots
(validator/report/html.py).

A penalty (a module's -999 or lora's loss 999, submitted as completed; a failure) is not a score:
the score statistics and the histogram leave them out, and they are counted apart, by task and
kind, each of the latest with its reason.
"""

from __future__ import annotations

import sqlite3
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from validator.state.records import AssignmentRecord, RecordStore, main_metric, outcome_label

JOURNAL_FILE = "journal.sqlite3"
PHASE_ORDER = ("lookup", "download", "load", "data", "wait", "score", "submit")
FINAL = {"submitted", "dropped"}
LATEST_FAILURES = 10
UNRECORDED = "unrecorded"  # a failure's kind, journaled before kinds were (version 3)


class PhaseStats(BaseModel):
    phase: str
    count: int
    median_s: float
    p95_s: float


class ScoreStats(BaseModel):
    task_id: str
    metric: str
    count: int
    min: float
    median: float
    max: float
    mean: float


class PenaltyStats(BaseModel):
    task_id: str
    kind: str  # the journal's penalty_kind; "unrecorded" for a failure before version 3
    count: int


class Failure(BaseModel):
    """One of the latest penalties and failures: a -999, a failed or dropped result, a row set
    aside."""

    id: str
    task_id: str
    time: float
    reason: str
    kind: str | None = None  # the penalty's kind; None: dropped or set aside
    outcome: str = "failed"  # as outcome_label names it


class Summary(BaseModel):
    state_dir: str
    generated_at: float
    assignments: int
    # task id -> state or outcome -> count ("completed" and "failed" for submitted results)
    by_task: dict[str, dict[str, int]]
    # hour (epoch seconds at its start) -> assignments finished in it
    per_hour: dict[int, int]
    phases: list[PhaseStats]
    scores: list[ScoreStats]
    failures: list[Failure]
    records: int
    # Results submitted as penalties, by task and kind (not in `scores`).
    penalties: list[PenaltyStats] = []


def summarize(state_dir: Path, source: str | None = None) -> tuple[Summary, list[AssignmentRecord]]:
    """The summary of `state_dir`, which the report calls `source` (a volume's name, when the
    launcher reads it mounted in a container) if given."""
    rows = journal_rows(state_dir)
    records = scored_records(RecordStore(state_dir).read_all(), rows)
    by_task: dict[str, Counter[str]] = defaultdict(Counter)
    per_hour: Counter[int] = Counter()
    for row in rows:
        by_task[row["task_id"]][outcome_label(row["state"], row["outcome"])] += 1
        if row["state"] in FINAL:
            per_hour[int(row["updated_at"] // 3600 * 3600)] += 1
    summary = Summary(
        state_dir=source or str(state_dir),
        generated_at=time.time(),
        assignments=len(rows),
        by_task={task: dict(sorted(counts.items())) for task, counts in sorted(by_task.items())},
        per_hour=dict(sorted(per_hour.items())),
        phases=phase_stats(records),
        scores=score_stats(records),
        failures=latest_failures(rows),
        records=len(records),
        penalties=penalty_stats(rows),
    )
    return summary, records


# A row the journal set aside, as one in state `quarantined`: its columns may hold anything
# (a NULL id, text for a time), so each is made what the report reads.
QUARANTINED = """
SELECT coalesce(CAST(id AS TEXT), 'None') AS id, coalesce(CAST(task_id AS TEXT), '?') AS task_id,
    'quarantined' AS state, NULL AS outcome, 'quarantined, ' || reason AS error,
    set_aside_at AS updated_at,
    set_aside_at AS received_at
FROM quarantine ORDER BY set_aside_at
"""


def journal_rows(state_dir: Path) -> list[dict[str, Any]]:
    """Every assignment row, and every row set aside as `quarantined`, read-only (the
    validator may be running and writing)."""
    path = state_dir / JOURNAL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no journal at {path}: is {state_dir} a validator's state dir?")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        db.row_factory = sqlite3.Row
        rows = [dict(row) for row in db.execute("SELECT * FROM assignments ORDER BY received_at")]
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        if "quarantine" in tables:  # a journal of version 1 has none (the validator migrates it)
            rows += [dict(row) for row in db.execute(QUARANTINED)]
        return rows
    finally:
        db.close()


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile (no interpolation: a value that occurred)."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * share // 1))  # ceil, at least the first
    return ordered[int(rank) - 1]


def phase_seconds(records: list[AssignmentRecord]) -> dict[str, list[float]]:
    """Every record's seconds, by phase, in the phases' order (unknown ones last)."""
    seconds: dict[str, list[float]] = defaultdict(list)
    for record in records:
        for phase, value in record.phases.items():
            seconds[phase].append(value)
    ordered = [p for p in PHASE_ORDER if p in seconds] + sorted(set(seconds) - set(PHASE_ORDER))
    return {phase: seconds[phase] for phase in ordered}


def phase_stats(records: list[AssignmentRecord]) -> list[PhaseStats]:
    return [
        PhaseStats(
            phase=phase,
            count=len(values),
            median_s=statistics.median(values),
            p95_s=percentile(values, 0.95),
        )
        for phase, values in phase_seconds(records).items()
    ]


def scored_records(
    records: list[AssignmentRecord], rows: list[dict[str, Any]]
) -> list[AssignmentRecord]:
    """The records, each with its penalty as the journal has it (the truth; a record written
    before its row's penalty was, or by an earlier validator, may lack it)."""
    penalties = {row["id"]: row for row in rows if row.get("penalty") is not None}
    found = []
    for record in records:
        row = penalties.get(record.id)
        if row is not None and record.penalty is None:
            record = record.model_copy(
                update={"penalty": row["penalty"], "penalty_kind": row.get("penalty_kind")}
            )
        found.append(record)
    return found


def is_penalty(record: AssignmentRecord) -> bool:
    return record.penalty is not None


def completed_scores(records: list[AssignmentRecord]) -> dict[tuple[str, str], list[float]]:
    """The main metric of every completed record that is a score, not a penalty, by (task,
    metric), sorted."""
    values: dict[tuple[str, str], list[float]] = defaultdict(list)
    for record in records:
        if record.outcome != "completed" or not record.metrics or is_penalty(record):
            continue
        metric = main_metric(record.metrics)
        if metric is not None:
            values[(record.task_id, metric)].append(float(record.metrics[metric]))
    return dict(sorted(values.items()))


def score_stats(records: list[AssignmentRecord]) -> list[ScoreStats]:
    return [
        ScoreStats(
            task_id=task,
            metric=metric,
            count=len(found),
            min=min(found),
            median=statistics.median(found),
            max=max(found),
            mean=statistics.fmean(found),
        )
        for (task, metric), found in completed_scores(records).items()
    ]


def penalty_stats(rows: list[dict[str, Any]]) -> list[PenaltyStats]:
    """Results submitted as penalties, by task and kind."""
    counts: Counter[tuple[str, str]] = Counter(
        (row["task_id"], row.get("penalty_kind") or UNRECORDED)
        for row in rows
        if row["state"] == "submitted" and row.get("penalty") is not None
    )
    return [
        PenaltyStats(task_id=task, kind=kind, count=count)
        for (task, kind), count in sorted(counts.items())
    ]


def latest_failures(rows: list[dict[str, Any]]) -> list[Failure]:
    """The latest penalties (a -999 as a failure), and the results dropped or set aside."""
    failed = [
        row
        for row in rows
        if row["state"] == "failed"
        or (row["state"] == "submitted" and row["outcome"] == "failed")
        or row.get("penalty") is not None
        or row["state"] in ("dropped", "quarantined")
    ]
    failed.sort(key=lambda row: row["updated_at"], reverse=True)
    return [
        Failure(
            id=row["id"],
            task_id=row["task_id"],
            time=row["updated_at"],
            reason=row.get("penalty") or row["error"] or "(no reason recorded)",
            kind=row.get("penalty_kind") or (UNRECORDED if row.get("penalty") else None),
            outcome=outcome_label(row["state"], row["outcome"]),
        )
        for row in failed[:LATEST_FAILURES]
    ]


def render_text(summary: Summary) -> str:
    lines = [
        f"flock-validator report: {summary.state_dir} ({summary.assignments} assignments, "
        f"{summary.records} records), {_when(summary.generated_at)}",
        "",
        "Assignments by task and outcome:",
        *outcome_table(summary.by_task),
        "",
        "Finished per hour (UTC):",
    ]
    lines += [f"  {_when(hour)}  {count}" for hour, count in summary.per_hour.items()] or ["  none"]
    lines += ["", "Seconds per phase (from the records):"]
    lines += [
        f"  {p.phase:<9} n={p.count:<5} median {p.median_s:8.2f}  p95 {p.p95_s:8.2f}"
        for p in summary.phases
    ] or ["  no records"]
    lines += ["", "Scores of completed assignments per task (penalties apart):"]
    lines += [
        f"  task {s.task_id}: {s.metric} n={s.count} min {s.min:.6g} median {s.median:.6g} "
        f"max {s.max:.6g} mean {s.mean:.6g}"
        for s in summary.scores
    ] or ["  none"]
    lines += ["", "Penalties per task and kind (a -999 or loss 999 submitted, or failed):"]
    lines += [f"  task {p.task_id}: {p.kind} {p.count}" for p in summary.penalties] or ["  none"]
    lines += ["", f"Latest penalties and failures (at most {LATEST_FAILURES}):"]
    lines += [
        f"  {_when(f.time)}  assignment {f.id} (task {f.task_id}){_outcome(f)}: {f.reason}"
        for f in summary.failures
    ] or ["  none"]
    return "\n".join(lines) + "\n"


def outcome_grid(by_task: dict[str, dict[str, int]]) -> tuple[list[str], list[list[Any]]]:
    """The task x outcome table of counts: its header (task, then every outcome a task has)
    and a row per task, 0 where a task has none of an outcome."""
    outcomes = sorted({o for counts in by_task.values() for o in counts})
    rows = [[task, *(counts.get(o, 0) for o in outcomes)] for task, counts in by_task.items()]
    return ["task", *outcomes], rows


def outcome_table(by_task: dict[str, dict[str, int]]) -> list[str]:
    """The task x outcome table as text lines (a worker's report, or a fleet's)."""
    header, rows = outcome_grid(by_task)
    return [
        "  " + "  ".join([f"{task:<10}", *(f"{cell:>12}" for cell in cells)])
        for task, *cells in [header, *rows]
    ]


def _outcome(failure: Failure) -> str:
    """The outcome after the id (`, completed (cannot_load)`); nothing where the reason says it
    (`quarantined, ...`)."""
    if failure.reason.startswith(failure.outcome):
        return ""
    return f", {failure.outcome}{f' ({failure.kind})' if failure.kind else ''}"


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(epoch))
