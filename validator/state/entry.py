"""A journal row as the validator reads it (validator/state/journal.py), checked at that boundary.

The journal is a file an operator can edit, restore or damage: a row whose `input` or `metrics`
is not valid JSON, or whose columns hold what this validator never writes, raises DamagedRow,
and the journal quarantines it (kept as it is, marked `quarantined`) instead of letting one row
stop every start.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import BaseModel, ValidationError

from validator.text import bounded, one_line

MAX_PROBLEM = 300


class State(str, Enum):
    RECEIVED = "received"
    SCORING = "scoring"
    SCORED = "scored"
    FAILED = "failed"
    SUBMITTED = "submitted"
    DROPPED = "dropped"
    # A damaged row, kept for the operator: never scored or submitted by the validator.
    QUARANTINED = "quarantined"


UNDECIDED = (State.RECEIVED, State.SCORING)
UNSUBMITTED = (State.SCORED, State.FAILED)


class DamagedRow(ValueError):
    """A row this validator did not write as it is; the message is one bounded line."""


class _Columns(BaseModel):
    """The columns besides the JSON ones, as SQLite's flexible types may hand them back."""

    id: str
    module: str
    task_id: str
    state: State
    outcome: str | None
    error: str | None
    attempts: int
    not_before: float
    received_at: float


@dataclass(frozen=True)
class Entry:
    id: str
    module: str
    task_id: str
    state: State
    input: dict[str, Any]
    metrics: dict[str, Any] | None
    outcome: str | None
    error: str | None
    attempts: int
    not_before: float
    received_at: float

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Entry:
        """The row's entry; DamagedRow if a column holds what the validator never writes."""
        try:
            columns = _Columns.model_validate({key: row[key] for key in _Columns.model_fields})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise DamagedRow(_problem(f"{where}: {first['msg']}")) from exc
        input_data = _json_column(row, "input")
        if not isinstance(input_data, dict):
            raise DamagedRow(f"input is {type(input_data).__name__}, not a JSON object")
        metrics = None if row["metrics"] is None else _json_column(row, "metrics")
        if metrics is not None and not isinstance(metrics, dict):
            raise DamagedRow(f"metrics is {type(metrics).__name__}, not a JSON object")
        return cls(input=input_data, metrics=metrics, **columns.model_dump())

    @classmethod
    def quarantined(cls, row: sqlite3.Row, reason: str) -> Entry:
        """What is known of a damaged row: enough for the loop to leave it alone."""

        def text(key: str) -> str:
            value = row[key]
            return value if isinstance(value, str) else str(value)

        return cls(
            id=text("id"),
            module=text("module"),
            task_id=text("task_id"),
            state=State.QUARANTINED,
            input={},
            metrics=None,
            outcome=None,
            error=reason,
            attempts=0,
            not_before=0.0,
            received_at=row["received_at"] if isinstance(row["received_at"], float) else 0.0,
        )


def _json_column(row: sqlite3.Row, column: str) -> Any:
    value = row[column]
    if not isinstance(value, str | bytes):
        raise DamagedRow(f"{column} is {type(value).__name__}, not JSON text")
    try:
        return json.loads(value)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise DamagedRow(_problem(f"{column} is not valid JSON: {exc}")) from exc


def _problem(text: str) -> str:
    return one_line(bounded(text, MAX_PROBLEM))
