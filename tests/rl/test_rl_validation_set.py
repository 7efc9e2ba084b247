"""The rl validation set: read without pickles, within limits, and refused with the reason
when its arrays do not fit the protocol (a ValueError: the assignment is failed, as upstream)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from devkit.tiny_policies import npz_bytes, validation_arrays
from modules.rl.validation_set import load_validation_set

LIMIT = 64 * 1024 * 1024


def write(tmp_path, data: bytes, name: str = "set.npz"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_good_set_is_read_as_float32(tmp_path):
    x, info = validation_arrays(10, 4, 3)
    loaded = load_validation_set(
        write(tmp_path, npz_bytes(X=x.astype(np.float64), Info=info)), LIMIT
    )
    assert loaded.features.dtype == loaded.info.dtype == np.float32
    assert loaded.venues == 3
    np.testing.assert_array_equal(loaded.features, x)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (lambda x, i: npz_bytes(X=x), "no Info array (it has: X)"),
        (lambda x, i: npz_bytes(Info=i), "no X array (it has: Info)"),
        (lambda x, i: npz_bytes(X=x[:5], Info=i), "X has 5 rows and Info 10"),
        (lambda x, i: npz_bytes(X=x, Info=i[:, :-1]), "Info has 14 columns"),
        (lambda x, i: npz_bytes(X=x, Info=i[:, :5]), "Info has 5 columns"),
        (lambda x, i: npz_bytes(X=x.ravel(), Info=i), "X must be a 2-D array"),
        (lambda x, i: npz_bytes(X=x[:0], Info=i[:0]), "X must be a 2-D array with rows"),
        (lambda x, i: npz_bytes(X=x.astype(str), Info=i), "X holds <U"),
        (
            lambda x, i: npz_bytes(X=np.array([{"a": 1}] * 10, dtype=object), Info=i),
            "holds pickled (object) data; never loaded",
        ),
        (lambda x, i: pickle.dumps({"X": x, "Info": i}), "holds pickled (object) data"),
        (lambda x, i: b"PK\x03\x04 not really a zip", "not a readable .npz"),
        (lambda x, i: b"", "not a readable .npz"),
    ],
    ids=[
        "no-info",
        "no-x",
        "row-mismatch",
        "info-width",
        "no-venue",
        "x-1d",
        "no-rows",
        "strings",
        "object-array",
        "pickle",
        "broken-zip",
        "empty",
    ],
)
def test_a_broken_set_is_refused_with_the_reason(tmp_path, content, message):
    x, info = validation_arrays(10, 4, 3)
    with pytest.raises(ValueError, match="validation set set.npz") as refused:
        load_validation_set(write(tmp_path, content(x, info)), LIMIT)
    assert message in str(refused.value)


def test_a_pickle_is_never_unpickled(tmp_path):
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('unpickled')",))

    with pytest.raises(ValueError, match=r"pickled \(object\) data; never loaded"):
        load_validation_set(write(tmp_path, pickle.dumps(Boom())), LIMIT)


def test_arrays_that_unpack_past_the_limit_are_refused_before_reading(tmp_path):
    zeros = np.zeros((4096, 256), np.float32)  # 4 MiB that compress to a few KiB
    data = npz_bytes(X=zeros, Info=np.zeros((4096, 7), np.float32))
    assert len(data) < 100_000
    with pytest.raises(ValueError, match="unpack to .* bytes, over the limit 1048576"):
        load_validation_set(write(tmp_path, data), 1024 * 1024)
