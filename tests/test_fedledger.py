"""The Fed Ledger client against the simulator over real HTTP."""

import logging
import math
import socket
import threading
import time

import pytest

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import wait_for
from validator.errors import OperatorError
from validator.ledger.answers import ApiUnavailable, Assignment, Refusal, SubmitAnswer
from validator.ledger.client import FedLedgerClient
from validator.ledger.transport import MAX_RETRY_AFTER_S, retry_after_seconds

KEY = "client-test-key-0001"


@pytest.fixture
def sim(tmp_path):
    tasks = [task(12, ["alice/a", "bob/b"], base_model="qwen1.5"), task("x7", [])]
    with Simulator({"tasks": tasks}, tmp_path, api_key=KEY) as sim:
        yield sim


def client(sim, **kwargs) -> FedLedgerClient:
    kwargs.setdefault("backoff", 0.01)
    return FedLedgerClient(KEY, sim.api_url, **kwargs)


def test_tasks_and_assignments_are_typed_with_normalised_ids(sim):
    api = client(sim)
    assert [(t.id, t.task_type) for t in api.list_tasks()] == [
        ("12", "training"),
        ("x7", "training"),
    ]
    assignment = api.request_assignment(12)
    assert isinstance(assignment, Assignment)
    assert assignment.id == "1"
    assert assignment.module_input() == {"hg_repo_id": "alice/a", "base_model": "qwen1.5"}


def test_known_refusals_are_recognised(tmp_path):
    with Simulator({"tasks": [task(1, [])]}, tmp_path, rate_limit_seconds=60) as sim:
        api = FedLedgerClient("k", sim.api_url)
        assert api.request_assignment("1").kind == "no_submissions"
        refusal = api.request_assignment("1")
        assert (refusal.kind, refusal.status) == ("rate_limited", 429)
        # The API's own 404 for a task it does not know: that task is set aside.
        assert api.request_assignment("nope") == Refusal("unknown_task", 404, "Task not found")


@pytest.mark.parametrize(
    ("fault", "detail"),
    [
        ({"kind": "non_json", "status": 502}, "<html><body>502 Bad Gateway</body></html>"),
        ({"kind": "empty", "status": 500}, "(empty body)"),
        ({"kind": "non_json", "status": 404}, "<html><body>502 Bad Gateway</body></html>"),
    ],
)
def test_non_json_and_empty_bodies_are_tolerated(sim, fault, detail):
    sim.add_faults({"endpoint": "request", "count": None, **fault})
    refusal = client(sim, retries=1).request_assignment("12")
    assert refusal == Refusal("unexpected", fault["status"], detail)


def test_5xx_is_retried_with_backoff_then_succeeds(sim):
    sim.add_faults({"endpoint": "request", "kind": "status", "status": 503, "count": 2})
    assert isinstance(client(sim, retries=2).request_assignment("12"), Assignment)
    assert [lookup["status"] for lookup in sim.lookups()] == [503, 503, 200]


def test_dropped_connections_of_repeatable_calls_are_retried(sim):
    assignment = client(sim).request_assignment("12")
    sim.add_faults({"endpoint": "any", "kind": "drop", "count": None})
    api = client(sim, retries=2)
    with pytest.raises(ApiUnavailable):
        api.list_tasks()
    with pytest.raises(ApiUnavailable):
        api.submit(assignment.id, "failed", None)
    faulted = [r["path"].rsplit("/", 2)[-2] for r in sim.state()["requests"] if r["fault"]]
    assert faulted == ["tasks"] * 3 + ["update-validation-assignment"] * 3


# --- lookups are not idempotent: retried only when the API surely did not process them


