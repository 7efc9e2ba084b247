"""A journal row as the validator reads it (validator/state/journal.py), checked whole at that
boundary: one pydantic model of an entry.

The journal is a file an operator can edit, restore or damage. A row that does not fit the
model (a NULL or empty id, a state this validator never writes, `input` or `metrics` not a JSON
object, a column of the wrong type) raises DamagedRow, and the journal sets it aside (kept as it
was, in its `quarantine` table) instead of letting one row stop every start or reach the API.
A `scored` row without metrics raises NoMetrics instead: it is scored again, never submitted as
`{}`.
"""

from __future__ import annotations

import json
import math
import sqlite3
from enum import Enum
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from validator.state.records import main_metric
from validator.text import bounded, one_line

MAX_PROBLEM = 300


class State(str, Enum):
    RECEIVED = "received"
    SCORING = "scoring"
    SCORED = "scored"
    FAILED = "failed"
    SUBMITTED = "submitted"
    DROPPED = "dropped"


# Why the runner failed a result (its penalty_kind; a metric label): the submission cannot be
# validated, the input does not fit the module, unexpected errors used its attempts up, or its
# scoring ended the process each time. A module's own penalties are the scope's PENALTY_KINDS.
FailedKind = Literal["rejected", "invalid_input", "unexpected", "crashed"]
FAILED_KINDS: tuple[FailedKind, ...] = get_args(FailedKind)

UNDECIDED = (State.RECEIVED, State.SCORING)
UNSUBMITTED = (State.SCORED, State.FAILED)
FINAL = (State.SUBMITTED, State.DROPPED)
# The rows not final, as SQL: written as literals, once, because SQLite uses the partial index
# made with this condition (validator/state/migrate.py) only for a query that holds it as is.
_FINAL_SQL = "(" + ", ".join(f"'{state.value}'" for state in FINAL) + ")"
UNFINISHED = f"state NOT IN {_FINAL_SQL}"
FINISHED = f"state IN {_FINAL_SQL}"
# The assignments table's columns, in its order (validator/state/store.py).
COLUMNS = (
    "id",
    "module",
    "task_id",
    "state",
    "input",
    "metrics",
    "outcome",
    "error",
    "attempts",
    "not_before",
    "received_at",
    "updated_at",
    "maybe_taken",
    "penalty_kind",
    "penalty",
)
# Every column a row holds: the entry's, and the main metric and its score (version 4), which
# the journal works out of the metrics (score_of) for the report; a row set aside keeps them all.
STORED_COLUMNS = (*COLUMNS, "metric", "score")
# Version 1's: no maybe_taken (validator/state/migrate.py reads it out of the error).
V1_COLUMNS = COLUMNS[: COLUMNS.index("maybe_taken")]
# Version 2's: no penalty_kind, penalty (version 3 adds them; migrate.py).
V2_COLUMNS = COLUMNS[: COLUMNS.index("penalty_kind")]


def score_of(metrics: dict[str, Any] | None) -> tuple[str | None, float | None]:
    """The main metric (the first number a module submits: lora's loss, rl's average_reward,
    llm_judge's score) and its value, which the journal keeps in columns of their own for the
    report's SQL; (None, None) for no metrics, a NaN value None."""
    name = main_metric(metrics) if metrics else None
    if name is None:
        return None, None
    value = float(metrics[name])  # type: ignore[index]
    return name, None if math.isnan(value) else value


class DamagedRow(ValueError):
    """A row this validator did not write as it is; the message is one bounded line."""


class NoMetrics(DamagedRow):
    """A `scored` row without metrics; `entry` is the rest of it, read as `received`."""

    def __init__(self, entry: Entry) -> None:
        super().__init__("scored without metrics")
        self.entry = entry


class Entry(BaseModel):
    """One assignment as the journal holds it. Strict: SQLite's flexible types hand back what
    any program wrote, and only what this validator writes is an entry."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    id: str = Field(min_length=1)
    module: str
    task_id: str
    state: State = Field(strict=False)  # the column holds the enum's value; lax takes it
    input: dict[str, Any]
    metrics: dict[str, Any] | None
    outcome: Literal["completed", "failed"] | None
    error: str | None
    attempts: int = Field(ge=0)
    not_before: float
    received_at: float
    updated_at: float
    # What an earlier submit try met that the API may have taken (its answer lost), so that a
    # repeat refused as "not validating" is known to be that try's (ledger/submitting.py).
    maybe_taken: str | None = None
    # Why the result is a penalty rather than a score, kept whatever later submit tries write
    # into `error`: a module's penalty (the scope's PENALTY_KINDS: a -999 or lora's loss 999, its
    # metrics submitted unchanged) or why it was failed (the runner's FAILED_KINDS). A kind is
    # a short word, for a metric label; None with a penalty: a failure recorded before version 3.
    penalty_kind: str | None = Field(default=None, pattern=r"^[a-z_]{1,40}$")
    penalty: str | None = None

    @model_validator(mode="after")
    def _scored_has_metrics(self) -> Entry:
        if self.state is State.SCORED and self.metrics is None:
            raise ValueError("a scored entry without metrics")
        return self

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Entry:
        """The row's entry; NoMetrics for a scored row without metrics (the rest sound),
        DamagedRow for any other row that is not one this validator writes."""
        values = {key: row[key] for key in COLUMNS if key in row.keys()}
        values["input"] = _json_column(row, "input")
        if values["metrics"] is not None:
            values["metrics"] = _json_column(row, "metrics")
        lacks_metrics = values["state"] == State.SCORED.value and values["metrics"] is None
        if lacks_metrics:
            values["state"] = State.RECEIVED.value
        try:
            entry = cls.model_validate(values)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            if where == "input" or where.startswith("input."):
                raise DamagedRow(_problem(_not_object("input", row))) from exc
            if where == "metrics" or where.startswith("metrics."):
                raise DamagedRow(_problem(_not_object("metrics", row))) from exc
            raise DamagedRow(_problem(f"{where or 'row'}: {first['msg']}")) from exc
        if lacks_metrics:
            raise NoMetrics(entry)
        return entry


def _json_column(row: sqlite3.Row, column: str) -> Any:
    value = row[column]
    if not isinstance(value, str):  # a blob is not what the validator writes
        raise DamagedRow(f"{column} is {type(value).__name__}, not JSON text")
    try:
        return json.loads(value)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise DamagedRow(_problem(f"{column} is not valid JSON: {exc}")) from exc


def _not_object(column: str, row: sqlite3.Row) -> str:
    found = json.loads(row[column])
    return f"{column} is {type(found).__name__}, not a JSON object"


def _problem(text: str) -> str:
    return one_line(bounded(text, MAX_PROBLEM))
