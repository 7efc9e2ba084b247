"""Errors the launcher reports as one clear message (never a traceback) and an exit code."""

from validator.errors import ExitCode


class LaunchError(Exception):
    def __init__(self, message: str, exit_code: int = ExitCode.OPERATOR) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class UsageError(LaunchError):
    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=ExitCode.USAGE)
