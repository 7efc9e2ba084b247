"""The report as one self-contained HTML page: the summary's tables and three plots
(assignments finished over time, in at most MOST_BARS bars; seconds per phase; the latest
records' score histogram per task: penalties left out, counted in their own table), drawn with
matplotlib and embedded as PNG data, so the file can be mailed or opened offline."""

from __future__ import annotations

import base64
import html
import io
import time
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen
from matplotlib.figure import Figure  # noqa: E402

from validator.report.summary import (  # noqa: E402
    Summary,
    bucket_name,
    buckets,
    completed_scores,
    is_penalty,
    outcome_grid,
    phase_seconds,
)
from validator.state.records import AssignmentRecord  # noqa: E402

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; margin-bottom: 1.5em; }
"""
MOST_BARS = 60
MOST_LABELS = 24


def render_html(summary: Summary, records: list[AssignmentRecord]) -> str:
    generated = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(summary.generated_at))
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<title>flock-validator report</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>flock-validator report</h1>",
        f"<p id='overview'>{_e(summary.state_dir)}: <b id='assignments'>{summary.assignments}"
        f"</b> assignments, {summary.records} records; generated {generated}.</p>",
        "<h2>Assignments by task and outcome</h2>",
        _outcome_table(summary),
        "<h2>Finished over time</h2>",
        _image(_throughput_plot(summary), "assignments finished over time", "plot-throughput"),
        "<h2>Seconds per phase</h2>",
        _phase_table(summary),
        _image(_phase_plot(records), "seconds per phase", "plot-phases"),
        "<h2>Scores per task</h2>",
        "<p>Penalties (a -999 or loss 999, a failure) are not scores: they are counted below.</p>",
        _score_table(summary),
        _image(_score_plot(records), "score histogram per task", "plot-scores"),
        "<h2>Penalties per task and kind</h2>",
        _penalty_table(summary),
        "<h2>Latest penalties and failures</h2>",
        _failure_table(summary),
        "</body></html>",
    ]
    return "\n".join(parts)


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _e(value: object) -> str:
    return html.escape(str(value))


def _table(table_id: str, header: list[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table id='{table_id}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _outcome_table(summary: Summary) -> str:
    header, rows = outcome_grid(summary.by_task)
    return _table("outcomes", [*header, "total"], [[*row, sum(row[1:])] for row in rows])


def _phase_table(summary: Summary) -> str:
    rows = [[p.phase, p.count, f"{p.median_s:.2f}", f"{p.p95_s:.2f}"] for p in summary.phases]
    return _table("phases", ["phase", "count", "median (s)", "p95 (s)"], rows)


def _score_table(summary: Summary) -> str:
    rows = [
        [s.task_id, s.metric, s.count, f"{s.min:.6g}", _g(s.median), f"{s.max:.6g}"]
        for s in summary.scores
    ]
    return _table("scores", ["task", "metric", "count", "min", "median", "max"], rows)


def _penalty_table(summary: Summary) -> str:
    rows = [[p.task_id, p.kind, p.count] for p in summary.penalties]
    return _table("penalties", ["task", "kind", "count"], rows)


def _failure_table(summary: Summary) -> str:
    rows = [
        [
            time.strftime("%Y-%m-%d %H:%M", time.gmtime(f.time)),
            f.id,
            f.task_id,
            f.outcome,
            f.kind or "",
            f.reason,
        ]
        for f in summary.failures
    ]
    header = ["time (UTC)", "assignment", "task", "outcome", "penalty", "reason"]
    return _table("failures", header, rows)


def _image(png: bytes, alt: str, image_id: str) -> str:
    data = base64.b64encode(png).decode()
    return f"<img id='{image_id}' alt='{_e(alt)}' src='data:image/png;base64,{data}'>"


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=90)
    plt.close(figure)
    return buffer.getvalue()


def _throughput_plot(summary: Summary) -> bytes:
    """At most MOST_BARS bars, each of the fewest hours that keeps them so (a year of hours is
    drawn as weeks), with at most MOST_LABELS labelled."""
    figure, axes = plt.subplots(figsize=(8, 2.8))
    width, counted = buckets(summary.per_hour, MOST_BARS)
    axes.bar(range(len(counted)), [count for _, count in counted], color="#4472c4")
    shape = "%m-%d %H:00" if width < 24 else "%Y-%m-%d"
    every = max(1, -(-len(counted) // MOST_LABELS))
    ticks = list(range(0, len(counted), every))
    labels = [time.strftime(shape, time.gmtime(counted[i][0])) for i in ticks]
    axes.set_xticks(ticks, labels, rotation=45, ha="right", fontsize=7)
    axes.set_ylabel(f"assignments per {bucket_name(width)}")
    if not counted:
        axes.text(0.5, 0.5, "nothing finished yet", ha="center", transform=axes.transAxes)
    return _png(figure)


def _phase_plot(records: list[AssignmentRecord]) -> bytes:
    seconds = phase_seconds(records)
    figure, axes = plt.subplots(figsize=(8, 2.8))
    if seconds:
        axes.boxplot(list(seconds.values()), tick_labels=list(seconds), vert=False)
    else:
        axes.text(0.5, 0.5, "no records yet", ha="center", transform=axes.transAxes)
    axes.set_xlabel("seconds")
    return _png(figure)


def _score_plot(records: list[AssignmentRecord]) -> bytes:
    """Scores only: a -999 beside scores near 0.7 would squash them into one bar."""
    scores = completed_scores(records)
    left_out = sum(1 for r in records if r.outcome == "completed" and is_penalty(r))
    figure, axes = plt.subplots(figsize=(8, 2.8))
    for (task, metric), values in scores.items():
        axes.hist(values, bins=20, alpha=0.6, label=f"task {task} ({metric})")
    if scores:
        axes.legend(fontsize=7)
    else:
        axes.text(0.5, 0.5, "no scores yet", ha="center", transform=axes.transAxes)
    if left_out:
        axes.set_title(f"{left_out} penalties left out (their own table)", fontsize=8)
    axes.set_ylabel("assignments")
    return _png(figure)
