"""Fed Ledger answers past their caps (read whole, a 100 MB lookup answer costs the validator's
process +2.7 GB, 300 MB +8.0 GB): the real CLI against the simulator serving
its own answer padded with megabytes of JSON values. The answer is read no further than its
cap (the simulator records what it managed to send), never parsed, and the process's peak
memory stays within 1.5x the peak of the same run with honest answers."""

from __future__ import annotations

import sys

import pytest

from devkit import REPO_ROOT
from devkit.simulator.process import Simulator, task
from devkit.validator_cli import loop_args, validator_env, wait_for
from tests.faults.figures import record
from tests.faults.ledger import journal_rows
from tests.helpers.peak_rss import run_measured
from validator.outbound.answer_caps import ANSWER_CAPS

MIB = 1 << 20
# Big enough that reading and parsing it whole costs hundreds of MB (old code: +600 MB for
# 24 MB), small enough to serve quickly; the bound is the cap, whatever the size.
PADDING = 24 * MIB
# What the sockets between the simulator and the validator may hold beyond what was read
# (the kernel's send and receive buffers on the loopback).
IN_FLIGHT = 12 * MIB


def run(tmp_path, name: str, faults: list[dict] | None, *extra: str):
    """The validator's run of two submissions of task 1, its peak memory, the simulator's
    state."""
    folder = tmp_path / name
    folder.mkdir()
    env = validator_env(folder)
    data = {"tasks": [task(1, ["ok/a", "ok/b"])]}
    with Simulator(data, folder, faults=faults) as sim:
        args = loop_args("fixture", sim.api_url, "1", "--max-assignments", "1", *extra)
        measured = run_measured(
            [sys.executable, "-m", "validator", *args], env, REPO_ROOT, folder / "run"
        )

        def settled():  # the simulator's write fails once the validator closed the connection
            state = sim.state()
            return state if state["padded"] or not faults else None

        state = wait_for(settled, 30, "the simulator's record of the padded answer")
    assert measured.returncode == 0, measured.stderr
    return measured, state


@pytest.fixture(scope="module")
def honest_peak(tmp_path_factory):
    measured, state = run(tmp_path_factory.mktemp("honest"), "honest", None)
    assert [s["status"] for s in state["submissions"]] == ["completed"]
    return measured.peak_bytes


def padded(endpoint: str) -> list[dict]:
    return [{"endpoint": endpoint, "kind": "oversized", "size_bytes": PADDING, "count": 1}]


def check_bounded(measured, state, honest_peak: int, kind: str) -> int:
    (served,) = state["padded"]
    assert served["length"] > PADDING
    assert served["sent"] <= ANSWER_CAPS[kind].max_bytes + IN_FLIGHT, served
    assert measured.peak_bytes <= 1.5 * honest_peak, (measured.peak_bytes, honest_peak)
    over = [line for line in measured.stderr.splitlines() if "bytes a " + kind in line]
    assert len(over) == 1, measured.stderr
    assert "Traceback" not in measured.stderr
    return served["sent"]


def test_a_lookup_answer_past_its_cap_is_not_read_and_the_task_asked_again(tmp_path, honest_peak):
    measured, state = run(tmp_path, "lookup", padded("request"))
    sent = check_bounded(measured, state, honest_peak, "ledger.lookup")
    lookups = [r for r in state["requests"] if "request-validation-assignment" in r["path"]]
    assert len(lookups) == 2  # not tried again within the call; asked again after the pause
    # The assignment in the unread answer is left to the API (it expires there); the next one
    # is scored and submitted.
    assert [(s["assignment_id"], s["status"]) for s in state["submissions"]] == [(2, "completed")]
    cap = ANSWER_CAPS["ledger.lookup"].max_bytes
    record(
        f"a lookup answer padded with {PADDING // MIB} MB of JSON values",
        f"{sent // MIB} MB read of it at most (cap {cap // MIB} MiB), "
        f"never parsed: transient, the next assignment completed; peak "
        f"{measured.peak_bytes // MIB} MiB against {honest_peak // MIB} MiB honest",
    )


def test_a_task_list_past_its_cap_is_one_warning_at_start(tmp_path, honest_peak):
    measured, state = run(tmp_path, "tasks", padded("list"))
    sent = check_bounded(measured, state, honest_peak, "ledger.tasks")
    assert "could not list tasks" in measured.stderr
    assert [s["status"] for s in state["submissions"]] == ["completed"]
    record(
        f"GET /tasks/list padded with {PADDING // MIB} MB of JSON values",
        f"{sent // MIB} MB read at most, one warning, the run goes on; peak "
        f"{measured.peak_bytes // MIB} MiB against {honest_peak // MIB} MiB honest",
    )


def test_a_submit_answer_past_its_cap_keeps_the_result_for_a_repeat(tmp_path, honest_peak):
    measured, state = run(tmp_path, "submit", padded("update"))
    check_bounded(measured, state, honest_peak, "ledger.submit")
    # The API took the result, and its answer could not be read: the result is kept in the
    # journal for a repeat (which the API refuses as not validating: recorded as submitted,
    # tests/faults/test_submit_answers.py), never dropped; the loop went on to the next one.
    assert [s["assignment_id"] for s in state["submissions"]] == [1, 2]
    rows = journal_rows(tmp_path / "submit" / "state")
    assert (rows["1"]["state"], rows["2"]["state"]) == ("scored", "submitted")
    assert "bytes a ledger.submit answer may have" in rows["1"]["error"]
