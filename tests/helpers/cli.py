"""The validator's CLI as a test runs it against the Fed Ledger simulator, with the fixture module
(devkit/fixtures/modules/fixture): the `cli` fixture (tests/conftest.py) gives one per test, in
place of the same imports from devkit.validator_cli in every file that runs the loop.

    result = cli.run(cli.args(sim.api_url, "1", "--max-assignments", "1"))
    process = cli.start(cli.args(sim.api_url, "1"), "v1.log")
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devkit.validator_cli import (
    loop_args,
    run_validator,
    start_validator,
    validator_env,
    wait_for,
    write_config,
)

MODULE = "fixture"


class LoopCli:
    """`python -m validator fixture ...` with its state and configs under `tmp_path`; `env`
    (devkit.validator_cli.validator_env) is the child's environment, for a test to add to."""

    wait_for = staticmethod(wait_for)

    def __init__(self, tmp_path: Path, **env: str) -> None:
        self.tmp_path = tmp_path
        self.env = validator_env(tmp_path, **env)

    def args(self, api_url: str, task_ids: str = "1", *extra: str) -> list[str]:
        """The loop's arguments (a quick --time-sleep and lookup interval), then `extra`."""
        return loop_args(MODULE, api_url, task_ids, *extra)

    def run(
        self, args: list[str], timeout: float = 60, preexec_fn: Callable[[], None] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return run_validator(args, self.env, timeout, preexec_fn)

    def start(self, args: list[str], log: str | Path) -> subprocess.Popen:
        """The validator in the background, its output into `log` (a name: under tmp_path)."""
        return start_validator(args, self.env, self.tmp_path / log)

    def config(self, settings: dict[str, Any], task_id: str | None = None) -> Path:
        """The fixture module's config (of one task, with `task_id`)."""
        return write_config(self.tmp_path, MODULE, settings, task_id)
