"""launcher/fleet/plan.py, the plan of a many-GPU host, and `run.py --plan`, which prints it without
a Docker engine; launcher/fleet/totals.py's totals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from devkit.validator_cli import REPO_ROOT
from launcher.engine.containers import device_requests, gpu_ids
from launcher.errors import UsageError
from launcher.fleet.plan import FleetOptions, Worker, check_passthrough, plan, take_http_port
from launcher.fleet.totals import FleetSummary, WorkerSummary, add_up, render_fleet
from validator.report.html import render_html
from validator.report.summary import PenaltyStats, Summary, outcome_table, render_text

NO_ENGINE = "unix:///nonexistent/docker.sock"


def options(**given) -> FleetOptions:
    defaults = {
        "module": "lora",
        "gpus": None,
        "module_gpu": True,
        "gpus_per_worker": None,
        "workers": None,
        "state_volume": None,
        "task_ids": "1,2,3,4",
        "http_port": None,
        "status_port": 9110,
    }
    return FleetOptions(**{**defaults, **given})


def run_plan(*args: str) -> subprocess.CompletedProcess[str]:
    """`run.py --plan` with DOCKER_HOST pointing nowhere and no secret: the plan needs neither."""
    env = {"PATH": "/usr/bin:/bin", "DOCKER_HOST": NO_ENGINE, "HOME": "/nonexistent"}
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "run.py"), *args, "--plan"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )


def planned(*args: str) -> list[dict]:
    result = run_plan(*args)
    assert result.returncode == 0, result.stderr
    assert "Docker" not in result.stderr  # no engine was asked
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_plan_of_four_gpus_is_four_workers_with_a_gpu_each():
    workers = planned("lora", "--gpus", "0,1,2,3", "--task_ids", "1,2,3,4,5")
    assert [w["gpus"] for w in workers] == ["0", "1", "2", "3"]
    assert [w["name"] for w in workers] == [f"flock-validator-lora-{k}" for k in range(4)]
    # Worker 0 keeps the one-container journal; the others have their own.
    assert [w["state_volume"] for w in workers] == [
        "flock-validator-lora-state",
        "flock-validator-lora-state-1",
        "flock-validator-lora-state-2",
        "flock-validator-lora-state-3",
    ]
    assert [w["shard"] for w in workers] == ["0/4", "1/4", "2/4", "3/4"]
    # The module's status port (lora's spec: 9110), 10 apart: lora's neighbours are 9111, 9112.
    assert [w["http_port"] for w in workers] == [9110, 9120, 9130, 9140]


def test_plan_with_two_gpus_per_worker_is_two_workers():
    workers = planned("lora", "--gpus", "0,1,2,3", "--gpus-per-worker", "2", "--task_ids", "7")
    assert [w["gpus"] for w in workers] == ["0,1", "2,3"]
    # One task for two workers: no empty shard, both look it up.
    assert [w["shard"] for w in workers] == [None, None]


def test_plan_of_cpu_workers_and_the_one_container_defaults():
    workers = planned("rl", "--workers", "3", "--task_ids", "1,2,3")
    assert [(w["gpus"], w["shard"], w["http_port"]) for w in workers] == [
        ("none", "0/3", 9112),
        ("none", "1/3", 9122),
        ("none", "2/3", 9132),
    ]
    # As before the fleet: --gpus all is one container with every GPU, its journal, no port.
    (one,) = planned("lora", "--gpus", "all", "--task_ids", "1,2")
    assert one == {
        "index": 0,
        "name": "flock-validator-lora-0",
        "gpus": "all",
        "state_volume": "flock-validator-lora-state",
        "http_port": None,
        "shard": None,
    }
    (rl,) = planned("rl", "--task_ids", "1")
    assert rl["gpus"] == "none" and rl["shard"] is None


def test_plan_names_workers_after_a_given_state_volume_and_takes_its_http_port():
    workers = planned(
        "lora", "--gpus", "0,1", "--state-volume", "mine", "--http-port", "8000", "--task_ids", "1"
    )
    assert [(w["name"], w["state_volume"], w["http_port"]) for w in workers] == [
        ("mine-0", "mine", 8000),
        ("mine-1", "mine-1", 8010),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--gpus", "0,1,2", "--gpus-per-worker", "2"],
            "--gpus '0,1,2' has 3 GPUs, which do not divide into workers",
        ),
        (["--gpus", "0,0"], "names a GPU twice"),
        (["--gpus", "all", "--gpus-per-worker", "2"], "--gpus-per-worker needs GPU ids"),
        (["--gpus", "all", "--workers", "2"], "would give every worker all GPUs"),
        (["--workers", "2"], "would give every worker all GPUs"),  # lora's default is all
        (["--gpus", "0,1", "--workers", "3"], "--workers 3 does not match"),
        (["--gpus", "0,x"], "--gpus '0,x': use all, none, or device ids"),
        (["--gpus", "0,1", "--shard", "0/2"], "--shard is set per worker by run.py"),
        (["--http-port", "http"], "Invalid value for '--http-port': 'http' is not a valid"),
    ],
)
def test_plans_that_do_not_fit_are_one_line_usage_errors(args, message):
    result = run_plan("lora", "--task_ids", "1,2,3,4", *args)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("gpus", ["0,x", "0\n1", "\u0663", "0,", "GPU-zz"])
def test_both_readers_of_the_gpus_flag_refuse_what_is_not_a_gpu_id(gpus):
    # One worker's device requests and the fleet's groups read --gpus with one parser
    # (launcher.engine.containers.gpu_ids): matched whole and in ASCII digits.
    message = f"--gpus {gpus!r}: use all, none, or device ids such as 0,1"
    with pytest.raises(UsageError) as single:
        device_requests(gpus)
    with pytest.raises(UsageError) as fleet:
        plan(options(gpus=gpus))
    assert str(single.value) == str(fleet.value) == message
    assert gpu_ids(" 0, GPU-3f ,12") == ["0", "GPU-3f", "12"]


def test_shards_only_when_every_worker_has_a_task():
    for task_ids, shards in [
        ("1,2", [None, None, None]),
        ("1,2,3", ["0/3", "1/3", "2/3"]),
        (" 1, 2 ,3,4,", ["0/3", "1/3", "2/3"]),
        (None, [None, None, None]),
    ]:
        workers = plan(options(gpus="0,1,2", task_ids=task_ids))
        assert [w.shard for w in workers] == shards, task_ids


def test_each_worker_adds_its_shard_and_port_to_the_validators_options():
    worker = Worker(1, "w-1", "1", "v-1", 9120, "1/2")
    assert worker.inner_args() == ["--shard", "1/2", "--http-port", "9120"]
    assert Worker(0, "w-0", "all", "v", None, None).inner_args() == []
    # Port 0 (any free port) stays 0 for every worker; a single worker serves none by default.
    assert [w.http_port for w in plan(options(gpus="0,1", http_port=0))] == [0, 0]
    assert plan(options(gpus="3"))[0].http_port is None
    with pytest.raises(UsageError, match="run past 65535"):
        plan(options(gpus="0,1", http_port=65530))


def test_http_port_is_taken_out_of_the_validators_options():
    assert take_http_port(["--debug", "--http-port", "9000", "-x"]) == (9000, ["--debug", "-x"])
    assert take_http_port(["--http-port=0"]) == (0, [])
    assert take_http_port(["--time-sleep", "3"]) == (None, ["--time-sleep", "3"])
    one = plan(options(gpus="0"))
    check_passthrough(["--shard", "0/2"], one)  # one worker: the operator's own share


def summary(
    by_task: dict[str, dict[str, int]], records: int, penalties: list[PenaltyStats] = ()
) -> Summary:
    return Summary(
        state_dir="/data/state",
        generated_at=0.0,
        assignments=sum(sum(c.values()) for c in by_task.values()),
        by_task=by_task,
        per_hour={},
        phases=[],
        scores=[],
        failures=[],
        records=records,
        penalties=list(penalties),
    )


def test_the_fleet_report_adds_up_every_workers_counts():
    minus_999 = PenaltyStats(task_id="1", kind="cannot_load", count=1)
    first = summary({"1": {"completed": 2, "failed": 1}}, 3, [minus_999])
    second = summary({"1": {"completed": 1}, "2": {"dropped": 1}}, 1, [minus_999])
    totals = add_up([first, second])
    assert totals.assignments == 5 and totals.records == 4
    assert totals.by_task == {"1": {"completed": 3, "failed": 1}, "2": {"dropped": 1}}
    assert totals.penalties == {"1": {"cannot_load": 2}}
    fleet = FleetSummary(
        totals=totals,
        workers=[
            WorkerSummary(worker=0, state_volume="v", summary=first),
            WorkerSummary(worker=1, state_volume="v-1", summary=second),
        ],
    )
    text = render_fleet(fleet)
    assert "2 workers, 5 assignments, 4 records" in text
    assert "  task 1: cannot_load 2\n" in text
    assert "worker 0 (v): 3 assignments (completed 2, failed 1), tasks 1" in text
    assert "worker 1 (v-1): 2 assignments (completed 1, dropped 1), tasks 1,2" in text


def test_a_worker_and_a_fleet_show_the_task_outcome_table_alike():
    """One table of counts (validator/report/summary.py outcome_grid): the fleet's lines are a
    worker's report's for the same counts, the page's table has their cells and a total."""
    by_task = {"1": {"completed": 3, "failed": 1}, "12": {"dropped": 2}}
    table = [
        "  task           completed       dropped        failed",
        "  1                      3             0             1",
        "  12                     0             2             0",
    ]
    assert outcome_table(by_task) == table
    worker = summary(by_task, 6)
    assert "Assignments by task and outcome:\n" + "\n".join(table) + "\n" in render_text(worker)
    fleet = FleetSummary(totals=add_up([worker]), workers=[WorkerSummary(worker=0,
                         state_volume="v", summary=worker)])  # fmt: skip
    assert "all workers:\n" + "\n".join(table) + "\n" in render_fleet(fleet)
    page = render_html(worker, [])
    assert "<th>task</th><th>completed</th><th>dropped</th><th>failed</th><th>total</th>" in page
    assert "<tr><td>12</td><td>0</td><td>2</td><td>0</td><td>2</td></tr>" in page
