"""What a person reads per assignment at INFO: a handful of short
lines, the result's one saying where the time went, phase by phase; lookups that find nothing
logged when their answer changes, not every round."""

from __future__ import annotations

import re
import signal

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import loop_args, start_validator, validator_env, wait_for
from tests.helpers.assignment_log import check_assignment_lines, run_assignments


def test_one_assignment_is_a_handful_of_lines_with_its_phases(tmp_path):
    pickled = "pickle/an-adapter"
    repos = ["ok/a", "penalty/b", pickled]
    outcomes, log = run_assignments(tmp_path, "fixture", repos, validator_env(tmp_path))
    assert outcomes == {"ok/a": "completed", "penalty/b": "completed", pickled: "completed"}
    assert all(" INFO " in line or " WARNING " in line for line in log.splitlines()), log
    scored, penalty, cut = check_assignment_lines(log, 3)
    # The first assignment starts the module (the host's work: "load"); the metrics rounded.
    assert re.search(
        r"assignment 1: submitted as completed: loss 0.04, repo_length 4, context_length 0 "
        r"\(load \d+\.\d s, score \d+\.\d s\)$",
        scored[-1],
    ), scored
    assert penalty[-1].endswith(
        "assignment 2: submitted as completed: loss -999, repo_length 0, context_length 0, the "
        "network's penalty (cannot_load): penalty/b has no weights to load (score 0.0 s)"
    )
    # A reason too long for its line is cut in its middle: what failed, at the commit's short
    # id, and what to do are kept (the full id and a cut at the end left "pickle fil...").
    assert re.search(
        rf"the network's penalty \(cannot_load\): submission {pickled}@feedc0defeed: "
        r".*\.\.\..*upload adapter_model\.safetensors instead \(commit feedc0defeed; score "
        r"\d+\.\d s\)$",
        cut[-1],
    ), cut


def test_lookups_that_find_nothing_are_logged_when_the_answer_changes(tmp_path):
    with Simulator({"tasks": [task(1, []), task(2, ["ok/a"])]}, tmp_path) as sim:
        args = loop_args("fixture", sim.api_url, "1,2")
        log = tmp_path / "v.log"
        process = start_validator(args, validator_env(tmp_path), log)
        try:
            wait_for(lambda: len(sim.lookups(1)) >= 8, 60, "eight lookups of task 1")
            wait_for(lambda: len(sim.submissions()) == 1, 30, "task 2's assignment")
            count = len(sim.lookups(2))
            wait_for(lambda: len(sim.lookups(2)) >= count + 3, 30, "task 2 idle")
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0
    lines = log.read_text().splitlines()
    idle = [line for line in lines if "No task submissions available to validate" in line]
    # Task 1: nothing from the first lookup on. Task 2: nothing, once its one submission went.
    assert [line.split(": ", 1)[1].split(":")[0] for line in idle] == ["task 1", "task 2"], idle
