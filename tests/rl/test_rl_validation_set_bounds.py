"""Hostile validation sets built byte by byte: an .npy header that declares far more than its
member holds, an oversized header, members that are not .npy, and files that are no zip at all.
Each is a ValueError naming what is wrong (the assignment fails, as for any broken set), never
an allocation, a MemoryError or another exception that takes the module-bug path, and never
"pickled" for what holds no pickle."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from devkit.tiny_policies import validation_arrays
from modules.rl.validation_set import load_validation_set
from validator.errors import Verdict, classify

LIMIT = 64 * 1024 * 1024


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def npy_claiming(shape: tuple[int, ...], data: bytes, descr: str = "<f4") -> bytes:
    """An .npy (format 1.0) whose header declares `shape` of `descr`, followed by `data` only."""
    buffer = io.BytesIO()
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue() + data


def npy_with_header_of(length: int) -> bytes:
    """A format 2.0 .npy whose header is `length` bytes (a valid dict padded with spaces)."""
    text = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), }"
    header = text.ljust(length - 1).encode("latin1") + b"\n"
    return b"\x93NUMPY\x02\x00" + len(header).to_bytes(4, "little") + header + b"\0" * 4


def zip_of(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def honest_members() -> dict[str, bytes]:
    x, info = validation_arrays(10, 4, 3)
    return {"X.npy": npy_bytes(x), "Info.npy": npy_bytes(info)}


def refused(tmp_path, data: bytes) -> ValueError:
    path = tmp_path / "set.npz"
    path.write_bytes(data)
    with pytest.raises(ValueError, match="^validation set set.npz: ") as caught:
        load_validation_set(path, LIMIT)
    assert classify(caught.value) is Verdict.REJECTED
    return caught.value


def test_an_array_declaring_ten_trillion_elements_is_refused_before_any_allocation(tmp_path):
    # 10^13 float32 would be 40 TB: numpy allocates the whole array before reading a zip
    # member, so without the check this is a MemoryError (or, with overcommit, a huge mapping).
    claim = npy_claiming((10**12, 10), b"\0" * 40)
    members = {**honest_members(), "X.npy": claim}
    message = str(refused(tmp_path, zip_of(members)))
    assert "X: its .npy header declares shape (1000000000000, 10) of float32" in message
    assert "(40000000000000 bytes), but the archive holds 40 bytes for it" in message


def test_an_array_declaring_one_element_more_than_it_holds_is_refused(tmp_path):
    x, info = validation_arrays(10, 4, 3)
    short = npy_claiming((10, 15), info.tobytes()[:-4])
    message = str(refused(tmp_path, zip_of({"X.npy": npy_bytes(x), "Info.npy": short})))
    assert "Info: its .npy header declares shape (10, 15) of float32 (600 bytes)" in message


def test_a_negative_shape_is_refused(tmp_path):
    members = {**honest_members(), "X.npy": npy_claiming((-10, 4), b"\0" * 160)}
    assert "declares a negative shape (-10, 4)" in str(refused(tmp_path, zip_of(members)))


def test_an_oversized_npy_header_is_named_as_such_not_as_a_pickle(tmp_path):
    members = {**honest_members(), "Info.npy": npy_with_header_of(20_000)}
    message = str(refused(tmp_path, zip_of(members)))
    assert "Info: its .npy header is 20000 bytes, over the 10000 numpy reads" in message
    assert "pickle" not in message


def test_a_lone_npy_file_is_named_as_such_not_as_a_pickle(tmp_path):
    message = str(refused(tmp_path, npy_with_header_of(20_000)))
    assert "not a readable .npz: it is a single .npy array" in message
    assert "pickle" not in message


@pytest.mark.parametrize(
    "data",
    [
        np.random.default_rng(7).bytes(4096).replace(b"\x80", b"\x81"),
        b"<!DOCTYPE html><html><body>502 Bad Gateway</body></html>",
    ],
    ids=["random-bytes", "html-page"],
)
def test_bytes_that_are_no_zip_are_named_as_such_not_as_a_pickle(tmp_path, data):
    message = str(refused(tmp_path, data))
    assert "not a readable .npz: not a zip archive (it starts with" in message
    assert "pickle" not in message


def test_a_member_that_is_not_an_npy_array_is_refused(tmp_path):
    members = {**honest_members(), "X.npy": b"just some text, no array"}
    message = str(refused(tmp_path, zip_of(members)))
    assert "X is not an .npy array (it starts with b'just som')" in message


def test_an_object_array_member_is_refused_unread(tmp_path):
    pickled = npy_claiming((10, 4), b"\x80\x04" + b"\0" * 400, descr="|O")
    members = {**honest_members(), "X.npy": pickled}
    assert "X: holds pickled (object) data; never loaded" in str(refused(tmp_path, zip_of(members)))


def test_members_named_without_npy_are_read_as_numpy_does(tmp_path):
    x, info = validation_arrays(10, 4, 3)
    path = tmp_path / "set.npz"
    path.write_bytes(zip_of({"X": npy_bytes(x), "Info.npy": npy_bytes(info)}))
    loaded = load_validation_set(path, LIMIT)
    np.testing.assert_array_equal(loaded.features, x)
    np.testing.assert_array_equal(loaded.info, info)
