"""Exceptions that decide what happens to an assignment and to the process.

Anything a module raises that is not listed here means the submission itself cannot be
validated, and the assignment is marked failed.
"""

from __future__ import annotations

from collections.abc import Iterator


class RecoverableException(Exception):
    """A problem on the validator's side that the operator can fix (bad config, missing token,
    disk full). The assignment is not marked failed; it stays in the journal for a retry after
    the fix, and the process exits with code 3."""


class ConfigError(RecoverableException):
    """Invalid configuration or command line; exit code 2."""


class TransientError(Exception):
    """A fault outside both the validator and the submission (network, 5xx). Retried with
    backoff; if it persists the assignment is kept for later, never marked failed."""


class DeviceError(Exception):
    """The accelerator is in a state only a fresh process can clear (e.g. a CUDA device-side
    assert). The process exits with code 100 so the launcher restarts it; the assignment is
    rescored after the restart, and marked failed after too many such attempts."""


class UnknownModuleError(ConfigError):
    """The module named on the command line does not exist in `modules/`."""


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and what it was raised from or during: libraries wrap the error that decides the
    outcome (an OSError of a failed write, an HTTP error inside LocalEntryNotFound)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__
