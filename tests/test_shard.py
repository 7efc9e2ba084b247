"""`--shard K/N` (validator/shard.py): the real CLI against the Fed Ledger simulator. What a
worker looks up is read from the simulator's request log (each worker names itself in its
User-Agent through VALIDATOR_WORKER, as run.py's fleet sets it), never from timing."""

from __future__ import annotations

import re
import signal
import urllib.request

import pytest

from devkit.simulator.process import Simulator, task
from tests.faults.ledger import LOOKUP, Ledger, assert_each_submitted_once, journal_rows, target
from tests.helpers.cli import LoopCli
from validator.errors import ConfigError
from validator.shard import Shard, parse_shard, shard_task_ids

# Ids unlike their positions, so that a test cannot pass by confusing the two.
TASK_IDS = "11,12,13,14"
LISTENING = re.compile(r"status page on (http://127\.0\.0\.1:\d+)")


def four_tasks() -> dict:
    return {
        "tasks": [
            task(11, ["ok/a", "ok/bb"]),
            task(12, ["ok/ccc"]),
            task(13, ["ok/dddd"]),
            task(14, ["ok/eeeee", "ok/ffffff"]),
        ]
    }


def looked_up(sim: Simulator) -> list[str]:
    return [lookup["path"].rsplit("/", 1)[1] for lookup in sim.lookups()]


# --- the rule itself ----------------------------------------------------------------------------


def test_a_shard_takes_every_nth_position_from_k():
    ids = ["a", "b", "c", "d", "e"]
    assert Shard(0, 2).pick(ids) == ["a", "c", "e"]
    assert Shard(1, 2).pick(ids) == ["b", "d"]
    assert Shard(2, 3).pick(ids) == ["c"]
    assert shard_task_ids(ids, None) == ids
    # The shards of one N cover every id exactly once.
    assert sorted(i for k in range(3) for i in Shard(k, 3).pick(ids)) == ids
    assert parse_shard(" 1 / 4 ") == Shard(1, 4)
    with pytest.raises(ConfigError, match="3/4 of the 2 task ids holds none"):
        shard_task_ids(["a", "b"], Shard(3, 4))


# --- the command line ---------------------------------------------------------------------------


def test_shard_1_of_2_looks_up_positions_1_and_3_only(tmp_path, cli):
    with Simulator(four_tasks(), tmp_path) as sim:
        args = cli.args(sim.api_url, TASK_IDS, "--shard", "1/2", "--max-assignments")
        result = cli.run([*args, "3"])
        assert result.returncode == 0, result.stderr
        assert set(looked_up(sim)) == {"12", "14"}
        assert set(sim.results_by_repo()) == {"ok/ccc", "ok/eeeee", "ok/ffffff"}
    assert "looking up tasks 12, 14 (shard 1/2 of 4 task ids)" in result.stderr


def test_the_env_var_gives_the_shard_and_the_flag_wins_over_it(tmp_path, cli):
    with Simulator(four_tasks(), tmp_path) as sim:
        cli.env.update(VALIDATOR_SHARD="0/2")
        args = cli.args(sim.api_url, TASK_IDS, "--max-assignments", "3")
        result = cli.run(args)
        assert result.returncode == 0, result.stderr
        assert set(looked_up(sim)) == {"11", "13"}
        assert set(sim.results_by_repo()) == {"ok/a", "ok/bb", "ok/dddd"}
        cli.env["VALIDATOR_STATE_DIR"] = str(tmp_path / "state-flag")
        before = len(sim.lookups())
        result = cli.run([*args, "--shard", "1/2"])
        assert result.returncode == 0, result.stderr
        assert set(looked_up(sim)[before:]) == {"12", "14"}


def test_the_status_page_shows_the_shard(tmp_path, cli):
    with Simulator({"tasks": [task(i, []) for i in (11, 12, 13)]}, tmp_path) as sim:
        cli.env.update(VALIDATOR_SHARD="1/2")
        args = cli.args(sim.api_url, "11,12,13", "--http-port", "0")
        log = tmp_path / "validator.log"
        process = cli.start(args, log)
        try:
            base = cli.wait_for(lambda: LISTENING.search(log.read_text()), 30, "the status page")
            cli.wait_for(sim.lookups, 30, "a lookup")
            with urllib.request.urlopen(base.group(1) + "/", timeout=10) as response:
                page = response.read().decode()
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0
        assert set(looked_up(sim)) == {"12"}
    assert "<span id='lookups'>tasks 12 (shard 1/2 of 3 task ids)</span>" in page


