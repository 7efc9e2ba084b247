"""Submit answers met within one call, and what the journal then says: the real CLI (or the real
client) against the Fed Ledger simulator's faults, over HTTP.

Nothing leaves the journal unless the API has the result or says it never will take it, and the
journal tells what is known: a result whose first answer was lost after the API committed it is
"submitted" with that story, not "dropped: too late". What the loop does with each call's last
answer (kept, sent again, dropped, across processes) is tests/test_runner_submit_answers.py's,
in the test process.
"""

from __future__ import annotations

import time
from email.utils import formatdate
from typing import Any

import pytest

from devkit.simulator.process import Simulator, task
from tests.faults.figures import record
from tests.faults.ledger import UPDATE, journal_notes, journal_rows, target
from tests.helpers.cli import LoopCli
from validator.ledger.answers import ApiUnavailable
from validator.ledger.client import FedLedgerClient
from validator.ledger.transport import MAX_RETRY_AFTER_S

LOST_ANSWER = "the API's answer to an earlier try was lost"


def updates(sim: Simulator) -> list[dict[str, Any]]:
    return [r for r in sim.state()["requests"] if target(r, UPDATE) is not None]


def run_one(sim: Simulator, cli: LoopCli, *extra: str):
    args = cli.args(sim.api_url, "1", "--max-assignments", "1", *extra)
    return cli.run(args)


# (case, fault rule on the update endpoint, what the journal's history must tell)
SETTLED: list[tuple[str, dict[str, Any], str | None]] = [
    # Not processed by the API: tried again within the call, then taken; nothing to tell.
    ("429", {"kind": "status", "status": 429, "count": 1}, None),
    ("408", {"kind": "status", "status": 408, "count": 1}, None),
    ("503", {"kind": "status", "status": 503, "count": 1}, None),
    # A proxy's 2xx that never reached the API: sent again, and the API takes it then.
    ("2xx empty, not forwarded", {"kind": "empty", "status": 200, "count": 1}, None),
    ("2xx HTML, not forwarded", {"kind": "non_json", "status": 200, "count": 1}, None),
    # The API committed, the answer was lost: the repeat is refused as not validating.
    (
        "2xx empty after commit",
        {"kind": "empty", "status": 200, "count": 1, "processed": True},
        "HTTP 200 without a JSON body",
    ),
    (
        "502 after commit",
        {"kind": "non_json", "status": 502, "count": 1, "processed": True},
        "HTTP 502",
    ),
    (
        "dropped after commit",
        {"kind": "drop", "count": 1, "processed": True},
        "ConnectionError",
    ),
    (
        # Both tries of the call lose their answer: kept, and the next pass settles it.
        "dropped after commit, twice",
        {"kind": "drop", "count": 2, "processed": True},
        "ConnectionError",
    ),
    (
        # A rate limiter that counts after the API has committed: the
        # repeat is refused as not validating, which is not "too late".
        "429 after commit",
        {"kind": "status", "status": 429, "count": 1, "processed": True},
        "HTTP 429",
    ),
    (
        # Every try of the call answered 429: kept as maybe taken, settled by the next pass.
        "429 after commit, twice",
        {"kind": "status", "status": 429, "count": 2, "processed": True},
        "HTTP 429",
    ),
    (
        "500 after commit, twice",
        {"kind": "status", "status": 500, "count": 2, "processed": True},
        "HTTP 500",
    ),
]


@pytest.mark.parametrize(("case", "rule", "story"), SETTLED, ids=[c[0] for c in SETTLED])
def test_submit_answer_ends_with_one_result_and_a_truthful_journal(
    tmp_path, cli, case, rule, story
):
    fault = {"endpoint": "update", **rule}
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path, faults=[fault]) as sim:
        result = run_one(sim, cli)
        assert result.returncode == 0, result.stderr
        taken = sim.submissions()
        calls = updates(sim)
    assert "Traceback" not in result.stderr
    # Exactly one result reached the API, and the journal holds it as submitted.
    assert [(s["assignment_id"], s["status"]) for s in taken] == [(1, "completed")]
    row = journal_rows(tmp_path / "state")["1"]
    assert (row["state"], row["outcome"]) == ("submitted", "completed"), row
    last = journal_notes(tmp_path / "state", "1")[-1]
    if story is None:
        assert last == "completed", last
        assert len(calls) == 2, calls  # the faulted try and the one the API took
    else:
        assert last.startswith("completed; submitted; " + LOST_ANSWER), last
        assert story in last, last
        assert "too late" not in result.stderr
        assert calls[-1]["status"] == 400  # the repeat, refused as not validating
    told = "submitted, the lost answer noted" if story else "submitted"
    record(f"submit answered {case}", f"{len(calls)} submit calls, 1 result; journal: {told}")


@pytest.mark.parametrize("form", ["seconds", "HTTP date"])
def test_retry_after_is_honoured(tmp_path, cli, form):
    wait_s = 2
    # An HTTP date names a moment, in whole seconds, that the validator's start-up eats into:
    # it is set further out, and the retry must not come before it.
    until = int(time.time()) + wait_s + 3
    value = str(wait_s) if form == "seconds" else formatdate(until, usegmt=True)
    fault = {"endpoint": "update", "kind": "status", "status": 429, "count": 1}
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path) as sim:
        sim.add_faults({**fault, "retry_after": value})
        result = run_one(sim, cli)
        assert result.returncode == 0, result.stderr
        calls = updates(sim)
    assert [c["status"] for c in calls] == [429, 200]
    waited = calls[1]["time"] - calls[0]["time"]
    if form == "seconds":
        assert wait_s - 0.1 <= waited < wait_s + 5, waited
    else:
        assert until - 0.1 <= calls[1]["time"] < until + 5, (until, calls)
    record(f"submit answered 429, Retry-After as {form}", f"tried again after {waited:.1f} s")


def test_a_long_retry_after_is_bounded_and_not_waited_out_in_the_call(tmp_path):
    fault = {"endpoint": "update", "kind": "status", "status": 429, "retry_after": "86400"}
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path) as sim:
        assignment = FedLedgerClient("k", sim.api_url).request_assignment("1")
        sim.add_faults(fault)
        api = FedLedgerClient("k", sim.api_url, retries=4, backoff=0.01, deadline=30)
        started = time.monotonic()
        with pytest.raises(ApiUnavailable) as raised:
            api.submit(assignment.id, "failed", None)
        elapsed = time.monotonic() - started
        calls = updates(sim)
    # Not a day, and not the bound either inside the call: the runner defers it that long.
    assert raised.value.retry_after == MAX_RETRY_AFTER_S
    # A 429 may come after the API committed the result.
    assert raised.value.maybe_processed
    assert elapsed < 5 and len(calls) == 1, (elapsed, calls)
