"""Each kind of fault the Fed Ledger simulator can inject, on lookups and on submits: the real
CLI against the simulator, until `--max-assignments`.

Whatever the API does for a while, every result ends up submitted exactly once, the validator
never crashes (exit 0, no traceback) and never busy-loops: the calls it makes stay within what
the lookup interval, `--time-sleep` and the client's retries allow.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import loop_args, run_validator, validator_env
from tests.faults.figures import record
from tests.faults.ledger import LOOKUP, UPDATE, assert_each_submitted_once

ASSIGNMENTS = 3
TASKS = [task(1, ["ok/a", "broken/b"]), task(2, ["ok/c"])]
LOOKUP_INTERVAL = 0.2
RETRIES = 1  # validator_env's VALIDATOR_API_RETRIES: each call is tried twice

# (kind, rule fields): bursts long enough to outlast the client's own retry of a call, so that
# the loop's handling (a pause, a deferred submit) is reached too.
FAULTS: list[tuple[str, dict[str, Any]]] = [
    ("status", {"status": 503, "count": 3}),
    ("status", {"status": 500, "count": 5}),
    ("non_json", {"status": 502, "count": 3}),
    ("non_json", {"status": 200, "count": 2}),
    ("empty", {"status": 503, "count": 3}),
    ("empty", {"status": 200, "count": 2}),
    ("drop", {"count": 3}),
    ("delay", {"delay_seconds": 1.0, "count": 2}),
]
ENDPOINTS = {"request": ("lookup", LOOKUP), "update": ("submit", UPDATE)}


def fault_id(case: tuple[str, dict[str, Any]]) -> str:
    kind, rule = case
    return f"{kind}-{rule['status']}" if "status" in rule else kind


def describe(kind: str, rule: dict[str, Any]) -> str:
    if kind == "delay":
        return f"{rule['delay_seconds']:g} s delay x{rule['count']}"
    if kind == "drop":
        return f"dropped connection x{rule['count']}"
    body = {"status": "", "non_json": " HTML", "empty": " empty"}[kind]
    return f"HTTP {rule['status']}{body} x{rule['count']}"


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
@pytest.mark.parametrize("case", FAULTS, ids=fault_id)
def test_api_fault_burst_ends_with_each_result_submitted_once(tmp_path, endpoint, case):
    kind, rule = case
    where, route = ENDPOINTS[endpoint]
    env = validator_env(tmp_path)
    fault = {"endpoint": endpoint, "kind": kind, **rule}
    with Simulator({"tasks": TASKS}, tmp_path, faults=[fault]) as sim:
        args = loop_args("fixture", sim.api_url, "1,2", "--max-assignments", str(ASSIGNMENTS))
        args[args.index("--assignment-lookup-interval") + 1] = str(LOOKUP_INTERVAL)
        started = time.monotonic()
        result = run_validator(args, env)
        elapsed = time.monotonic() - started
        assert result.returncode == 0, result.stderr
        ledger, _rows = assert_each_submitted_once(sim, tmp_path / "state", ASSIGNMENTS)
    assert "Traceback" not in result.stderr

    calls = ledger.api_requests(route)
    faulted = [r for r in ledger.api_requests() if r["fault"]]
    # The whole burst was met, on the endpoint it was meant for.
    assert len(faulted) == rule["count"] and all(r in calls for r in faulted), faulted
    span = max(r["time"] for r in calls) - min(r["time"] for r in calls)
    lookups = len(ledger.api_requests(LOOKUP))
    updates = len(ledger.api_requests(UPDATE))
    # Each task at most once per lookup interval, each call tried 1 + RETRIES times: a loop
    # that spun on a fault would make hundreds of calls in the same span.
    assert lookups <= (1 + RETRIES) * len(TASKS) * (span / LOOKUP_INTERVAL + 2), lookups
    assert updates <= ASSIGNMENTS + (1 + RETRIES) * rule["count"], updates
    record(
        f"API {describe(kind, rule)} on {where}",
        f"{len(calls)} {where} calls ({len(faulted)} faulted), {ASSIGNMENTS} submitted once, "
        f"0 lost, 0 double, exit 0; {elapsed:.1f} s",
    )