def settle(sim: Simulator) -> dict:
    """The state once the requests the client gave up on have been answered too."""
    wait_for(lambda: sim.state()["in_flight"] == 0, 10, "the simulator to finish its requests")
    return sim.state()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_lookup_read_timeout_is_not_retried(tmp_path):
    # The API processes the lookup (hands out an assignment, starts the rate-limit window) but
    # answers after the client gave up. Asking again would meet the rate limit, or take a second
    # assignment: the call ends with ApiUnavailable after one request, and the runner pauses.
    tasks = [task(12, ["alice/a", "bob/b"])]
    with Simulator({"tasks": tasks}, tmp_path, api_key=KEY, rate_limit_seconds=60) as sim:
        sim.add_faults({"endpoint": "request", "kind": "delay", "delay_seconds": 1.5, "count": 1})
        api = client(sim, retries=3, timeout=(5.0, 0.3))
        started = time.monotonic()
        with pytest.raises(ApiUnavailable, match="ReadTimeout"):
            api.request_assignment("12")
        assert time.monotonic() - started < 1.5
        state = settle(sim)
        assert [(r["status"], r["fault"]) for r in state["requests"]] == [(200, "delay")]
        # The cost of a lost answer, which no retry can undo: the assignment stays validating
        # until it expires, and the next lookup within the window is refused.
        assert [(a["id"], a["status"]) for a in state["assignments"]] == [(1, "validating")]
        assert api.request_assignment("12").kind == "rate_limited"


def test_lookup_dropped_after_sending_is_not_retried(sim):
    # A connection closed once the request was sent: the API may have processed it.
    sim.add_faults({"endpoint": "request", "kind": "drop", "count": None})
    with pytest.raises(ApiUnavailable):
        client(sim, retries=2).request_assignment("12")
    assert [(r["status"], r["fault"]) for r in sim.lookups()] == [(None, "drop")]


@pytest.mark.parametrize("status", [500, 502, 504])
def test_lookup_5xx_that_may_follow_processing_is_not_retried(sim, status):
    # 500: the API failed, maybe after assigning; 502: the upstream broke off, maybe after
    # assigning; 504: a proxy stopped waiting for an API still working on it.
    sim.add_faults({"endpoint": "request", "kind": "status", "status": status, "count": None})
    refusal = client(sim, retries=2).request_assignment("12")
    assert (refusal.kind, refusal.status) == ("unexpected", status)
    assert [r["status"] for r in sim.lookups()] == [status]


def test_lookup_refused_connection_is_retried_as_configured(caplog):
    api = FedLedgerClient(KEY, f"http://127.0.0.1:{free_port()}/api/v1", retries=2, backoff=0.01)
    with caplog.at_level(logging.WARNING, logger="validator"), pytest.raises(ApiUnavailable):
        api.request_assignment("12")
    retried = [r for r in caplog.records if "trying again" in r.getMessage()]
    assert len(retried) == 2
    assert all("NewConnectionError" in r.getMessage() for r in retried)


