"""The validator's live endpoints (`--http-port`): `/metrics` for Prometheus, `/healthz` for
Docker and orchestrators, `/` a status page, `/report` the report of the state dir.

Bound to 127.0.0.1 unless `--http-host` says otherwise: the pages show what the validator
does (never a secret). Served by bounded_http.py beside it (a few threads, a cap on connections
and on their CPU time: a flood of the page does not slow the loop); nothing here touches the
journal's connection (the report reads the file read-only, as `python -m validator report`
does). The report, the one costly page, is rendered at most once per REPORT_TTL_S.
"""

from __future__ import annotations

import html
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from validator.observe import telemetry
from validator.observe.bounded_http import BoundedHTTPServer, RequestHead
from validator.observe.drift import status_line as protocol_line
from validator.observe.observer import StatusBoard
from validator.run_options import DEFAULT_STALE_SECONDS
from validator.spec import REPO_ROOT, STATE_SOURCE_ENV

log = logging.getLogger(__name__)

REFRESH_SECONDS = 10
# The report adds the journal up and draws plots (a second or two): a page opened by many at
# once, or reloaded in a loop, is drawn once per this many seconds.
REPORT_TTL_S = 5.0
BEING_DRAWN = (
    "<!doctype html><meta http-equiv=refresh content=5>"
    "<p>the report is being drawn: this page reloads in 5 s</p>"
)
REPORT_TIMEOUT_S = 60.0

