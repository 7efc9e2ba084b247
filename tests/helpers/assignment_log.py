"""What a person reads per assignment at INFO: a module's assignments run through the
real loop (`python -m validator MODULE` against the Fed Ledger simulator), then each one's lines
counted and measured. An assignment's lines run from its scoring line to its result's line; a
progress line of slow work (a `Progress`'s, at most one per 30 s) is not counted."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import loop_args, run_validator
from validator.spec import REPO_ROOT, find_modules

MAX_LINES = 6
MAX_CHARACTERS = 300
SCORING = re.compile(r" validator\.runner: assignment (\S+) \(task .*\): scoring \(attempt 1\)$")
RESULT = re.compile(r" validator\.runner: assignment (\S+): submitted as ")
# A `Progress` (validator/scope.py) or a download's (validator/kit/progress.py).
PROGRESS = re.compile(r" validator\.(scope|kit\.progress): ")


def run_assignments(
    tmp_path: Path, module: str, repos: list[str], env: dict[str, str], **data: Any
) -> tuple[dict[str, str], str]:
    """Runs the loop on one task with a submission per repo; the result each got (by repo) and
    the log. The task is listed with a type of the module's own (its spec's, or the first of
    the names its spec gives while the type is not known)."""
    spec = find_modules(REPO_ROOT, REPO_ROOT / "devkit" / "fixtures")[module]
    names = sorted(spec.task_type_names())
    task_type = spec.task_type if isinstance(spec.task_type, str) else names[0]
    with Simulator({"tasks": [task(7, repos, task_type=task_type, **data)]}, tmp_path) as sim:
        args = loop_args(module, sim.api_url, "7", "--max-assignments", str(len(repos)))
        result = run_validator(args, env, timeout=600)
        assert result.returncode == 0, result.stderr[-4000:]
        outcomes = {repo: r["status"] for repo, r in sim.results_by_repo().items()}
    return outcomes, result.stderr


def assignment_lines(log: str) -> list[list[str]]:
    """Each assignment's lines at INFO and above, in the order they were scored."""
    found: list[list[str]] = []
    current: list[str] | None = None
    for line in log.splitlines():
        if SCORING.search(line):
            current = []
            found.append(current)
        if current is not None and not PROGRESS.search(line):
            current.append(line)
        if RESULT.search(line):
            current = None
    return found


def check_assignment_lines(log: str, count: int) -> list[list[str]]:
    """Every line at most MAX_CHARACTERS; `count` assignments of at most MAX_LINES lines."""
    lines = log.splitlines()
    assert not [line for line in lines if " DEBUG " in line], "run at INFO"
    long = [line for line in lines if len(line) > MAX_CHARACTERS]
    assert not long, long
    each = assignment_lines(log)
    assert len(each) == count, log
    assert all(len(lines) <= MAX_LINES for lines in each), each
    return each
