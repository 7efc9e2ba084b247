"""`doctor`: checks a host (or a container) before it validates, one row per check.

A row is ok, warning or failed, with what was found and the one thing to do about it. The
launcher's `python run.py doctor MODULE` adds the host's rows (Docker, GPUs, the image) to the
rows computed here; `python -m validator doctor MODULE` runs these inside the module's image.
Nothing here takes an assignment or prints a secret (every text goes through the log's
redactor before it is shown).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from validator.errors import ExitCode
from validator.observe.logs import RedactSecrets
from validator.text import one_line

Result = Literal["ok", "warning", "failed"]
# The doctor's own exit status (issue 34): 0 nothing failed, 1 a check failed, 2 usage. Not a
# validator exit: nothing restarts on it.
CHECK_FAILED = 1
DETAIL_WIDTH = 400


@dataclass(frozen=True)
class Row:
    check: str
    result: Result
    detail: str
    fix: str = ""  # the one thing to do; empty when there is nothing to do

    @staticmethod
    def ok(check: str, detail: str) -> Row:
        return Row(check, "ok", detail)

    @staticmethod
    def warning(check: str, detail: str, fix: str) -> Row:
        return Row(check, "warning", detail, fix)

    @staticmethod
    def failed(check: str, detail: str, fix: str) -> Row:
        return Row(check, "failed", detail, fix)


def render(rows: Sequence[Row], secrets: Iterable[str | None] = ()) -> str:
    """The table: check, result, what was found (-> what to do), one line per check; any
    secret's value in a detail (a server that echoes the key) is replaced by ***."""
    redactor = RedactSecrets(secrets)
    width = max([len(row.check) for row in rows] + [5])
    lines = [f"{'check':<{width}}  {'result':<7}  found / what to do"]
    for row in rows:
        text = row.detail + (f" -> {row.fix}" if row.fix else "")
        text = one_line(redactor.redact(text))[:DETAIL_WIDTH]
        lines.append(f"{row.check:<{width}}  {row.result:<7}  {text}")
    failed = sum(row.result == "failed" for row in rows)
    warned = sum(row.result == "warning" for row in rows)
    lines.append(f"{len(rows)} checks: {failed} failed, {warned} warnings")
    return "\n".join(lines)


def exit_code(rows: Sequence[Row]) -> int:
    return CHECK_FAILED if any(row.result == "failed" for row in rows) else int(ExitCode.OK)
