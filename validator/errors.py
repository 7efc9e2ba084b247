"""The failure contract (docs/module-api.md, "Exceptions and outcomes"): the exceptions the
validator and its modules raise on purpose, each under its base ([a built-in base] besides).

    ValidatorError
      SubmissionRejected [ValueError]   the submission's fault: failed at once
      OperatorError                     the operator's to fix: kept, exit 3
        ConfigError                       the config or the command line: exit 2
          UnknownModuleError, MalformedSecret, RequestNotSendable
        ModuleCannotStart, ChildBoundUnfit
        JournalUnwritable
          JournalLocked, JournalBroken
      TransientError                    the network or a server: retried
        AnswerTooLarge
      DeviceError                       the accelerator: exit 100, scored by a fresh process
        BaseNotRestored
    JsonRefused [ValueError]            untrusted JSON refused (validator/outbound/safe_json.py)
    DeadlinePassed [ConnectionAbortedError]

Then `ExitCode` (with the launcher), `Verdict` and `classify()`, and `OUTCOMES`: what each means
for the assignment and the process. run.py imports this module on the host: nothing heavy."""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import NoReturn

import requests

from validator._moved import moved_name
from validator.text import MAX_REASON, bounded, one_line

# --- exceptions --------------------------------------------------------------------------------


class ValidatorError(Exception):
    """The root of the exceptions that the validator and its modules raise on purpose."""


class SubmissionRejected(ValidatorError, ValueError):
    """The submission itself cannot be validated (a repo that does not exist, a malformed
    adapter, a file that does not load): the assignment is marked failed at once, with this
    message as the reason. Raise it `from` the library's error, so that the log keeps both."""


class OperatorError(ValidatorError):
    """A problem on the validator's side that the operator can fix (missing token, a base model
    the token cannot read, a missing dependency, disk full). The assignment is not marked failed;
    it stays in the journal for a retry after the fix, and the process exits with code 3."""


class ConfigError(OperatorError):
    """Invalid configuration or command line; exit code 2."""


class TransientError(ValidatorError):
    """A fault outside both the validator and the submission (network, 5xx). Retried after
    --time-sleep; if it persists for a day the assignment is dropped, never marked failed."""


class DeviceError(ValidatorError):
    """The accelerator is in a state only a fresh process can clear (e.g. a CUDA device-side
    assert). The process exits with code 100 so that the launcher restarts it; the assignment is
    rescored after the restart, and marked failed after MAX_SCORING_ATTEMPTS attempts."""


class UnknownModuleError(ConfigError):
    """The module named on the command line is not a module (validator/spec.py: a folder
    `modules/<name>/` with `__init__.py` and `module.yaml`); the message lists those that are."""


# What an operator meets at start-up or while the loop runs; defined here with the contract,
# imported from here by what raises them.


class MalformedSecret(ConfigError):
    """A secret that no header could carry; its message never contains the value."""


class RequestNotSendable(ConfigError):
    """A request that cannot be built from the configured URL and key, on any try."""


class ModuleCannotStart(OperatorError):
    """The module's __init__ raised what would be a submission's fault or a bug in validate():
    no assignment is failed for it, the operator must look (exit 3)."""


class JournalUnwritable(OperatorError):
    """The journal cannot take the next write: its disk is full, over quota or below the
    free-space floor, or the journal is locked or broken. Exit code 3."""


class ChildBoundUnfit(OperatorError):
    """A bounded child's bound (its address space, CPU time or file size) that this process's
    hard limits leave no room for: a child cannot raise a hard limit it inherits, whatever its
    submission. Found at start and by the doctor; a child that still meets it says so in its
    set-up, before any submission byte, and the validator stops (exit 3, the assignment kept)."""


class JournalLocked(JournalUnwritable):
    """Another program has held the journal's write lock for longer than the bound."""


class JournalBroken(JournalUnwritable):
    """The journal's file is not a journal this validator can use; it is left as it is."""


# What a module author meets through the kit; the kit's files raise them and re-export them.


class JsonRefused(ValueError):
    """Untrusted JSON text that is too large, too deeply nested or not JSON; the message says
    which (validator/outbound/safe_json.py)."""


