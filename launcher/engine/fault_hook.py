"""The fault suite's hook into the launcher's moves (tests/faults/test_moves.py): with
FLOCK_FAULT_KILL_AT=<step> the launcher kills itself with SIGKILL at that step of a journal's
move or a release switch, as a host that dies there would, so that each step's kill is a trial
of its own rather than a race. Unset, as in any real run, it does nothing."""

from __future__ import annotations

import os
import signal

KILL_AT_ENV = "FLOCK_FAULT_KILL_AT"


def kill_point(step: str) -> None:
    if os.environ.get(KILL_AT_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def passed_on() -> dict[str, str]:
    """The hook for a container the launcher starts (the move's), which dies at its own steps."""
    step = os.environ.get(KILL_AT_ENV)
    return {KILL_AT_ENV: step} if step else {}