class SimulatorOnPort(Simulator):
    def __init__(self, port: int, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.port = port

    def _command(self) -> list[str]:
        command = super()._command()
        command[command.index("--port") + 1] = str(self.port)
        return command


def test_lookup_refused_until_the_api_is_up_is_retried_and_sent_once(tmp_path):
    port = free_port()
    sim = SimulatorOnPort(port, {"tasks": [task(12, ["alice/a"])]}, tmp_path, api_key=KEY)
    starter = threading.Timer(0.5, sim.start)
    starter.start()
    try:
        # Backoff 0.2 s, doubling: the 10 retries wait up to a minute for the simulator.
        api = FedLedgerClient(KEY, f"http://127.0.0.1:{port}/api/v1", retries=10, backoff=0.2)
        assignment = api.request_assignment("12")
        assert isinstance(assignment, Assignment)
        assert [r["status"] for r in sim.lookups()] == [200]
    finally:
        starter.join()
        sim.stop()


def test_submit_read_timeout_is_retried_and_recorded_once(sim):
    # Unlike a lookup, a submit may be repeated: the API takes the first that reaches it and
    # refuses the others as not validating.
    assignment = client(sim).request_assignment("12")
    sim.add_faults({"endpoint": "update", "kind": "delay", "delay_seconds": 1.0, "count": 1})
    result = client(sim, retries=3, timeout=(5.0, 0.3)).submit(assignment.id, "completed", {})
    assert result.kind in (SubmitAnswer.ACCEPTED, SubmitAnswer.NOT_VALIDATING)
    # Either way the result tells of the try whose answer was lost.
    assert "ReadTimeout" in (result.earlier or "")
    state = settle(sim)
    updates = [r for r in state["requests"] if "/update-validation-assignment/" in r["path"]]
    assert len(updates) == 2
    assert [s["assignment_id"] for s in state["submissions"]] == [1]


def test_every_call_has_a_timeout(sim):
    sim.add_faults({"endpoint": "list", "kind": "delay", "delay_seconds": 3, "count": None})
    with pytest.raises(ApiUnavailable, match="Timeout"):
        client(sim, retries=0, timeout=(1.0, 0.5)).list_tasks()


def test_submit_outcomes(sim):
    api = client(sim)
    first, second = api.request_assignment("12"), api.request_assignment("12")
    metrics = {"loss": 1.25, "bppl": math.inf}
    assert api.submit(first.id, "completed", metrics).kind == SubmitAnswer.ACCEPTED
    assert api.submit(first.id, "completed", metrics).kind == SubmitAnswer.NOT_VALIDATING
    assert api.submit(second.id, "failed", None).kind == SubmitAnswer.ACCEPTED
    assert api.submit("999", "failed", None).kind == SubmitAnswer.REJECTED
    recorded = {s["assignment_id"]: s for s in sim.submissions()}
    assert recorded[1]["data"]["loss"] == 1.25
    assert recorded[2]["status"] == "failed"


def test_submit_on_5xx_raises_so_the_journal_keeps_the_result(sim):
    assignment = client(sim).request_assignment("12")
    sim.add_faults({"endpoint": "update", "kind": "status", "status": 500, "count": None})
    with pytest.raises(ApiUnavailable):
        client(sim, retries=1).submit(assignment.id, "failed", None)
    assert sim.submissions() == []


def test_rejected_key_is_an_operator_problem(sim):
    api = FedLedgerClient("wrong-key-000", sim.api_url)
    with pytest.raises(OperatorError, match="refused the API key"):
        api.request_assignment("12")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("7", 7.0),
        ("1.5", 1.5),
        ("-3", 0.0),
        ("86400", MAX_RETRY_AFTER_S),
        ("nan", None),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:10 GMT", 10.0),
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),  # in the past: at once
        ("Wed, 21 Oct 2015 09:28:00 GMT", MAX_RETRY_AFTER_S),
        # Dates no datetime holds (the first raises OverflowError): ignored, never an exit 1.
        ("Sun, 06 Nov 99999999999 08:49:37 GMT", None),
        ("Sun, 06 Nov 2000 08:49:37 +99999999999999999999", None),
        ("Sun, 06 Nov 10000 08:49:37 GMT", None),
    ],
)
def test_retry_after_is_read_and_bounded(value, expected):
    now = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    assert retry_after_seconds(value, now=now) == expected


def test_a_call_is_not_retried_past_its_deadline(sim):
    # Each try takes 0.6 s; a deadline of 1 s leaves room for two, not for the 5 allowed.
    sim.add_faults({"endpoint": "list", "kind": "delay", "delay_seconds": 3, "count": None})
    started = time.monotonic()
    with pytest.raises(ApiUnavailable, match="deadline"):
        client(sim, retries=4, timeout=(5.0, 0.6), deadline=1.0).list_tasks()
    assert time.monotonic() - started < 2.5
    assert len(settle(sim)["requests"]) == 2


def test_a_try_timing_out_with_no_time_left_for_its_backoff_names_the_deadline(sim):
    # The second try's own timeout, not the deadline's watch, ends it; the backoff then would
    # pass the deadline: the call ended for want of time and says so.
    sim.add_faults({"endpoint": "list", "kind": "delay", "delay_seconds": 3, "count": None})
    api = client(sim, retries=4, timeout=(5.0, 0.2), deadline=2.0, backoff=5.0)
    with pytest.raises(ApiUnavailable) as raised:
        api.list_tasks()
    assert "ReadTimeout" in str(raised.value)
    assert "no time left of the 2 s deadline for another try" in str(raised.value)
    assert len(settle(sim)["requests"]) == 2
