import errno
import sqlite3

import pytest
import requests

from validator.exceptions import ConfigError, DeviceError, RecoverableException, TransientError
from validator.outcomes import Verdict, classify


def http_error(status: int) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = status
    return requests.HTTPError(f"HTTP {status}", response=response)


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.cuda.OutOfMemoryError, which is classified by name (no torch here)."""


@pytest.mark.parametrize(
    ("exc", "verdict"),
    [
        (ValueError("adapter has no base model"), Verdict.FAILED),
        (http_error(404), Verdict.FAILED),
        (RecoverableException("disk full"), Verdict.OPERATOR),
        (ConfigError("bad key"), Verdict.CONFIG),
        (TransientError("hub 503"), Verdict.TRANSIENT),
        (requests.ConnectionError("refused"), Verdict.TRANSIENT),
        (requests.Timeout("slow"), Verdict.TRANSIENT),
        (http_error(502), Verdict.TRANSIENT),
        (ConnectionResetError("reset"), Verdict.TRANSIENT),
        (DeviceError("gpu lost"), Verdict.DEVICE),
        (RuntimeError("CUDA error: device-side assert triggered"), Verdict.DEVICE),
        (OutOfMemoryError("CUDA out of memory"), Verdict.DEVICE),
        # Error texts can come from a submission: only a real errno says the disk is full.
        (ValueError("bad adapter: No space left on device"), Verdict.FAILED),
        (OSError(errno.ENOENT, "No such file or directory", "adapter_config.json"), Verdict.FAILED),
    ],
)
def test_classify(exc, verdict):
    assert classify(exc) is verdict


def wrapped(outer: Exception, inner: BaseException) -> Exception:
    """`outer` raised from `inner`, as a library re-raises a failed write."""
    try:
        raise outer from inner
    except Exception as exc:
        return exc


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.ENOSPC, "No space left on device", "/data/hf-cache/blobs/x"),
        OSError(errno.EDQUOT, "Disk quota exceeded", "/tmp/work/adapter.safetensors"),
        wrapped(RuntimeError("download failed"), OSError(errno.ENOSPC, "No space left")),
        sqlite3.OperationalError("database or disk is full"),
    ],
)
def test_a_full_disk_is_the_operators_problem_not_a_failed_submission(exc):
    assert classify(exc) is Verdict.OPERATOR
