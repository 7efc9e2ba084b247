"""The live endpoints during a real run: the real CLI with `--http-port`, the fixture module and
the Fed Ledger simulator. /metrics equals what the simulator saw; /healthz; the status page
(during a scoring, then after) and the report page opened in a real headless Chromium, their
rendered DOM checked for the figures, screenshots kept; no secret anywhere."""

from __future__ import annotations

import json
import re
import signal
import socket
import time
import urllib.request
from urllib.error import HTTPError

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import (
    API_KEY,
    HF_TOKEN,
    loop_args,
    start_validator,
    validator_env,
    wait_for,
    write_config,
)
from tests.helpers.browser import screenshot

LISTENING = re.compile(r"status page on (http://127\.0\.0\.1:\d+)")


def get(url: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


@pytest.fixture
def run(tmp_path):
    """A validator scoring 5 assignments (one slow, one broken, one the network's -999),
    serving its pages."""
    write_config(tmp_path, "fixture", {"slow_seconds": 6.0, "marker_dir": str(tmp_path)})
    tasks = [task(1, ["ok/a", "broken/b", "slow/c"]), task(2, ["ok/dd", "penalty/e"])]
    # One submit answered 503, tried again within the call: counted as a retry.
    fault = {"endpoint": "update", "kind": "status", "status": 503, "count": 1}
    with Simulator({"tasks": tasks}, tmp_path, faults=[fault]) as sim:
        args = loop_args("fixture", sim.api_url, "1,2", "--http-port", "0")
        log = tmp_path / "validator.log"
        process = start_validator(args, validator_env(tmp_path), log)
        try:
            base = wait_for(lambda: LISTENING.search(log.read_text()), 30, "the status page")
            yield sim, base.group(1), process, tmp_path
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(30)


def test_metrics_health_and_pages_tell_what_the_validator_did(run, chromium):
    sim, base, process, state = run
    driver = chromium
    # While the slow one is scoring: the page names it and its phase.
    wait_for((state / "slow_c.started").exists, 60, "the slow assignment to be scoring")
    driver.get(base + "/")
    current = driver.find_element("id", "current").text
    slow_id = next(
        str(a["id"])
        for a in sim.state()["assignments"]
        if a["task_submission"]["data"]["hg_repo_id"] == "slow/c"
    )
    assert current == slow_id
    assert driver.find_element("id", "phase").text == "score"
    screenshot(driver, "status-page.png")

    wait_for(lambda: len(sim.submissions()) == 5, 60, "5 results submitted")
    # The last result is recorded just after the API took it.
    wait_for(lambda: get(base + "/")[1].count("</td></tr>") == 5, 10, "5 results shown")

    # The loop goes on looking up (answered "no submissions") while this scrapes: the
    # simulator's count before and after brackets the metric's.
    lookups_before = len(sim.lookups())
    status, text = get(base + "/metrics")
    lookups_after = len(sim.lookups())
    assert status == 200
    metrics = samples(text)
    submitted = sim.submissions()
    repo_task = {a["id"]: str(a["task_id"]) for a in sim.state()["assignments"]}
    for task_id in ("1", "2"):
        for outcome in ("completed", "failed"):
            expected = sum(
                1
                for s in submitted
                if repo_task[s["assignment_id"]] == task_id and s["status"] == outcome
            )
            key = (
                "flock_validator_assignments_total",
                (("outcome", outcome), ("task", task_id)),
            )
            assert metrics.get(key, 0) == expected, (task_id, outcome)
    # Every series of the tasks looked up exists from start-up, at zero where nothing happened,
    # so that a dashboard's rate() sees the first event of each (telemetry.start_series).
    never = ("flock_validator_assignments_total", (("outcome", "dropped"), ("task", "2")))
    assert metrics[never] == 0
    assert (
        metrics[("flock_validator_lookups_total", (("answer", "rate_limited"), ("task", "1")))] == 0
    )
    assert metrics[("flock_validator_phase_seconds_count", (("phase", "wait"),))] == 0
    lookups = sum(v for (name, _), v in metrics.items() if name.endswith("lookups_total"))
    assert lookups_before - 1 <= lookups <= lookups_after  # one may be in flight
    handed_out = ("flock_validator_lookups_total", (("answer", "assignment"),))
    assert (
        sum(v for (name, labels), v in metrics.items() if (name, labels[:1]) == handed_out)
        == len(sim.state()["assignments"])
        == 5
    )
    submit_count = ("flock_validator_phase_seconds_count", (("phase", "submit"),))
    assert metrics[submit_count] == 5
    # Each result that is a penalty counts under its kind: the module's, or the failure's.
    penalties = "flock_validator_penalties_total"
    assert metrics[(penalties, (("kind", "cannot_load"), ("task", "2")))] == 1
    assert metrics[(penalties, (("kind", "rejected"), ("task", "1")))] == 1
    assert metrics[(penalties, (("kind", "over_max_params"), ("task", "1")))] == 0
    assert metrics[("flock_validator_backlog", (("kind", "undecided"),))] == 0
    assert metrics[("flock_validator_last_submit_timestamp_seconds", ())] > 0
    faulted = [r for r in sim.state()["requests"] if r.get("fault")]
    assert len(faulted) == 1
    retry = ("flock_validator_api_retries_total", (("call", "submit"), ("kind", "http_503")))
    assert metrics[retry] == 1

    status, body = get(base + "/healthz")
    assert status == 200 and json.loads(body)["healthy"] is True

    driver.get(base + "/")
    rows = driver.find_elements("css selector", "#recent tbody tr")
    assert len(rows) == 5
    assert driver.find_element("id", "current").text == "idle"
    assert driver.find_element("id", "health").text.startswith("healthy")
    # The -999 and the failure each say why, beside the network's rule for them.
    ids = {
        a["task_submission"]["data"]["hg_repo_id"]: str(a["id"]) for a in sim.state()["assignments"]
    }
    shown = {
        cells[1]: (row.get_attribute("class"), cells[3:])
        for row in rows
        for cells in [[td.text for td in row.find_elements("tag name", "td")]]
    }
    assert shown[ids["penalty/e"]] == (
        "penalty",
        ["completed", "loss -999", "cannot_load", "penalty/e has no weights to load"],
    )
    assert shown[ids["broken/b"]] == (
        "penalty",
        ["failed", "", "rejected", "ValueError: cannot load broken/b"],
    )
    assert shown[ids["ok/dd"]][0] == "score" and shown[ids["ok/dd"]][1][2:] == ["", ""]
    rules = driver.find_element("id", "penalty-rules").text
    assert (
        rules.startswith("Penalties are the network's rule: (this test module stands in")
        and "-999" in rules
    )
    screenshot(driver, "status-page-after.png")

    driver.get(base + "/report")
    assert driver.find_element("id", "assignments").text == "5"
    cells = [
        [td.text for td in row.find_elements("tag name", "td")]
        for row in driver.find_elements("css selector", "#outcomes tbody tr")
    ]
    assert cells[0][0] == "1" and cells[0][-1] == "3" and cells[1][-1] == "2"
    rows = driver.find_elements("css selector", "#phases tbody tr")
    phases = [row.text.split()[0] for row in rows]
    assert phases == ["lookup", "load", "score", "submit"]  # load: the module's start
    # The -999 is no score of task 2's: counted apart, with the failure, by kind.
    table = {
        tuple(td.text for td in row.find_elements("tag name", "td"))[:3]
        for row in driver.find_elements("css selector", "#scores tbody tr")
    }
    assert table == {("1", "loss", "2"), ("2", "loss", "1")}
    penalties = [
        [td.text for td in row.find_elements("tag name", "td")]
        for row in driver.find_elements("css selector", "#penalties tbody tr")
    ]
    assert penalties == [["1", "rejected", "1"], ["2", "cannot_load", "1"]]
    widths = driver.execute_script(
        "return [...document.images].map(i => i.complete ? i.naturalWidth : 0)"
    )
    assert len(widths) == 3 and all(w > 100 for w in widths)
    screenshot(driver, "report-page.png")

    pages = [get(base + path)[1] for path in ("/", "/metrics", "/report", "/healthz")]
    records = [p.read_text() for p in (state / "state" / "records").glob("*.json")]
    assert len(records) == 5
    for record in map(json.loads, records):
        assert {"lookup", "score", "submit"} <= set(record["phases"]), record
        assert any("scoring (attempt 1)" in line for line in record["log"]), record
    slow = next(r for r in map(json.loads, records) if r["input"]["hg_repo_id"] == "slow/c")
    assert slow["phases"]["score"] >= 6.0 and slow["outcome"] == "completed"
    for text in [*pages, *records]:
        assert API_KEY not in text and HF_TOKEN not in text


def test_healthz_turns_503_when_the_loop_makes_no_progress(tmp_path):
    write_config(tmp_path, "fixture", {"slow_seconds": 8.0, "marker_dir": str(tmp_path)})
    with Simulator({"tasks": [task(1, ["slow/x"])]}, tmp_path) as sim:
        args = loop_args("fixture", sim.api_url, "1", "--http-port", "0")
        log = tmp_path / "validator.log"
        env = validator_env(tmp_path, VALIDATOR_HEALTH_STALE_SECONDS="2")
        process = start_validator(args, env, log)
        try:
            base = wait_for(lambda: LISTENING.search(log.read_text()), 30, "the status page")
            url = base.group(1) + "/healthz"
            wait_for((tmp_path / "slow_x.started").exists, 30, "the scoring to start")
            # A scoring that shows no phase change for longer than the bound: stale.
            status, body = wait_for(lambda: (r := get(url))[0] == 503 and r, 15, "a 503")
            assert json.loads(body)["healthy"] is False
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(30)


def test_a_report_being_drawn_never_holds_another_request(tmp_path):
    """While one worker of the server draws /report (a slow child on a busy host), a second
    /report is answered at once, with the last page or a page saying it is being drawn, so the
    server's other worker stays free for /healthz."""
    import threading

    from validator.observe.observer import StatusBoard
    from validator.observe.status_server import BEING_DRAWN, StatusServer

    server = StatusServer("127.0.0.1", 0, StatusBoard("fixture"), tmp_path)
    try:
        drawing, release = threading.Event(), threading.Event()
        pages = iter(["<p>first</p>", "<p>second</p>"])

        def slow_report() -> str:
            drawing.set()
            release.wait(60)
            return next(pages)

        server.report = slow_report  # the child's drawing, held until released
        first = threading.Thread(target=server.cached_report)
        first.start()
        assert drawing.wait(60)
        assert server.cached_report() == BEING_DRAWN  # nothing drawn yet: no wait either
        release.set()
        first.join(60)
        assert server.cached_report() == "<p>first</p>" and server.reports_rendered == 1
        # Past the cache's life, a drawing under way answers others with the last page.
        server._report = (server._report[0] - 60, server._report[1])
        drawing.clear()
        release.clear()
        second = threading.Thread(target=server.cached_report)
        second.start()
        assert drawing.wait(60)
        assert server.cached_report() == "<p>first</p>"
        release.set()
        second.join(60)
        assert server.cached_report() == "<p>second</p>" and server.reports_rendered == 2
    finally:
        server.stop()


HALF_OPEN = 200


def test_healthz_answers_at_once_beside_200_half_open_connections(tmp_path):
    """Slowloris: 200 connections that send part of a request's head and never finish would
    hold the 64 places of the status server for 5 s a round, and /healthz wait 12-13 s behind
    them, past a Kubernetes probe's 10 s timeout. A new connection takes the place of the
    one waiting longest for its head: /healthz answers within 1 s while all 200 are open,
    and the validator scores and submits meanwhile."""
    release = tmp_path / "release"
    config = {"slow_seconds": 120.0, "marker_dir": str(tmp_path), "release_file": str(release)}
    write_config(tmp_path, "fixture", config)
    with Simulator({"tasks": [task(1, ["slow/a", "ok/b", "ok/c"])]}, tmp_path) as sim:
        args = loop_args("fixture", sim.api_url, "1", "--http-port", "0")
        log = tmp_path / "validator.log"
        process = start_validator(args, validator_env(tmp_path), log)
        held: list[socket.socket] = []
        try:
            base = wait_for(lambda: LISTENING.search(log.read_text()), 30, "the status page")
            host, port = base.group(1).removeprefix("http://").split(":")
            wait_for((tmp_path / "slow_a.started").exists, 30, "the scoring to start")
            for n in range(HALF_OPEN):
                sock = socket.create_connection((host, int(port)), timeout=30)
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: validator\r\n"[: 10 + n % 30])
                held.append(sock)
            started = time.monotonic()
            status, body = get(base.group(1) + "/healthz", timeout=60)
            took = time.monotonic() - started
            # The one timing bound: the requirement itself (a probe's timeout, with margin).
            assert status == 200 and json.loads(body)["healthy"] is True, (status, body)
            assert took < 1.0, f"/healthz took {took:.1f} s beside {HALF_OPEN} half-open"
            release.touch()  # the validator's work goes on while the connections are open
            wait_for(lambda: len(sim.submissions()) == 3, 60, "the three submits")
            assert process.poll() is None
            results = sim.results_by_repo()
        finally:
            for sock in held:
                sock.close()
            release.touch()
            process.send_signal(signal.SIGTERM)
            process.wait(30)
    assert set(results) == {"slow/a", "ok/b", "ok/c"}
    assert "Traceback" not in log.read_text()
