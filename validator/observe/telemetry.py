"""The validator's Prometheus metrics (docs/observing.md "Observing a validator" lists them).
One registry per process, served at `/metrics` by status_server.py when `--http-port` is set."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from validator.disk import free_bytes
from validator.scope import HOST_PHASES
from validator.scope import PENALTY_KINDS as KIT_PENALTY_KINDS
from validator.state.entry import FAILED_KINDS

REGISTRY = CollectorRegistry(auto_describe=True)
PREFIX = "flock_validator"
# Seconds, from a quick lookup to a 7B assignment's scoring.
PHASE_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 3600)

ASSIGNMENTS = Counter(
    f"{PREFIX}_assignments",
    "Assignments finished, by task and outcome (completed, failed: submitted as such; dropped: "
    "the API would not take the result)",
    ["task", "outcome"],
    registry=REGISTRY,
)
PHASE_SECONDS = Histogram(
    f"{PREFIX}_phase_seconds",
    "Seconds per phase of an assignment: lookup, download, load, data, wait, score, submit",
    ["phase"],
    buckets=PHASE_BUCKETS,
    registry=REGISTRY,
)
LOOKUPS = Counter(
    f"{PREFIX}_lookups",
    "Assignment lookups by task and answer (assignment, no_submissions, rate_limited, "
    "unknown_task, unexpected, unavailable)",
    ["task", "answer"],
    registry=REGISTRY,
)
PENALTIES = Counter(
    f"{PREFIX}_penalties",
    "Results submitted as a penalty rather than a score, by task and kind: the module's "
    "(over_max_params, cannot_load, no_score: a -999 or lora's loss 999, submitted as "
    "completed) or a failure's (rejected, invalid_input, unexpected, crashed)",
    ["task", "kind"],
    registry=REGISTRY,
)
TASK_SET_ASIDE = Gauge(
    f"{PREFIX}_task_set_aside",
    "1 while a task is set aside: the Fed Ledger answered two of its lookups in a row that it "
    "does not know it (404 Task not found); it is looked up again hourly while the others go on",
    ["task"],
    registry=REGISTRY,
)
API_ERRORS = Counter(
    f"{PREFIX}_api_errors",
    "Fed Ledger calls that ended without an answer to use, by call and kind",
    ["call", "kind"],
    registry=REGISTRY,
)
API_ANSWERS = Counter(
    f"{PREFIX}_api_answers",
    "HTTP answers of the Fed Ledger, every try's, by call and status (429: its rate limit)",
    ["call", "status"],
    registry=REGISTRY,
)
API_RETRIES = Counter(
    f"{PREFIX}_api_retries",
    "Fed Ledger tries made again within a call, by call and what the previous try met",
    ["call", "kind"],
    registry=REGISTRY,
)
BACKLOG = Gauge(
    f"{PREFIX}_backlog",
    "Assignments in the journal waiting to be scored (undecided) or submitted (unsubmitted)",
    ["kind"],
    registry=REGISTRY,
)
LAST_SUBMIT = Gauge(
    f"{PREFIX}_last_submit_timestamp_seconds",
    "When a result was last taken by the API (Unix time; 0: none yet in this process)",
    registry=REGISTRY,
)
LAST_PROGRESS = Gauge(
    f"{PREFIX}_last_progress_timestamp_seconds",
    "When the loop last made progress (a lookup, a phase, a submit); /healthz reads it",
    registry=REGISTRY,
)
SCORING = Gauge(
    f"{PREFIX}_scoring",
    "1 while an assignment is being scored",
    registry=REGISTRY,
)
STATE_DIR_FREE = Gauge(
    f"{PREFIX}_state_dir_free_bytes",
    "Bytes free on the state dir's file system, as the disk guard reads them (statvfs, at "
    "each scrape)",
    registry=REGISTRY,
)
STATE_DIR_FLOOR = Gauge(
    f"{PREFIX}_state_dir_floor_bytes",
    "The free space the state dir must keep (--min-free-mb): below it, the validator stops "
    "before asking for work",
    registry=REGISTRY,
)


# The label values the loop can give, so that every series exists from start-up.
OUTCOMES = ("completed", "failed", "dropped")
# The kinds of a penalty: the kit's (a module's) and the runner's (a failure); a failure
# journaled before its kind was kept counts as `unrecorded`.
PENALTY_KINDS = (*KIT_PENALTY_KINDS, *FAILED_KINDS)
UNRECORDED = "unrecorded"
LOOKUP_ANSWERS = (
    "assignment",
    "no_submissions",
    "rate_limited",
    "unknown_task",
    "unexpected",
    "unavailable",
)
PHASES = ("lookup", *HOST_PHASES, "score", "submit")
# The statuses an answer is counted under; any other under its class (2xx...), so that a proxy
# answering odd codes cannot grow the series without bound.
API_STATUSES = frozenset({200, 400, 401, 403, 404, 408, 409, 422, 429, 500, 502, 503, 504})
API_CALLS = ("lookup", "submit", "tasks_list")


def status_label(status: int) -> str:
    """The `status` label of an HTTP answer's code."""
    if status in API_STATUSES:
        return str(status)
    return f"{status // 100}xx" if 100 <= status < 600 else "other"


def watch_state_dir(state_dir: Path, floor_bytes: int) -> None:
    """The state dir's free space, read at each scrape, beside its floor."""
    STATE_DIR_FLOOR.set(floor_bytes)

    def free() -> float:
        try:
            return float(free_bytes(state_dir))
        except OSError:
            return float("nan")

    STATE_DIR_FREE.set_function(free)


def start_series(task_ids: Iterable[str]) -> None:
    """Creates the labelled series of the tasks this process looks up, at zero.

    A labelled counter exists only from its first increment, and Prometheus' rate() needs two
    samples of a series: without this the first completed assignment of each task and outcome
    would never show in a dashboard's rate. Zero from start-up makes the first event a rise."""
    for task_id in task_ids:
        for outcome in OUTCOMES:
            ASSIGNMENTS.labels(task_id, outcome)
        for answer in LOOKUP_ANSWERS:
            LOOKUPS.labels(task_id, answer)
        TASK_SET_ASIDE.labels(task_id).set(0)
        for kind in PENALTY_KINDS:
            PENALTIES.labels(task_id, kind)
    for phase in PHASES:
        PHASE_SECONDS.labels(phase)
    for call in API_CALLS:  # an alert reads the rate limit's rise
        API_ANSWERS.labels(call, "429")


def gpu_memory_gauges() -> None:
    """GPU memory gauges, where the module has torch and a GPU (a module that never imports
    torch gets none: this does not import it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return
    allocated = Gauge(
        f"{PREFIX}_gpu_memory_allocated_bytes",
        "GPU memory held by tensors (torch.cuda.memory_allocated)",
        registry=REGISTRY,
    )
    reserved = Gauge(
        f"{PREFIX}_gpu_memory_reserved_bytes",
        "GPU memory reserved by torch's caching allocator (torch.cuda.memory_reserved)",
        registry=REGISTRY,
    )
    allocated.set_function(torch.cuda.memory_allocated)
    reserved.set_function(torch.cuda.memory_reserved)
