"""Debian's Prometheus for the fleet-observation tests (deploy/prometheus/): the binaries or a
failure naming `make prometheus`, a Prometheus run on 127.0.0.1 with its storage under tmp_path,
its query API, and what a PromQL expression names (metrics and labels), read without a PromQL
library: the dashboard's expressions use a small subset (selectors, ranges, aggregations with
by, functions, arithmetic)."""

from __future__ import annotations

import ast
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.error import HTTPError, URLError

import pytest

REPO = Path(__file__).resolve().parents[2]
TELEMETRY = REPO / "validator" / "observe" / "telemetry.py"
INSTALL = "run `sudo make prometheus` (Debian's prometheus package, which ships promtool)"


def binary(name: str) -> str:
    """The path of prometheus or promtool; a one-line failure naming the install otherwise."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"these tests need {name} (not on PATH): {INSTALL}", pytrace=False)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Prometheus:
    """A running Prometheus: `query(expr)` through its HTTP API."""

    def __init__(self, url: str) -> None:
        self.url = url

    def api(self, path: str, **params: str) -> dict[str, Any]:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
                return json.loads(response.read())
        except HTTPError as exc:
            # A bad expression is answered 400 with the parser's error in the body.
            return json.loads(exc.read())

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` gives now; a failed query is an AssertionError naming it."""
        body = self.api("/api/v1/query", query=expr)
        assert body.get("status") == "success", f"{expr!r}: {body.get('error', body)}"
        return body["data"]["result"]

    def scalar(self, expr: str) -> float | None:
        """The value of a one-element vector; None while it is empty."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if len(result) == 1 else None


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as response:
            return response.status == 200
    except (URLError, OSError):
        return False


@contextmanager
def running_prometheus(config: Path, tmp_path: Path, timeout: float = 60) -> Iterator[Prometheus]:
    """Prometheus on a free 127.0.0.1 port with its storage under tmp_path, stopped at the end.
    A port taken between choosing it and binding it is tried again with another."""
    exe = binary("prometheus")
    for attempt in range(3):
        port = free_port()
        log_path = tmp_path / f"prometheus-{attempt}.log"
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                [
                    exe,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'prometheus-data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while process.poll() is None and not _ready(url):
                assert time.monotonic() < deadline, (
                    f"Prometheus not ready after {timeout}s: {log_path.read_text()[-2000:]}"
                )
                time.sleep(0.2)
            if process.poll() is None:
                yield Prometheus(url)
                return
            if "address already in use" not in log_path.read_text():
                raise AssertionError(f"Prometheus exited: {log_path.read_text()[-2000:]}")
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
    raise AssertionError("Prometheus found no free port in 3 tries")


# -- what the validator exports


def exported_families() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every metric family telemetry.py defines, {name: (type, labels)}, read from its source so
    that the GPU gauges (registered only where torch has a GPU) are included."""
    tree = ast.parse(TELEMETRY.read_text())
    prefix = next(
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and getattr(node.targets[0], "id", None) == "PREFIX"
        and isinstance(node.value, ast.Constant)
    )
    families = {}
    for node in ast.walk(tree):
        kind = getattr(getattr(node, "func", None), "id", None)
        if not isinstance(node, ast.Call) or kind not in ("Counter", "Gauge", "Histogram"):
            continue
        name_node = node.args[0]
        assert isinstance(name_node, ast.JoinedStr), ast.dump(name_node)
        name = "".join(
            prefix if isinstance(part, ast.FormattedValue) else part.value
            for part in name_node.values
        )
        labels = node.args[2] if len(node.args) > 2 else None
        labels = labels or next((k.value for k in node.keywords if k.arg == "labelnames"), None)
        label_names = tuple(ast.literal_eval(labels)) if labels is not None else ()
        families[name] = (kind.lower(), label_names)
    return families


SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}


def exported_series() -> dict[str, set[str]]:
    """Every series name a validator's /metrics can hold, {name: its labels}."""
    found = {}
    for family, (kind, labels) in exported_families().items():
        for suffix in SUFFIXES[kind]:
            extra = {"le"} if suffix == "_bucket" else set()
            found[family + suffix] = set(labels) | extra
    return found


# -- what a PromQL expression names

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{([^}]*)\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_WORD = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_MATCHER_LABEL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "by", "without"}


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression uses. A word followed by `(` is a function or
    an aggregation; labels come from selectors' matchers and from by/on/... clauses."""
    text = _STRING.sub('""', expr)
    labels = {m for body in _MATCHERS.findall(text) for m in _MATCHER_LABEL.findall(body)}
    labels |= {word.strip() for body in _GROUPING.findall(text) for word in body.split(",") if word}
    text = _GROUPING.sub(" ", _RANGE.sub(" ", _MATCHERS.sub(" ", text)))
    metrics = set()
    for match in _WORD.finditer(text):
        word = match.group()
        if word.lower() in KEYWORDS or text[match.end() :].lstrip().startswith("("):
            continue
        metrics.add(word)
    return metrics, labels


def dashboard_exprs(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, expression) of every query of every panel, rows' nested panels included."""
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield inner["title"], target["expr"]
