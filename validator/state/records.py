"""One record per finished assignment, beside the journal: what an operator asks of it later
(`python -m validator report`).

`<state dir>/records/<assignment id>.json` holds the input (secrets never reach it: inputs come
from the API and are bounded), the config it was scored with, the submission's commit, the
outcome and its reason (and why its result is a penalty, if it is one), the submitted metrics,
seconds per phase and the module's log lines for that assignment. Records are bounded: at most
`keep` files (oldest dropped first), the folder listed once per process and then kept in order
in memory, so that a write costs the same whatever the folder holds. The journal is never
dropped; a record is only a copy of what it says, plus timings and logs.
"""

from __future__ import annotations

import json
import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from validator.run_options import DEFAULT_KEEP
from validator.text import MAX_LOG_MESSAGE, bounded

log = logging.getLogger(__name__)

RECORDS_DIR = "records"
MAX_LOG_LINES = 400
RECORD_FORMAT = 1


class AssignmentRecord(BaseModel):
    format: int = RECORD_FORMAT
    id: str
    task_id: str
    module: str
    # received, scored / failed (decided), submitted / dropped / kept (left for a later try)
    outcome: str
    reason: str | None = None
    # Why the result is a penalty rather than a score (a -999, a failure): its kind and reason,
    # as the journal keeps them (validator/state/entry.py).
    penalty_kind: str | None = None
    penalty: str | None = None
    received_at: float
    finished_at: float
    attempts: int = 0
    input: dict[str, Any] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)
    commit: str | None = None
    metrics: dict[str, Any] | None = None
    # Seconds per phase: lookup, download, load, data, wait, score, submit.
    phases: dict[str, float] = Field(default_factory=dict)
    log: list[str] = Field(default_factory=list)


class RecordStore:
    def __init__(self, state_dir: Path, keep: int = DEFAULT_KEEP) -> None:
        self.folder = state_dir / RECORDS_DIR
        self.keep = keep
        # The records' file names, oldest written first: listed at the first write.
        self._order: OrderedDict[str, None] | None = None

    def write(self, record: AssignmentRecord) -> None:
        """Writes (or replaces) the record, then drops the oldest beyond `keep`. A failure is
        logged, never raised: a record must not cost an assignment."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"{_file_name(record.id)}.json"
            partial = path.with_suffix(".partial")
            partial.write_text(record.model_dump_json())
            os.replace(partial, path)
            self._prune(path.name)
        except OSError as exc:
            log.warning("assignment %s: record not written: %s", record.id, exc)

    def read_all(self) -> list[AssignmentRecord]:
        """Every readable record, oldest first; unreadable ones are skipped with a warning."""
        records = []
        for path in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []:
            try:
                records.append(AssignmentRecord.model_validate_json(path.read_text()))
            except (OSError, ValueError) as exc:
                log.warning("record %s skipped: %s", path.name, bounded(str(exc), 200))
        return sorted(records, key=lambda r: (r.finished_at, r.id))

    def _prune(self, written: str) -> None:
        """`written` is the newest; the oldest beyond `keep` go."""
        order = self._listed()
        order[written] = None
        order.move_to_end(written)
        while len(order) > self.keep:
            oldest, _ = order.popitem(last=False)
            (self.folder / oldest).unlink(missing_ok=True)

    def _listed(self) -> OrderedDict[str, None]:
        """The folder's records, oldest first, as the first write of this process found them."""
        if self._order is None:
            files = sorted(self.folder.glob("*.json"), key=lambda p: (p.stat().st_mtime, p.name))
            self._order = OrderedDict.fromkeys(path.name for path in files)
        return self._order


def _file_name(assignment_id: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in assignment_id)
    return bounded(safe, 100).strip(".") or "_"


class LogCapture(logging.Handler):
    """The log lines of one assignment, appended to `lines` (its record's own list, after an
    earlier attempt's) as the operator's log shows them: through the filters of the root
    logger's handlers (validator.observe.logs.RedactSecrets), at most MAX_LOG_LINES."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        for handler in logging.getLogger().handlers:
            for item in handler.filters:
                if isinstance(item, logging.Filter):
                    self.addFilter(item)

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.lines) < MAX_LOG_LINES:
            self.lines.append(bounded(self.format(record), MAX_LOG_MESSAGE))
        elif len(self.lines) == MAX_LOG_LINES:
            self.lines.append("... (more lines in the validator's log)")

    def start(self) -> None:
        logging.getLogger().addHandler(self)

    def stop(self) -> None:
        logging.getLogger().removeHandler(self)


def json_safe(value: Any) -> Any:
    """`value` as JSON can hold it (a config may hold paths, sets...)."""
    return json.loads(json.dumps(value, default=str))


def outcome_label(state: str, outcome: str | None) -> str:
    """What an assignment came to, as the report, the records and the metrics name it: the
    submitted outcome (completed, failed), or the journal state it waits in."""
    if state == "submitted":
        return outcome or "submitted"
    return {"scored": "to submit", "failed": "to submit (failed)"}.get(state, state)


def main_metric(metrics: dict[str, Any]) -> str | None:
    """The metric a module submits first (lora: loss, rl: average_reward, llm_judge: score)."""
    for name, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return name
    return None
