"""Process exit codes: the contract between `python -m validator` and the launcher."""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # --max-assignments reached, or stopped by a signal
    BUG = 1  # an unexpected error in the validator itself
    USAGE = 2  # bad option, unknown module, invalid config: fix and rerun
    OPERATOR = 3  # RecoverableException: do not restart; fix and rerun
    RESTART = 100  # a crash that a fresh process may cure (device fault)
    INTERRUPTED = 130  # a second signal cut scoring short
