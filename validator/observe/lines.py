"""The log lines a person reads about an assignment (docs/operating.md, "Logs a person reads";
a module's start is validator/scoring.py's): short, one per event, each message at most
MAX_LINE characters (the line, with its time, level and logger, under 300). Numbers are rounded
here; the journal and the records keep them whole."""

from __future__ import annotations

from typing import Any

from validator.state.entry import Entry, State
from validator.text import bounded, one_line, short_commit, shortened

MAX_LINE = 245
DIGITS = 5  # significant digits of a metric in the log
MAX_METRICS = 8
MAX_VALUE = 60


def number(value: Any) -> str:
    """A metric as the log shows it: a float rounded, anything else as it is (bounded)."""
    if isinstance(value, float):
        return f"{value:.{DIGITS}g}"
    return bounded(one_line(str(value)), MAX_VALUE)


def metrics_text(metrics: dict[str, Any]) -> str:
    """`name value, ...`, rounded, at most MAX_METRICS of them."""
    shown = [f"{name} {number(value)}" for name, value in list(metrics.items())[:MAX_METRICS]]
    more = len(metrics) - MAX_METRICS
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def phases_text(phases: dict[str, float]) -> str:
    return ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in phases.items())


def result_line(entry: Entry, phases: dict[str, float] | None, commit: str | None) -> str:
    """What an assignment came to, once submitted: its metrics, or why it is a penalty or a
    failure, with where its time went; bounded to MAX_LINE with the assignment's id."""
    took = [f"commit {short_commit(commit)}"] if commit else []
    took += [phases_text(phases)] if phases else []
    tail = f" ({'; '.join(took)})" if took else ""
    if entry.state is State.SUBMITTED and entry.outcome == "failed":
        head = f"submitted as failed ({entry.penalty_kind or 'failed'}): "
        why = entry.penalty or entry.error or "no reason recorded"
    elif entry.penalty is not None:
        head = f"submitted as completed: {metrics_text(entry.metrics or {})}, the network's "
        head += f"penalty ({entry.penalty_kind or 'penalty'}): "
        why = entry.penalty
    else:
        head = "submitted as completed: "
        why = metrics_text(entry.metrics or {})
    return _fit(f"assignment {entry.id}: {head}", tail, why)


def _fit(head: str, tail: str, middle: str) -> str:
    """head + middle + tail in MAX_LINE characters, the middle (a reason, the metrics) cut in
    its middle to fit: a reason's end says what to do."""
    room = max(MAX_LINE - len(head) - len(tail), 0)
    return bounded(head + shortened(middle, room) + tail, MAX_LINE)
