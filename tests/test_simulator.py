"""The Fed Ledger simulator, exercised over real HTTP in a subprocess."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from devkit.simulator.process import REPO_ROOT, Simulator, task
from devkit.simulator.state import DataFile, RateLimited, SimState

NO_SUBMISSIONS = "No task submissions available to validate"
RATE_LIMITED = "Rate limit reached for validation assignment lookup: 1 per 3 minutes"
NOT_VALIDATING = "Validation assignment is not in validating status"

DATA = {
    "tasks": [
        task(
            12,
            [
                "alice/adapter",
                {
                    "data": {"hg_repo_id": "bob/adapter", "revision": "v2"},
                    "assignment_data": {"base_model": "llama3"},
                },
            ],
            base_model="qwen1.5",
            context_length=4096,
        ),
        task("abc", [], task_type="rl"),
    ]
}


def lookup(sim: Simulator, task_id: int | str, key: str | None = None) -> requests.Response:
    headers = {"flock-api-key": key} if key is not None else {}
    url = f"{sim.api_url}/tasks/request-validation-assignment/{task_id}"
    return requests.post(url, headers=headers, timeout=10)


def update(
    sim: Simulator, assignment_id: int, body: Any, key: str | None = None
) -> requests.Response:
    # Encoded by hand: bytes go out as they are, and json.dumps writes
    # Infinity/NaN the way a Python client does.
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["flock-api-key"] = key
    url = f"{sim.api_url}/tasks/update-validation-assignment/{assignment_id}"
    return requests.post(url, data=raw, headers=headers, timeout=10)


def list_tasks(sim: Simulator, key: str | None = None) -> requests.Response:
    headers = {"flock-api-key": key} if key is not None else {}
    return requests.get(f"{sim.api_url}/tasks/list", headers=headers, timeout=10)


def statuses(sim: Simulator) -> dict[int, str]:
    return {a["id"]: a["status"] for a in sim.state()["assignments"]}


# ---------------------------------------------------------------- happy path


def test_lists_tasks_as_in_the_data_file(tmp_path: Path) -> None:
    with Simulator(DATA, tmp_path) as sim:
        response = list_tasks(sim)

    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    assert response.json() == [
        {
            "id": 12,
            "task_type": "training",
            "data": {"base_model": "qwen1.5", "context_length": 4096},
        },
        {"id": "abc", "task_type": "rl", "data": {}},
    ]


def test_hands_out_submissions_in_order_then_none_left(tmp_path: Path) -> None:
    with Simulator(DATA, tmp_path) as sim:
        first, second, third = (lookup(sim, 12, key="k1") for _ in range(3))
        other_key = lookup(sim, 12, key="k2")
        unknown = lookup(sim, 99, key="k1")
        state = sim.state()

    assert first.status_code == 200
    assert first.json() == {
        "id": 1,
        "data": {"base_model": "qwen1.5", "context_length": 4096},
        "task_submission": {"id": 1, "task_id": 12, "data": {"hg_repo_id": "alice/adapter"}},
    }
    assert second.status_code == 200
    body = second.json()
    assert body["id"] == 2
    assert body["data"]["base_model"] == "llama3", "assignment data wins over task data"
    assert body["task_submission"] == {
        "id": 2,
        "task_id": 12,
        "data": {"hg_repo_id": "bob/adapter", "revision": "v2"},
    }
    assert (third.status_code, third.json()) == (400, {"detail": NO_SUBMISSIONS})
    # Assignments are per key: another validator still gets the first one.
    assert other_key.json()["task_submission"]["id"] == 1
    assert (unknown.status_code, unknown.json()) == (404, {"detail": "Task not found"})
    assert [(a["submission_id"], a["status"]) for a in state["assignments"]] == [
        (1, "validating"),
        (2, "validating"),
        (1, "validating"),
    ]


def test_rate_limit_window_per_key_and_task(tmp_path: Path) -> None:
    data = {"tasks": [task(12, ["a/1", "a/2", "a/3"]), task("empty", [])]}
    # A window far longer than the test: what it answers does not hang on the machine's pace.
    with Simulator(data, tmp_path, rate_limit_seconds=60.0) as sim:
        assert lookup(sim, 12).status_code == 200
        limited = lookup(sim, 12)
        assert lookup(sim, 12, key="someone-else").status_code == 200
        assert lookup(sim, "empty").json() == {"detail": NO_SUBMISSIONS}
        # A "no submissions" answer starts a window too.
        assert lookup(sim, "empty").status_code == 429
        log = sim.lookups(12)
    assert (limited.status_code, limited.json()) == (429, {"detail": RATE_LIMITED})
    assert [entry["status"] for entry in log] == [200, 429, 200]


def test_a_refused_lookup_does_not_restart_the_window() -> None:
    now = [1000.0]
    state = SimState(
        DataFile.model_validate({"tasks": [task(12, ["a/1", "a/2"])]}),
        rate_limit_seconds=1.0,
        clock=lambda: now[0],
    )
    assert state.request_assignment("12", "k")["task_submission"]["id"] == 1
    now[0] += 0.5
    with pytest.raises(RateLimited):
        state.request_assignment("12", "k")
    # Had the refusal at +0.5 s restarted the window, this would still be refused.
    now[0] += 0.75
    assert state.request_assignment("12", "k")["task_submission"]["id"] == 2


def test_update_completed_and_failed_then_late_submit(tmp_path: Path) -> None:
    with Simulator(DATA, tmp_path) as sim:
        first = lookup(sim, 12).json()["id"]
        second = lookup(sim, 12).json()["id"]
        metrics = {"loss": float("inf"), "count": 3}
        completed = update(sim, first, {"status": "completed", "data": metrics})
        failed = update(sim, second, {"status": "failed"})
        late = update(sim, first, {"status": "completed", "data": {"loss": 1.0}})
        late_failed = update(sim, second, {"status": "failed"})
        unknown = update(sim, 999, {"status": "failed"})
        submitted = sim.submissions()
        final = statuses(sim)

    assert (completed.status_code, completed.json()) == (200, {"id": first, "status": "completed"})
    assert (failed.status_code, failed.json()) == (200, {"id": second, "status": "failed"})
    assert (late.status_code, late.json()) == (400, {"detail": NOT_VALIDATING})
    assert (late_failed.status_code, late_failed.json()) == (400, {"detail": NOT_VALIDATING})
    assert (unknown.status_code, unknown.json()) == (
        404,
        {"detail": "Validation assignment not found"},
    )
    assert [(s["assignment_id"], s["status"]) for s in submitted] == [
        (first, "completed"),
        (second, "failed"),
    ]
    assert submitted[0]["data"] == {"loss": float("inf"), "count": 3}
    assert final == {first: "completed", second: "failed"}


def test_bad_update_bodies_are_422_and_change_nothing(tmp_path: Path) -> None:
    bad_bodies = [
        b"not json",
        b"",
        {"status": "done"},
        {"status": "completed"},
        {"status": "completed", "data": [1, 2]},
        ["completed"],
    ]
    with Simulator(DATA, tmp_path) as sim:
        assignment = lookup(sim, 12).json()["id"]
        answers = [update(sim, assignment, body) for body in bad_bodies]
        untouched = (statuses(sim), sim.submissions())
        good = update(sim, assignment, {"status": "failed"})

    for body, answer in zip(bad_bodies, answers, strict=True):
        assert answer.status_code == 422, body
        assert isinstance(answer.json()["detail"], str) and answer.json()["detail"], body
    assert untouched == ({assignment: "validating"}, [])
    assert good.status_code == 200


def test_assignment_expires_after_ttl(tmp_path: Path) -> None:
    with Simulator(DATA, tmp_path, assignment_ttl_seconds=0.5) as sim:
        first = lookup(sim, 12).json()
        time.sleep(0.6)
        late = update(sim, first["id"], {"status": "completed", "data": {"loss": 1.0}})
        after = statuses(sim)
        again = lookup(sim, 12).json()
        recorded = sim.submissions()

    assert (late.status_code, late.json()) == (400, {"detail": NOT_VALIDATING})
    assert after == {first["id"]: "expired"}
    assert recorded == []
    # An expired assignment frees its submission: same submission, new assignment.
    assert again["task_submission"]["id"] == first["task_submission"]["id"]
    assert again["id"] != first["id"]


# Its own process (the key through its environment, never its command line), and in a thread.
@pytest.mark.parametrize("in_thread", [False, True], ids=["process", "thread"])
def test_api_key_is_required_and_never_leaks(tmp_path: Path, in_thread: bool) -> None:
    key = "sk-test-SECRET-7f3a9c"
    with Simulator(DATA, tmp_path, api_key=key, in_thread=in_thread) as sim:
        wrong = lookup(sim, 12, key="sk-wrong")
        missing = list_tasks(sim)
        listed = list_tasks(sim, key=key)
        assigned = lookup(sim, 12, key=key)
        state = sim.state()
        code = sim.stop()

    for answer in (wrong, missing):
        assert (answer.status_code, answer.json()) == (
            401,
            {"detail": "Could not validate credentials"},
        )
    assert listed.status_code == 200
    assert assigned.json()["task_submission"]["id"] == 1, "the 401 handed nothing out"
    assert len(state["assignments"]) == 1
    key_hash = state["assignments"][0]["api_key_hash"]
    assert len(key_hash) < 64 and hashlib.sha256(key.encode()).hexdigest().startswith(key_hash)
    assert code == 0
    assert "GET /api/v1/tasks/list 401" in sim.log_text()
    for text in (sim.stdout_text, sim.log_text(), json.dumps(state)):
        assert key not in text


def test_unknown_paths_are_404(tmp_path: Path) -> None:
    with Simulator(DATA, tmp_path) as sim:
        api = requests.get(f"{sim.api_url}/tasks/nothing", timeout=10)
        root = requests.get(f"{sim.root_url}/elsewhere", timeout=10)

    assert (api.status_code, api.json()) == (404, {"detail": "Not Found"})
    assert (root.status_code, root.json()) == (404, {"detail": "Not Found"})


def test_runtime_submission_is_handed_out(tmp_path: Path) -> None:
    with Simulator(DATA, tmp_path) as sim:
        before = lookup(sim, "abc")
        new_id = sim.add_submission("abc", {"hg_repo_id": "carol/rl"}, {"model_filename": "m.gguf"})
        after = lookup(sim, "abc")
        url = f"{sim.root_url}/_sim/submissions"
        unknown = requests.post(url, json={"task_id": "nope", "data": {}}, timeout=10)
        malformed = requests.post(url, json={"data": {}}, timeout=10)

    assert before.json() == {"detail": NO_SUBMISSIONS}
    assert new_id == 3, "submission ids continue after the two from the file"
    assert after.status_code == 200
    assert after.json()["data"] == {"model_filename": "m.gguf"}
    assert after.json()["task_submission"] == {
        "id": 3,
        "task_id": "abc",
        "data": {"hg_repo_id": "carol/rl"},
    }
    assert unknown.status_code == 404
    assert malformed.status_code == 422 and "task_id" in malformed.json()["detail"]


# ---------------------------------------------------------------- faults


def test_status_fault_changes_no_state_and_runs_out(tmp_path: Path) -> None:
    # A long rate limit: a window started by a faulted lookup would show as 429.
    with Simulator(DATA, tmp_path, rate_limit_seconds=60) as sim:
        sim.add_faults({"endpoint": "request", "kind": "status", "count": 2})
        faulted = [lookup(sim, 12) for _ in range(2)]
        assert sim.state()["assignments"] == []
        served = lookup(sim, 12)
        log = sim.lookups(12)
        rules = requests.get(f"{sim.root_url}/_sim/faults", timeout=10).json()

    for answer in faulted:
        assert (answer.status_code, answer.json()) == (503, {"detail": "Simulated fault"})
    assert served.status_code == 200 and served.json()["id"] == 1
    assert [(e["status"], e["fault"]) for e in log] == [
        (503, "status"),
        (503, "status"),
        (200, None),
    ]
    assert rules[0]["count"] == 0


def test_non_json_and_empty_faults(tmp_path: Path) -> None:
    faults = [{"endpoint": "list", "kind": "non_json", "status": 502, "count": 1}]
    with Simulator(DATA, tmp_path, faults=faults) as sim:
        sim.add_faults({"endpoint": "any", "kind": "empty", "count": 1})
        html, empty, normal = (list_tasks(sim) for _ in range(3))

    assert html.status_code == 502
    assert html.headers["Content-Type"].startswith("text/html")
    assert html.text == "<html><body>502 Bad Gateway</body></html>"
    with pytest.raises(ValueError):
        html.json()
    assert (empty.status_code, empty.content) == (503, b"")
    assert normal.status_code == 200


def test_drop_fault_closes_connection_and_changes_nothing(tmp_path: Path) -> None:
    with Simulator(DATA, tmp_path) as sim:
        assignment = lookup(sim, 12).json()["id"]
        sim.add_faults({"endpoint": "update", "kind": "drop", "count": 1})
        with pytest.raises(requests.ConnectionError):
            update(sim, assignment, {"status": "completed", "data": {"loss": 1.0}})
        state = sim.state()
        retried = update(sim, assignment, {"status": "completed", "data": {"loss": 1.0}})

    assert [a["status"] for a in state["assignments"]] == ["validating"]
    assert state["submissions"] == []
    dropped = state["requests"][-1]
    assert (dropped["method"], dropped["status"], dropped["fault"]) == ("POST", None, "drop")
    assert retried.status_code == 200


def test_delay_fault_answers_normally_after_the_delay(tmp_path: Path) -> None:
    with Simulator(DATA, tmp_path) as sim:
        sim.add_faults({"endpoint": "request", "kind": "delay", "delay_seconds": 0.5, "count": 1})
        started = time.monotonic()
        delayed = lookup(sim, 12)
        delayed_s = time.monotonic() - started
        started = time.monotonic()
        prompt = lookup(sim, 12)
        prompt_s = time.monotonic() - started
        log = sim.lookups()

    assert delayed.status_code == 200 and delayed.json()["id"] == 1
    assert delayed_s >= 0.5
    assert prompt.status_code == 200 and prompt_s < 0.4
    assert [(e["status"], e["fault"]) for e in log] == [(200, "delay"), (200, None)]


def test_fault_rules_are_validated_listed_and_cleared(tmp_path: Path) -> None:
    with Simulator(DATA, tmp_path) as sim:
        url = f"{sim.root_url}/_sim/faults"
        bad = requests.post(url, json={"endpoint": "list", "kind": "explode"}, timeout=10)
        extra = requests.post(url, json=[{"endpoint": "list", "kind": "drop", "x": 1}], timeout=10)
        sim.add_faults({"endpoint": "list", "kind": "status", "status": 500})
        listed = requests.get(url, timeout=10).json()
        while_active = [list_tasks(sim).status_code for _ in range(3)]
        sim.clear_faults()
        cleared = requests.get(url, timeout=10).json()
        after = list_tasks(sim).status_code

    assert bad.status_code == 422 and "kind" in bad.json()["detail"]
    assert extra.status_code == 422 and "x" in extra.json()["detail"]
    assert listed == [
        {"endpoint": "list", "kind": "status", "status": 500, "delay_seconds": 1.0, "count": None}
    ]
    assert while_active == [500, 500, 500], "a rule without count lasts until cleared"
    assert cleared == []
    assert after == 200


# ---------------------------------------------------------------- process


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "cannot read"),
        ("{not json", "not valid JSON"),
        (json.dumps({"tasks": [{"id": 1}]}), "task_type"),
        (json.dumps({"tasks": [], "extra": 1}), "extra"),
        (json.dumps({"tasks": [{"id": 1.5, "task_type": "training"}]}), "tasks.0.id"),
    ],
)
def test_bad_data_file_exits_2_with_one_line(
    tmp_path: Path, content: str | None, expected: str
) -> None:
    data_path = tmp_path / "broken-data.json"
    if content is not None:
        data_path.write_text(content)
    result = subprocess.run(
        [sys.executable, "-m", "devkit.simulator", "--data", str(data_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=20,
    )

    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "broken-data.json" in lines[0] and expected in lines[0]


def test_sigterm_exits_0(tmp_path: Path) -> None:
    sim = Simulator(DATA, tmp_path, in_thread=False)
    sim.start()
    try:
        assert list_tasks(sim).status_code == 200
    finally:
        code = sim.stop()

    assert code == 0
    assert sim.stdout_text.startswith("Fed Ledger simulator listening on http://127.0.0.1:")
    assert "GET /api/v1/tasks/list 200" in sim.log_text()
