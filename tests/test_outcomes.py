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
    ],
)
def test_classify(exc, verdict):
    assert classify(exc) is verdict
