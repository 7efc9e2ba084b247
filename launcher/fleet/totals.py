"""A fleet's report: each worker's journal summary (what `python -m validator report --json`
says of its volume) added up, and a line per worker. The per-worker summaries are the
validator's own (validator/report/summary.py); only the counts are added here, since medians
and percentiles do not add (`run.py report MODULE --worker K` has a worker's in full)."""

from __future__ import annotations

from collections import Counter, defaultdict

from pydantic import BaseModel

from validator.report.summary import Summary, outcome_table


class Totals(BaseModel):
    assignments: int
    records: int
    # task id -> state or outcome -> count, over every worker
    by_task: dict[str, dict[str, int]]
    # task id -> penalty kind -> results submitted as that penalty, over every worker
    penalties: dict[str, dict[str, int]] = {}


class WorkerSummary(BaseModel):
    worker: int
    state_volume: str
    summary: Summary


class FleetSummary(BaseModel):
    totals: Totals
    workers: list[WorkerSummary]


def add_up(summaries: list[Summary]) -> Totals:
    by_task: dict[str, Counter[str]] = defaultdict(Counter)
    penalties: dict[str, Counter[str]] = defaultdict(Counter)
    for summary in summaries:
        for task, counts in summary.by_task.items():
            by_task[task].update(counts)
        for penalty in summary.penalties:
            penalties[penalty.task_id][penalty.kind] += penalty.count
    return Totals(
        assignments=sum(s.assignments for s in summaries),
        records=sum(s.records for s in summaries),
        by_task={task: dict(sorted(c.items())) for task, c in sorted(by_task.items())},
        penalties={task: dict(sorted(c.items())) for task, c in sorted(penalties.items())},
    )


def outcome_counts(by_task: dict[str, dict[str, int]]) -> dict[str, int]:
    """Every task's counts together: outcome -> count."""
    total: Counter[str] = Counter()
    for counts in by_task.values():
        total.update(counts)
    return dict(sorted(total.items()))


def render_fleet(fleet: FleetSummary) -> str:
    totals = fleet.totals
    lines = [
        f"flock-validator report: {len(fleet.workers)} workers, {totals.assignments} "
        f"assignments, {totals.records} records",
        "",
        "Assignments by task and outcome, all workers:",
        *outcome_table(totals.by_task),
        "",
        "Penalties by task and kind, all workers (a -999 or loss 999, or failed):",
    ]
    lines += [
        f"  task {task}: " + ", ".join(f"{kind} {count}" for kind, count in kinds.items())
        for task, kinds in totals.penalties.items()
    ] or ["  none"]
    lines += ["", "Per worker:"]
    for worker in fleet.workers:
        summary = worker.summary
        counts = ", ".join(f"{o} {n}" for o, n in outcome_counts(summary.by_task).items())
        tasks = ",".join(summary.by_task) or "none"
        lines.append(
            f"  worker {worker.worker} ({worker.state_volume}): {summary.assignments} "
            f"assignments ({counts or 'none'}), tasks {tasks}"
        )
    lines += ["", "One worker's full report: run.py report MODULE --worker K", ""]
    return "\n".join(lines)
