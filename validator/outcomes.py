"""What an exception raised while scoring means for the assignment (SPEC §4)."""

from __future__ import annotations

from enum import Enum

import requests

from validator.exceptions import ConfigError, DeviceError, RecoverableException, TransientError

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


class Verdict(Enum):
    FAILED = "failed"  # the submission cannot be validated: mark the assignment failed
    TRANSIENT = "transient"  # network or 5xx: keep the assignment, retry later
    OPERATOR = "operator"  # RecoverableException: keep it, exit 3
    CONFIG = "config"  # ConfigError: keep it, exit 2
    DEVICE = "device"  # keep it, exit 100 so that a fresh process rescores it


def classify(exc: BaseException) -> Verdict:
    if isinstance(exc, ConfigError):
        return Verdict.CONFIG
    if isinstance(exc, RecoverableException):
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
