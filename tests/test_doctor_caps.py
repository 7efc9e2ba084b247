"""The doctor's probes read through the kit's bounded reader (a 300 MB `/tasks/list` read
whole takes `python -m validator doctor` to 2.5 GB): the real command against the simulator
serving a task list padded with 40 MB of JSON values fails the Fed Ledger row naming the cap,
having read no more than the cap, its peak memory within 1.5x that of the same doctor answered
honestly."""

from __future__ import annotations

import sys

from devkit import REPO_ROOT
from devkit.simulator.process import Simulator, task
from devkit.validator_cli import validator_env, wait_for
from tests.faults.figures import record
from tests.helpers.peak_rss import run_measured
from validator.outbound.answer_caps import ANSWER_CAPS

MIB = 1 << 20
IN_FLIGHT = 12 * MIB  # the loopback's socket buffers


def doctor(tmp_path, name: str, faults: list[dict] | None):
    env = validator_env(tmp_path)
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path / name, faults=faults) as sim:
        env["FLOCK_API_URL"] = sim.api_url
        command = [sys.executable, "-m", "validator", "doctor", "fixture", "--task_ids", "1"]
        measured = run_measured(command, env, REPO_ROOT, tmp_path / name / "run")
        padded = wait_for(lambda: sim.state()["padded"] or not faults, 30, "the record")
    return measured, padded


def test_a_huge_task_list_fails_the_ledger_row_within_the_cap(tmp_path):
    (tmp_path / "honest").mkdir()
    (tmp_path / "hostile").mkdir()
    honest, _ = doctor(tmp_path, "honest", None)
    assert honest.returncode == 0 and "key accepted; 1 tasks listed" in honest.stdout
    padding = [{"endpoint": "list", "kind": "oversized", "size_bytes": 40 * MIB}]
    hostile, padded = doctor(tmp_path, "hostile", padding)
    assert hostile.returncode != 0
    (row,) = [line for line in hostile.stdout.splitlines() if line.startswith("Fed Ledger")]
    assert "failed" in row and "over the 2097152 bytes a ledger.tasks answer may have" in row
    (served,) = padded
    assert served["sent"] <= ANSWER_CAPS["ledger.tasks"].max_bytes + IN_FLIGHT < served["length"]
    assert hostile.peak_bytes <= 1.5 * honest.peak_bytes, (hostile.peak_bytes, honest.peak_bytes)
    record(
        "`python -m validator doctor` against a 40 MB /tasks/list",
        f"the Fed Ledger row failed naming the cap, {served['sent'] // MIB} MB read at most; "
        f"peak {hostile.peak_bytes // MIB} MiB against {honest.peak_bytes // MIB} MiB honest",
    )