class AnswerTooLarge(TransientError):
    """An answer from outside (the Fed Ledger, the Hub, a judge, GitHub, a registry) past the
    cap of its kind of call, in bytes, JSON values or depth: read no further and never parsed
    (validator/outbound/bounded_reader.py). Its sender's fault: transient where the sender is a
    service; the kit's hub makes it the submission's for a submission's own repo."""

    def __init__(self, message: str, *, kind: str = "", max_bytes: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        self.max_bytes = max_bytes


class DeadlinePassed(ConnectionAbortedError):
    """Raised by a connect after an outbound call's overall deadline: an OSError, which clients
    treat as a failed connection (and may retry, each retry failing the same way at once)
    (validator/outbound/deadline.py)."""


class BaseNotRestored(DeviceError):
    """Copying out, merging or copying back failed part way: the base may hold LoRA layers or
    merged weights, so it must be dropped, and the assignment rescored by a fresh process (a
    fault of this host, such as running out of memory, not of the submission)
    (validator/kit/pristine.py)."""


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and what it was raised from or during: libraries wrap the error that decides the
    outcome (an OSError of a failed write, an HTTP error inside LocalEntryNotFound)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def describe(exc: BaseException) -> str:
    """`TypeName: message`, the form of an error in logs and in the journal's reasons: bounded
    and on one line, since the message may quote what a submission wrote."""
    return one_line(bounded(f"{type(exc).__name__}: {exc}", MAX_REASON))


# --- exit codes --------------------------------------------------------------------------------


class ExitCode(IntEnum):
    """How `python -m validator` ends. run.py restarts the container on RESTART only, stops with
    an explanation on USAGE and OPERATOR, and reports any other code as a crash."""

    OK = 0  # --max-assignments reached, or stopped by a signal
    BUG = 1  # a bug in the validator itself; under --check: the submission would be failed
    USAGE = 2  # bad option, unknown module, invalid config: fix and rerun
    OPERATOR = 3  # OperatorError: do not restart; fix and rerun
    RESTART = 100  # a fault that a fresh process may cure (the device)
    INTERRUPTED = 130  # a second signal cut scoring short


# --- verdicts, and what each one does ----------------------------------------------------------

# Scoring attempts an assignment gets when they end in an unexpected error or end the process
# (crash, device fault, kill); the next one marks it failed. Counted in the journal.
MAX_SCORING_ATTEMPTS = 3


class Verdict(Enum):
    REJECTED = "rejected"  # the submission is at fault
    UNEXPECTED = "unexpected"  # a bug in the module, or an error nobody foresaw
    TRANSIENT = "transient"  # the network or a server
    DEVICE = "device"  # the accelerator needs a fresh process
    OPERATOR = "operator"  # the operator must fix something
    CONFIG = "config"  # the configuration or command line is invalid


class JournalAction(Enum):
    """What happens to the assignment. A kept one is scored again after --time-sleep by this
    process when the process goes on, and first thing by the next process when it exits."""

    FAIL = "mark it failed now, with the reason"
    KEEP = "keep it for a retry; the attempt does not count"
    COUNT = f"keep it for a retry, counting the attempt; failed after {MAX_SCORING_ATTEMPTS}"


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    journal: JournalAction
    exit_code: ExitCode | None  # None: the process goes on with its other work
    headline: str  # how the log line about it starts
    traceback: bool  # whether that line carries the traceback (always for a bug)


OUTCOMES: dict[Verdict, Outcome] = {
    row.verdict: row
    for row in (
        Outcome(
            Verdict.REJECTED, JournalAction.FAIL, None, "submission cannot be validated", False
        ),
        Outcome(
            Verdict.UNEXPECTED, JournalAction.COUNT, None, "unexpected error in the module", True
        ),
        Outcome(Verdict.TRANSIENT, JournalAction.KEEP, None, "transient fault", False),
        Outcome(
            Verdict.DEVICE,
            JournalAction.COUNT,
            ExitCode.RESTART,
            "device fault, restart needed",
            False,
        ),
        Outcome(
            Verdict.OPERATOR, JournalAction.KEEP, ExitCode.OPERATOR, "operator action needed", False
        ),
        Outcome(Verdict.CONFIG, JournalAction.KEEP, ExitCode.USAGE, "error", False),
    )
}


# --- classification ----------------------------------------------------------------------------

# Error texts of a GPU that only a new process can recover from.
DEVICE_FAULT_MARKERS = (
    "CUDA error",
    "device-side assert",
    "CUBLAS_STATUS",
    "CUDNN_STATUS",
    "cuDNN error",
    "NCCL error",
    "illegal memory access",
)
# Only errno values and SQLite's own code count as a full disk, never an error's text: a
# submission can put any text into an error message, and must not be able to stop validators.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# SQLite's primary result codes, the low byte of an error's extended code (sqlite_errorcode);
# Python 3.10 has none, so SQLite's own message for each code stands in (`sqlite_result`). Both
# come from SQLite, never from a submission.
SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY, SQLITE_IOERR = 5, 6, 8, 10
SQLITE_CORRUPT, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_NOTADB = 11, 13, 14, 26
SQLITE_FULL_MESSAGE = "database or disk is full"


def classify(exc: BaseException) -> Verdict:
    """What `exc`, raised while scoring, means. Only types and errno decide, never an error's
    text (a submission can put any text into one), except the device-fault markers, which can
    only restart the process, a number of times that MAX_SCORING_ATTEMPTS bounds."""
    if isinstance(exc, ConfigError):
        return Verdict.CONFIG
    if isinstance(exc, OperatorError) or disk_full(exc):
        return Verdict.OPERATOR
    if _transient(exc):
        return Verdict.TRANSIENT
    if device_fault(exc):
        return Verdict.DEVICE
    # ValueError: SubmissionRejected, and what libraries raise for bad input (pydantic's
    # ValidationError, JSON and Unicode decoding errors).
    if isinstance(exc, ValueError):
        return Verdict.REJECTED
    if isinstance(exc, requests.HTTPError) and 400 <= _status(exc) < 500:
        return Verdict.REJECTED  # what the submission names is missing or private
    return Verdict.UNEXPECTED


def outcome_of(exc: BaseException) -> Outcome:
    return OUTCOMES[classify(exc)]


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, TransientError | requests.ConnectionError | requests.Timeout):
        return True
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    return isinstance(exc, requests.HTTPError) and _status(exc) >= 500


