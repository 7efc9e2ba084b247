"""Errors the launcher reports as one clear message (never a traceback) and an exit code, and
`say`, how run.py writes a line of its own (prefixed, on stderr, beside the container's log)."""

import sys

from validator.errors import ExitCode


def say(message: str) -> None:
    print(f"[run.py] {message}", file=sys.stderr, flush=True)


class LaunchError(Exception):
    def __init__(self, message: str, exit_code: int = ExitCode.OPERATOR) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class UsageError(LaunchError):
    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=ExitCode.USAGE)
