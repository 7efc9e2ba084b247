"""`doctor`: checks a host (or a container) before it validates, one row per check.

A row is ok, warning, failed or skipped (a check that could not run here, and why), with what
was found and the one thing to do about it. The launcher's `python run.py doctor MODULE` adds
the host's rows (Docker, GPUs, the driver, the image) to the rows computed here;
`python -m validator doctor MODULE` runs these inside the module's image. Nothing here takes an
assignment or prints a secret (every text goes through the log's redactor before it is shown).

Every check runs in a thread of its own, all at once, each within the doctor's deadline: a
server that never finishes its answer is a failed row ("no answer within N s"), not a doctor
that hangs, and a check that raises is a failed row naming the error, never a traceback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import TypeAdapter

from validator.errors import ExitCode, describe
from validator.observe.logs import RedactSecrets
from validator.text import one_line

Result = Literal["ok", "warning", "failed", "skipped"]
# The doctor's own exit status: 0 nothing failed, 1 a check failed, 2 usage. Not a
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

    @staticmethod
    def skipped(check: str, needs: str, fix: str = "") -> Row:
        return Row(check, "skipped", f"needs {needs}", fix)


ROWS = TypeAdapter(list[Row])


@dataclass(frozen=True)
class Check:
    """One check: the rows it gives (named beforehand, for the rows of one that runs over or
    raises) and the function that computes them."""

    names: tuple[str, ...]
    run: Callable[[], list[Row]]
    fix: str = "check the network and that server (a proxy, a firewall), then run the doctor again"


def run_checks(checks: Sequence[Check], deadline: float) -> list[Row]:
    """The rows of every check, in the checks' order: each runs in a daemon thread of its own,
    all at once, and one that has not answered `deadline` seconds after they started gives a
    failed row per name; its thread is left behind (a daemon: it ends with the process)."""
    results: list[list[Row] | None] = [None] * len(checks)

    def run(at: int, check: Check) -> None:
        try:
            results[at] = check.run()
        except Exception as exc:  # a check's bug, or a library's error: a row, not a trace
            results[at] = [Row.failed(name, f"the check failed: {describe(exc)}", check.fix)
                           for name in check.names]  # fmt: skip

    threads = [
        threading.Thread(target=run, args=(at, check), name=f"doctor-{check.names[0]}", daemon=True)
        for at, check in enumerate(checks)
    ]
    stop_at = time.monotonic() + deadline
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, stop_at - time.monotonic()))
    rows: list[Row] = []
    for check, result in zip(checks, results, strict=True):
        if result is None:
            late = f"no answer within {deadline:g} s"
            result = [Row.failed(name, late, check.fix) for name in check.names]
        rows += result
    return rows


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
    skipped = sum(row.result == "skipped" for row in rows)
    summary = f"{len(rows)} checks: {failed} failed, {warned} warnings"
    lines.append(summary + (f", {skipped} skipped" if skipped else ""))
    return "\n".join(lines)


def render_json(rows: Sequence[Row], secrets: Iterable[str | None] = ()) -> str:
    """The rows as a JSON list (what `run.py doctor` reads back from the module's image),
    redacted as the table is."""
    redactor = RedactSecrets(secrets)
    return redactor.redact(ROWS.dump_json(list(rows)).decode())


def exit_code(rows: Sequence[Row]) -> int:
    return CHECK_FAILED if any(row.result == "failed" for row in rows) else int(ExitCode.OK)