def test_two_workers_split_the_tasks_and_submit_each_assignment_once(tmp_path):
    # One simulator, one key, two state dirs: worker K runs shard K/2, as run.py's fleet would.
    (tmp_path / "w0").mkdir()
    (tmp_path / "w1").mkdir()
    with Simulator(four_tasks(), tmp_path) as sim:
        workers = []
        for k in (0, 1):
            worker = LoopCli(tmp_path / f"w{k}", VALIDATOR_WORKER=f"w{k}")
            args = worker.args(sim.api_url, TASK_IDS, "--shard", f"{k}/2")
            log = tmp_path / f"w{k}.log"
            workers.append((worker.start([*args, "--max-assignments", "3"], log), log))
        for process, log in workers:
            assert process.wait(60) == 0, log.read_text()
        ledger = Ledger.of(sim)
    askers: dict[str, set[str]] = {}
    for request in ledger.api_requests(LOOKUP):
        askers.setdefault(target(request, LOOKUP) or "", set()).add(request["agent"])
    agent = "flock-validator (worker w{})".format
    assert askers == {
        "11": {agent(0)},
        "13": {agent(0)},
        "12": {agent(1)},
        "14": {agent(1)},
    }
    assert len(ledger.assignments) == 6
    assert ledger.unfinished() == [] and ledger.doubles() == []
    assert set(ledger.accepted()) == set(ledger.assignments)
    rows = [journal_rows(tmp_path / f"w{k}" / "state") for k in (0, 1)]
    assert {row["task_id"] for row in rows[0].values()} == {"11", "13"}
    assert {row["task_id"] for row in rows[1].values()} == {"12", "14"}
    assert set(rows[0]) | set(rows[1]) == set(ledger.assignments)
    assert not set(rows[0]) & set(rows[1])


def test_after_a_reshard_the_journal_s_work_of_other_tasks_is_still_submitted(tmp_path, cli):
    # Worker 0 of 2 takes task 11's assignments; its submits fail (the API is down for them),
    # then it is killed while scoring the second. Re-sharded as 1 of 2 (task 12 only), the same
    # state dir must still submit the kept result and score the interrupted one, without ever
    # looking up task 11 again.
    cli.config({"slow_seconds": 120.0, "marker_dir": str(tmp_path)})
    tasks = {"tasks": [task(11, ["ok/kept", "slow/cut"]), task(12, ["ok/new"])]}
    submits_down = {"endpoint": "update", "kind": "status", "status": 503, "count": None}
    with Simulator(tasks, tmp_path, faults=[submits_down]) as sim:
        first = cli.start(cli.args(sim.api_url, "11,12", "--shard", "0/2"), "0.log")
        cli.wait_for((tmp_path / "slow_cut.started").exists, 60, "the scoring of slow/cut")
        first.kill()
        first.wait(10)
        rows = journal_rows(tmp_path / "state")
        assert {row["state"] for row in rows.values()} == {"scored", "scoring"}, rows
        assert set(looked_up(sim)) == {"11"} and sim.submissions() == []
        sim.clear_faults()
        before = len(sim.lookups())

        cli.config({"slow_seconds": 0.0, "marker_dir": str(tmp_path)})
        args = cli.args(sim.api_url, "11,12", "--shard", "1/2", "--max-assignments")
        result = cli.run([*args, "3"])
        assert result.returncode == 0, result.stderr
        assert set(looked_up(sim)[before:]) == {"12"}
        results = sim.results_by_repo()
        assert {repo: r["status"] for repo, r in results.items()} == {
            "ok/kept": "completed",
            "slow/cut": "completed",
            "ok/new": "completed",
        }
        assert_each_submitted_once(sim, tmp_path / "state", 3)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("two", "--shard / VALIDATOR_SHARD 'two' is not K/N: give two integers"),
        ("1/2/3", "'1/2/3' is not K/N"),
        ("1/0", "'1/0': N (the number of shards) must be 1 or more"),
        ("2/2", "'2/2': K must be from 0 to 1"),
        ("-1/2", "'-1/2': K must be from 0 to 1"),
        ("3/4", "--shard / VALIDATOR_SHARD 3/4 of the 2 task ids holds none"),
    ],
)
@pytest.mark.parametrize("given", ["flag", "env"])
def test_a_bad_or_empty_shard_is_exit_2_with_one_line(tmp_path, cli, value, message, given):
    # No API runs at this address: the validator must stop before any call.
    args = cli.args("http://127.0.0.1:9/api/v1", "11,12")
    if given == "flag":
        args += ["--shard", value]
    else:
        cli.env["VALIDATOR_SHARD"] = value
    result = cli.run(args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert message in lines[0]
    assert "Traceback" not in result.stderr