PAGE_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
.healthy { color: #1a7f37; } .stale { color: #cf222e; }
tr.penalty td { background: #fff5e6; }
#penalty-rules { color: #555; max-width: 60em; }
"""


class StatusServer:
    def __init__(
        self,
        host: str,
        port: int,
        board: StatusBoard,
        state_dir: Path,
        stale_seconds: float = DEFAULT_STALE_SECONDS,
    ) -> None:
        self.board = board
        self.state_dir = state_dir
        self.stale_seconds = stale_seconds
        self.reports_rendered = 0
        self._report: tuple[float, str] | None = None  # (monotonic time drawn, page)
        self._report_lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"status": self})
        # Binds now: a port in use is a ConfigError (exit 2) before the loop starts.
        self.httpd = BoundedHTTPServer(host, port, handler)

    @property
    def address(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        telemetry.gpu_memory_gauges()
        self.httpd.start()
        log.info("status page on %s (/metrics, /healthz, /report)", self.address)

    def stop(self) -> None:
        self.httpd.stop()

    def health(self) -> tuple[bool, dict]:
        idle = time.time() - self.board.last_progress
        healthy = idle <= self.stale_seconds
        return healthy, {
            "healthy": healthy,
            "seconds_since_progress": round(idle, 1),
            "stale_after_seconds": self.stale_seconds,
        }

    def page(self) -> str:
        board = self.board
        healthy, health = self.health()
        current = board.current
        doing = (
            f"assignment <b id='current'>{_e(current.assignment_id)}</b> of task "
            f"{_e(current.task_id)}: <b id='phase'>{_e(current.phase)}</b> for "
            f"{time.time() - current.since:.0f} s"
            if current
            else "<b id='current'>idle</b> (looking up or waiting)"
        )
        state = "healthy" if healthy else "stale"
        return (
            "<!doctype html><html><head><meta charset='utf-8'>"
            f"<meta http-equiv='refresh' content='{REFRESH_SECONDS}'>"
            f"<title>flock-validator {_e(board.module)}</title><style>{PAGE_STYLE}</style>"
            f"</head><body><h1>flock-validator: {_e(board.module)}</h1>"
            f"<p id='health' class='{state}'>{state}: last progress "
            f"{health['seconds_since_progress']:.0f} s ago</p>"
            f"<p>Now: {doing}</p>"
            f"<p>Looks up <span id='lookups'>{_e(board.lookups or 'no tasks')}</span>.</p>"
            f"{_aside(board)}"
            f"<p>Backlog: <b id='undecided'>{board.backlog['undecided']}</b> to score, "
            f"<b id='unsubmitted'>{board.backlog['unsubmitted']}</b> to submit.</p>"
            f"<p id='protocol'>Protocol: {_e(protocol_line() or 'not watched')}</p>"
            f"<h2>Last results</h2>{_results(board)}"
            "<p><a id='report-link' href='/report'>Report of the state dir</a> · "
            "<a href='/metrics'>metrics</a> · <a href='/healthz'>health</a></p>"
            "</body></html>"
        )

    def cached_report(self) -> str:
        """The report page, drawn again only when REPORT_TTL_S have passed. A request that comes
        while it is drawn gets the last page (or a page saying it is being drawn) at once: a
        worker of the server never waits on a drawing, so /healthz and /metrics are answered by
        the other one even while a slow drawing runs on a busy host."""
        if not self._report_lock.acquire(blocking=False):
            return self._report[1] if self._report is not None else BEING_DRAWN
        try:
            now = time.monotonic()
            if self._report is None or now - self._report[0] >= REPORT_TTL_S:
                try:
                    page = self.report()
                except (OSError, ValueError) as exc:
                    page = f"<!doctype html><p>no report yet: {_e(exc)}</p>"
                self.reports_rendered += 1
                self._report = (time.monotonic(), page)
            return self._report[1]
        finally:
            self._report_lock.release()

    def report(self) -> str:
        """Drawn by `python -m validator report` in a child process at a low CPU priority:
        matplotlib holds the GIL for most of a drawing (a second or more for a long journal),
        which in this process stalled the loop. Where the page cannot be drawn (no matplotlib
        in this image), the child's text, as a page. The loop never imports the report."""
        html_page = self._report_child("--html", "-")
        if html_page is not None and not html_page.startswith("error:"):
            return html_page
        text = self._report_child()
        if text is None:
            return f"<!doctype html><p>the report took over {REPORT_TIMEOUT_S:.0f} s</p>"
        return f"<!doctype html><pre>{_e(text)}</pre>"

    def _report_child(self, *options: str) -> str | None:
        """The output of `python -m validator report OPTIONS` (its error line when it fails);
        None past REPORT_TIMEOUT_S."""
        command = [sys.executable, "-m", "validator", "report"]
        command += ["--state-dir", str(self.state_dir.resolve()), *options]
        source = os.environ.get(STATE_SOURCE_ENV)  # the volume's name, set by run.py
        if source:
            command += ["--source", source]
        nice = shutil.which("nice")
        try:
            done = subprocess.run(
                [nice, "-n", "10", *command] if nice else command,
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                timeout=REPORT_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return None
        if done.returncode == 0:
            return done.stdout
        return "error: " + (done.stderr.strip().splitlines() or ["the report failed"])[-1]


class _Handler(RequestHead):
    status: StatusServer

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, CONTENT_TYPE_LATEST, generate_latest(telemetry.REGISTRY))
        elif path == "/healthz":
            healthy, body = self.status.health()
            self._send(200 if healthy else 503, "application/json", json.dumps(body).encode())
        elif path == "/":
            self._send(200, "text/html; charset=utf-8", self.status.page().encode())
        elif path == "/report":
            self._send(200, "text/html; charset=utf-8", self.status.cached_report().encode())
        else:
            self._send(404, "text/plain", b"not found\n")

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
        log.debug("status page: " + format, *args)


def _results(board: StatusBoard) -> str:
    """The last results, a penalty's kind and reason beside its score, and the network's rule
    for a submission it cannot score (the module's spec) under them."""
    rows = "".join(
        f"<tr class='{'penalty' if r['penalty'] else 'score'}'>"
        + "".join(
            f"<td>{_e(value)}</td>"
            for value in (
                time.strftime("%H:%M:%S", time.gmtime(r["time"])),
                r["id"],
                r["task_id"],
                r["outcome"],
                r["score"],
                r["penalty"],
                r["reason"],
            )
        )
        + "</tr>"
        for r in board.recent
    )
    rules = (
        f"<p id='penalty-rules'>Penalties are the network's rule: {_e(board.penalty_rules)}</p>"
        if board.penalty_rules
        else ""
    )
    return (
        "<table id='recent'><thead><tr><th>time (UTC)</th><th>assignment</th><th>task</th>"
        "<th>outcome</th><th>score</th><th>penalty</th><th>reason</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>{rules}"
    )


def _aside(board: StatusBoard) -> str:
    """The tasks set aside, each with why: looked up again hourly, the others go on."""
    if not board.aside:
        return "<p id='aside'>Set aside: none.</p>"
    items = "".join(
        f"<li data-task='{_e(task)}'>task {_e(task)}: {_e(reason)} (since "
        f"{time.strftime('%H:%M', time.gmtime(since))} UTC)</li>"
        for task, (reason, since) in sorted(board.aside.items())
    )
    return (
        "<p id='aside'>Set aside (the Fed Ledger does not know them; each is looked up again "
        f"every hour while the other tasks go on):</p><ul id='aside-tasks'>{items}</ul>"
    )


def _e(value: object) -> str:
    return html.escape(str(value))
