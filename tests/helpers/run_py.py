"""run.py's program in this process (click's runner) with DOCKER_HOST pointing nowhere, so that
a test that reached the engine would say so; and `python -m validator`'s."""

from __future__ import annotations

from click.testing import CliRunner, Result

from launcher.commands.program import program
from validator.__main__ import program as validator_program

NOWHERE = "unix:///nonexistent/docker.sock"


def run_py(*args: str, **env: str | None) -> Result:
    result = CliRunner().invoke(program(), list(args), env={"DOCKER_HOST": NOWHERE, **env})
    assert "Traceback" not in result.output, result.output
    return result


def validator(*args: str, **env: str | None) -> Result:
    """`python -m validator ...` in this process: for --help and usage errors, which start
    nothing (the loop runs in a child: devkit.validator_cli)."""
    return CliRunner().invoke(validator_program(), list(args), env=env)
