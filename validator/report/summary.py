"""What the validator did, from its state dir (`python -m validator report --state-dir DIR`,
validator/report/cli.py).

The journal says what happened to every assignment (it is the truth for counts, outcomes and
scores), read by SQL aggregates over the rows it keeps in full and its compacted history
(journal_figures.py), in memory and time that do not grow with every row; the records
(validator/state/records.py, at most --records-keep) add seconds per phase, the score histogram
and log lines. Plain text by default, `--json` for machines, `--html FILE` for one
self-contained page with plots (validator/report/html.py).

A penalty (a module's -999 or lora's loss 999, submitted as completed; a failure) is not a score:
the score statistics and the histogram leave them out, and they are counted apart, by task and
kind, each of the latest with its reason.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from validator.report.journal_figures import (
    JOURNAL_FILE,
    LATEST_FAILURES,
    UNRECORDED,
    JournalFigures,
    read_journal,
)
from validator.state.records import AssignmentRecord, RecordStore, main_metric, outcome_label

PHASE_ORDER = ("lookup", "download", "load", "data", "wait", "score", "submit")
# Finished assignments over time, in buckets of the fewest of these hours that keeps their
# number under a cap (the text's lines, the plot's bars); a whole number of weeks past them.
BUCKET_HOURS = (1, 2, 3, 6, 12, 24, 48, 24 * 7)
MOST_LINES = 48


class PhaseStats(BaseModel):
    phase: str
    count: int
    median_s: float
    p95_s: float


class ScoreStats(BaseModel):
    """A task's main metric over every score the journal holds (compacted ones included); the
    median over those kept in full (None when the window keeps none of them)."""

    task_id: str
    metric: str
    count: int
    min: float
    median: float | None
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
    launcher reads it mounted in a container) if given. The journal is read by SQL aggregates
    (journal_figures.py); the records are at most --records-keep files."""
    path = state_dir / JOURNAL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no journal at {path}: is {state_dir} a validator's state dir?")
    stored = RecordStore(state_dir).read_all()
    figures = read_journal(state_dir, [record.id for record in stored])
    records = scored_records(stored, figures.record_penalties)
    by_task = figures.by_task
    summary = Summary(
        state_dir=source or str(state_dir),
        generated_at=time.time(),
        assignments=sum(sum(counts.values()) for counts in by_task.values()),
        by_task={task: dict(sorted(counts.items())) for task, counts in sorted(by_task.items())},
        per_hour=dict(sorted(figures.per_hour.items())),
        phases=phase_stats(records),
        scores=score_stats(figures),
        failures=latest_failures(figures.failures),
        records=len(records),
        penalties=[
            PenaltyStats(task_id=task, kind=kind, count=count)
            for (task, kind), count in sorted(figures.penalties.items())
        ],
    )
    return summary, records


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
    records: list[AssignmentRecord], penalties: dict[str, tuple[str, str | None]]
) -> list[AssignmentRecord]:
    """The records, each with its penalty as the journal has it (the truth; a record written
    before its row's penalty was, or by an earlier validator, may lack it)."""
    found = []
    for record in records:
        known = penalties.get(record.id)
        if known is not None and record.penalty is None:
            record = record.model_copy(update={"penalty": known[0], "penalty_kind": known[1]})
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


def score_stats(figures: JournalFigures) -> list[ScoreStats]:
    """Each task's main metric over every score the journal holds, penalties apart."""
    return [
        ScoreStats(
            task_id=task,
            metric=metric,
            count=found.count,
            min=found.low,
            median=found.median,
            max=found.high,
            mean=found.total / found.count,
        )
        for (task, metric), found in sorted(figures.scores.items())
        if found.count and found.low is not None and found.high is not None
    ]


def latest_failures(rows: list[dict[str, Any]]) -> list[Failure]:
    """The latest penalties (a -999 as a failure), and the results dropped or set aside."""
    return [
        Failure(
            id=str(row["id"]),
            task_id=str(row["task_id"]),
            time=row["updated_at"],
            reason=row.get("penalty") or row["error"] or "(no reason recorded)",
            kind=row.get("penalty_kind") or (UNRECORDED if row.get("penalty") else None),
            outcome=outcome_label(row["state"], row["outcome"]),
        )
        for row in rows
    ]


def buckets(per_hour: dict[int, int], most: int) -> tuple[int, list[tuple[int, int]]]:
    """`per_hour` summed into at most `most` buckets, empty ones included, of the fewest hours
    from BUCKET_HOURS that does it (a whole number of weeks past them): its width in hours, and
    each bucket's start (epoch seconds, UTC-aligned) and count."""
    if not per_hour:
        return 1, []
    first, last = min(per_hour), max(per_hour)
    hours = (last - first) // 3600 + 1
    width = next((w for w in BUCKET_HOURS if -(-hours // w) + 1 <= most), None)
    if width is None:
        week = BUCKET_HOURS[-1]
        width = week * -(-hours // (week * (most - 1)))
    size = width * 3600
    counts: Counter[int] = Counter()
    for hour, count in per_hour.items():
        counts[hour // size * size] += count
    start = first // size * size
    return width, [(at, counts[at]) for at in range(start, last + 1, size)]


def bucket_name(width: int) -> str:
    """What a bucket of `width` hours is called: hour, 6 hours, day, 2 days, week, 4 weeks."""
    if width % (24 * 7) == 0:
        weeks = width // (24 * 7)
        return "week" if weeks == 1 else f"{weeks} weeks"
    if width % 24 == 0:
        return "day" if width == 24 else f"{width // 24} days"
    return "hour" if width == 1 else f"{width} hours"


def render_text(summary: Summary) -> str:
    width, counted = buckets(summary.per_hour, MOST_LINES)
    lines = [
        f"flock-validator report: {summary.state_dir} ({summary.assignments} assignments, "
        f"{summary.records} records), {_when(summary.generated_at)}",
        "",
        "Assignments by task and outcome:",
        *outcome_table(summary.by_task),
        "",
        f"Finished per {bucket_name(width)} (UTC):",
    ]
    lines += [f"  {_when(at)}  {count}" for at, count in counted if count] or ["  none"]
    lines += ["", "Seconds per phase (from the records):"]
    lines += [
        f"  {p.phase:<9} n={p.count:<5} median {p.median_s:8.2f}  p95 {p.p95_s:8.2f}"
        for p in summary.phases
    ] or ["  no records"]
    lines += ["", "Scores of completed assignments per task (penalties apart):"]
    lines += [
        f"  task {s.task_id}: {s.metric} n={s.count} min {s.min:.6g} median {_g(s.median)} "
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


def _g(value: float | None) -> str:
    """A figure, or `-` where the journal keeps none (a median of compacted scores only)."""
    return "-" if value is None else f"{value:.6g}"


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(epoch))
