"""What an exception raised while scoring means for the assignment (docs/module-api.md,
"Exceptions and outcomes")."""

from __future__ import annotations

import errno
import sqlite3
from enum import Enum

import requests

from validator.exceptions import (
    ConfigError,
    DeviceError,
    RecoverableException,
    TransientError,
    exception_chain,
)

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
SQLITE_FULL = 13
SQLITE_FULL_MESSAGE = "database or disk is full"  # Python 3.10 has no sqlite_errorcode


class Verdict(Enum):
    FAILED = "failed"  # the submission cannot be validated: mark the assignment failed
    TRANSIENT = "transient"  # network or 5xx: keep the assignment, retry later
    OPERATOR = "operator"  # RecoverableException: keep it, exit 3
    CONFIG = "config"  # ConfigError: keep it, exit 2
    DEVICE = "device"  # keep it, exit 100 so that a fresh process rescores it


def classify(exc: BaseException) -> Verdict:
    if isinstance(exc, ConfigError):
        return Verdict.CONFIG
    if isinstance(exc, RecoverableException) or disk_full(exc):
        return Verdict.OPERATOR
    if isinstance(exc, TransientError | requests.ConnectionError | requests.Timeout):
        return Verdict.TRANSIENT
    if isinstance(exc, ConnectionError | TimeoutError):
        return Verdict.TRANSIENT
    if isinstance(exc, requests.HTTPError) and _status(exc) >= 500:
        return Verdict.TRANSIENT
    if isinstance(exc, DeviceError) or type(exc).__name__ == "OutOfMemoryError":
        return Verdict.DEVICE
    if any(marker in str(exc) for marker in DEVICE_FAULT_MARKERS):
        return Verdict.DEVICE
    return Verdict.FAILED


def _status(exc: requests.HTTPError) -> int:
    return exc.response.status_code if exc.response is not None else 0


def disk_full(exc: BaseException) -> bool:
    """Whether `exc` or anything it was raised from is a full disk or an exceeded quota (a
    download dir, the HF cache, the journal): the operator's to fix, never the submission's."""
    for err in exception_chain(exc):
        if isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS:
            return True
        if isinstance(err, sqlite3.Error):
            code = getattr(err, "sqlite_errorcode", None)
            if code is not None and code & 0xFF == SQLITE_FULL:
                return True
            if code is None and str(err) == SQLITE_FULL_MESSAGE:
                return True
    return False
