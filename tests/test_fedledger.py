"""The Fed Ledger client against the simulator over real HTTP."""

import math

import pytest

from tests.helpers.simulator import Simulator, task
from validator.exceptions import RecoverableException
from validator.fedledger import ApiUnavailable, Assignment, FedLedgerClient, Refusal

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
        assert api.request_assignment("nope") == Refusal("unexpected", 404, "Task not found")


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


def test_dropped_connections_raise_api_unavailable_after_retries(sim):
    sim.add_faults({"endpoint": "any", "kind": "drop", "count": None})
    with pytest.raises(ApiUnavailable):
        client(sim, retries=2).request_assignment("12")
    assert len(sim.state()["requests"]) == 3


def test_every_call_has_a_timeout(sim):
    sim.add_faults({"endpoint": "list", "kind": "delay", "delay_seconds": 3, "count": None})
    with pytest.raises(ApiUnavailable, match="Timeout"):
        client(sim, retries=0, timeout=(1.0, 0.5)).list_tasks()


def test_submit_outcomes(sim):
    api = client(sim)
    first, second = api.request_assignment("12"), api.request_assignment("12")
    metrics = {"loss": 1.25, "bppl": math.inf}
    assert api.submit(first.id, "completed", metrics).kind == "accepted"
    assert api.submit(first.id, "completed", metrics).kind == "not_validating"
    assert api.submit(second.id, "failed", None).kind == "accepted"
    assert api.submit("999", "failed", None).kind == "rejected"
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
    with pytest.raises(RecoverableException, match="refused the API key"):
        api.request_assignment("12")
