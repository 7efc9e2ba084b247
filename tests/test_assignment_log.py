"""What a person reads per assignment at INFO (issue 34 part 3): a handful of lines, one of them
where the time went, phase by phase (validator/observe/observer.py)."""

from __future__ import annotations

import re

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import loop_args, run_validator, validator_env


def test_one_assignment_is_a_handful_of_lines_with_its_phases(tmp_path):
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path) as sim:
        args = loop_args("fixture", sim.api_url, "1", "--max-assignments", "1")
        result = run_validator(args, validator_env(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert all(" INFO " in line for line in lines), lines
    # start-up and exit lines aside, every line is the assignment's
    per_assignment = [line for line in lines if "assignment 1" in line or "modules." in line]
    assert len(per_assignment) <= 6, lines
    took = [line for line in lines if "assignment 1 took " in line]
    # the first assignment starts the module: the host's work, "load"
    assert len(took) == 1 and re.search(r"took score \d+\.\d s, load \d+\.\d s$", took[0]), lines