def _status(exc: requests.HTTPError) -> int:
    return exc.response.status_code if exc.response is not None else 0


def device_fault(exc: BaseException) -> bool:
    """A DeviceError, torch's OutOfMemoryError (by name: no torch here) or a GPU library's
    fault text, in `exc` or anything it was raised from: a wrapped CUDA error still poisons the
    process. Texts of ValueErrors are not read; they carry what submissions wrote."""
    for err in exception_chain(exc):
        if isinstance(err, DeviceError) or type(err).__name__ == "OutOfMemoryError":
            return True
        if not isinstance(err, ValueError) and any(m in str(err) for m in DEVICE_FAULT_MARKERS):
            return True
    return False


def disk_full(exc: BaseException) -> bool:
    """Whether `exc` or anything it was raised from is a full disk or an exceeded quota (a
    download dir, the HF cache, the journal): the operator's to fix, never the submission's."""
    for err in exception_chain(exc):
        if isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS:
            return True
        if sqlite_result(err, (SQLITE_FULL,), (SQLITE_FULL_MESSAGE,)):
            return True
    return False


def sqlite_result(exc: BaseException, codes: Collection[int], messages: Collection[str]) -> bool:
    """Whether `exc` is an sqlite3 error whose primary result code is one of `codes` (on Python
    3.10, without sqlite_errorcode: whose text is one of `messages`, SQLite's for those codes)."""
    if not isinstance(exc, sqlite3.Error):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in codes
    return str(exc) in messages


def assert_never(value: NoReturn) -> NoReturn:
    """The last case of an exhaustive `match` over an enum or a Literal: a type checker fails
    where a value is left without its case (it is then not Never), and a value that gets here
    anyway is a bug, raised, never decided by default. typing's own from Python 3.11 on."""
    raise AssertionError(f"no case for {value!r}")


def __getattr__(name: str) -> object:
    return moved_name(__name__, name)  # an earlier name of one of these classes
