"""The rl validation set: an `.npz` with `X` (rows of features) and `Info` (rows of `3 + 4V`
order and venue columns), read without pickles and within size limits (docs/rl-scoring.md).

The set comes from the Fed Ledger, not from the submitter; a broken one fails the assignment
with the reason (a ValueError), as upstream does, so that validators agree on it.
"""

from __future__ import annotations

import math
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

INFO_FIXED_COLUMNS = 3  # qty, duration, unused
COLUMNS_PER_VENUE = 4  # fill_rate, rebate_bps, punish, latest_vol
# A zip archive's first bytes: a local file header, or the end record of an empty archive.
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
NPY_MAGIC = b"\x93NUMPY"
# The bytes of the header-length field per .npy format version.
NPY_LENGTH_BYTES = {(1, 0): 2, (2, 0): 4, (3, 0): 4}
MAX_NPY_HEADER = 10_000  # numpy's own default max_header_size: past it numpy will not parse
# A pickle of protocol 2 or later starts with PROTO (0x80) and the protocol number.
PICKLE_PROTOCOLS = range(2, 6)


@dataclass(frozen=True)
class ValidationSet:
    features: np.ndarray  # float32 (rows, features)
    info: np.ndarray  # float32 (rows, 3 + 4 * venues)

    @property
    def venues(self) -> int:
        return (self.info.shape[1] - INFO_FIXED_COLUMNS) // COLUMNS_PER_VENUE


def load_validation_set(path: Path, max_unpacked_bytes: int) -> ValidationSet:
    what = f"validation set {path.name}"
    try:
        _check_is_zip(path, what)
        with zipfile.ZipFile(path) as archive:
            _check_unpacked_size(archive, max_unpacked_bytes, what)
            members = _members(archive)
            missing = [key for key in ("X", "Info") if key not in members]
            if missing:
                raise ValueError(
                    f"{what}: no {' or '.join(missing)} array (it has: "
                    f"{', '.join(_keys(archive)) or 'none'})"
                )
            features = _read_array(archive, members["X"], f"{what}: X")
            info = _read_array(archive, members["Info"], f"{what}: Info")
    except ValueError as exc:
        raise ValueError(str(exc) if str(exc).startswith(what) else f"{what}: {exc}") from None
    # zlib.error: a corrupt deflate stream; NotImplementedError: a compression method zipfile
    # lacks; RuntimeError: an encrypted member (zipfile's own types for these).
    except (
        OSError,
        EOFError,
        zipfile.BadZipFile,
        zlib.error,
        NotImplementedError,
        RuntimeError,
    ) as exc:
        raise ValueError(f"{what}: not a readable .npz: {type(exc).__name__}: {exc}") from None
    return ValidationSet(_as_float32(features, "X", what), _checked_info(info, features, what))


def _check_is_zip(path: Path, what: str) -> None:
    """Names what the file is when it is not a zip archive. np.load would hand anything that is
    neither a zip nor an .npy to pickle, and its refusal ("pickled data") says nothing of random
    bytes or an HTML page."""
    with path.open("rb") as handle:
        head = handle.read(8)
    if head.startswith(ZIP_MAGICS):
        return
    if len(head) >= 2 and head[0] == 0x80 and head[1] in PICKLE_PROTOCOLS:
        raise ValueError(f"{what}: holds pickled (object) data; never loaded")
    if not head:
        reason = "the file is empty"
    elif head.startswith(NPY_MAGIC):
        reason = "it is a single .npy array, not an .npz archive of X and Info"
    else:
        reason = f"not a zip archive (it starts with {head!r})"
    raise ValueError(f"{what}: not a readable .npz: {reason}")


def _check_unpacked_size(archive: zipfile.ZipFile, limit: int, what: str) -> None:
    # The central directory's sizes: zipfile never yields more bytes than a member's file_size.
    unpacked = sum(member.file_size for member in archive.infolist())
    if unpacked > limit:
        raise ValueError(f"{what}: its arrays unpack to {unpacked} bytes, over the limit {limit}")


def _keys(archive: zipfile.ZipFile) -> list[str]:
    return [name.removesuffix(".npy") for name in archive.namelist()]


def _members(archive: zipfile.ZipFile) -> dict[str, str]:
    """Array key -> member name, as np.load's NpzFile maps them: a member named exactly `key`
    first, else `key.npy`."""
    names = set(archive.namelist())
    found = {}
    for key in ("X", "Info"):
        for name in (key, key + ".npy"):
            if name in names:
                found[key] = name
                break
    return found


def _read_array(archive: zipfile.ZipFile, name: str, where: str) -> np.ndarray:
    """The member's array, once its .npy header has been read and checked: no object dtype
    (pickles), a header numpy reads safely, and a declared shape whose bytes the member holds,
    so that nothing is allocated for a shape the archive only claims (numpy allocates the whole
    array before reading a byte of a zip member)."""
    with archive.open(name) as handle:
        shape, dtype, offset = _npy_header(handle, where)
    if any(dim < 0 for dim in shape):
        raise ValueError(f"{where}: its .npy header declares a negative shape {shape}")
    declared = math.prod(shape) * dtype.itemsize
    held = archive.getinfo(name).file_size - offset
    if declared > held:
        raise ValueError(
            f"{where}: its .npy header declares shape {_shown(shape)} of {dtype} "
            f"({declared} bytes), but the archive holds {held} bytes for it"
        )
    with archive.open(name) as handle:
        return np.lib.format.read_array(handle, allow_pickle=False)


def _npy_header(handle: IO[bytes], where: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, offset of the data) of an .npy stream, through numpy's own header parser
    once the header's length is known to be within numpy's limit."""
    prefix = handle.read(len(NPY_MAGIC) + 2)
    if len(prefix) < len(NPY_MAGIC) + 2 or not prefix.startswith(NPY_MAGIC):
        raise ValueError(f"{where} is not an .npy array (it starts with {prefix[:8]!r})")
    version = (prefix[-2], prefix[-1])
    if version not in NPY_LENGTH_BYTES:
        raise ValueError(f"{where}: unknown .npy format version {version[0]}.{version[1]}")
    length_bytes = NPY_LENGTH_BYTES[version]
    raw = handle.read(length_bytes)
    if len(raw) < length_bytes:
        raise ValueError(f"{where}: its .npy header is cut short")
    length = int.from_bytes(raw, "little")
    if length > MAX_NPY_HEADER:
        raise ValueError(
            f"{where}: its .npy header is {length} bytes, over the {MAX_NPY_HEADER} numpy reads"
        )
    handle.seek(len(prefix))
    # Version 3.0 differs from 2.0 only in the header's text encoding (UTF-8 field names of
    # structured dtypes, which are refused anyway as not numbers): 2.0's reader parses it.
    read = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    shape, _, dtype = read(handle, max_header_size=MAX_NPY_HEADER)
    if dtype.hasobject:
        raise ValueError(f"{where}: holds pickled (object) data; never loaded")
    return shape, dtype, len(prefix) + length_bytes + length


def _shown(shape: tuple[int, ...], limit: int = 120) -> str:
    text = str(shape)
    return text if len(text) <= limit else text[:limit] + "...)"


def _as_float32(array: np.ndarray, name: str, what: str) -> np.ndarray:
    if array.ndim != 2 or array.shape[0] == 0:
        raise ValueError(f"{what}: {name} must be a 2-D array with rows, got shape {array.shape}")
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise ValueError(f"{what}: {name} holds {array.dtype}, not numbers")
    return np.ascontiguousarray(array, dtype=np.float32)


def _checked_info(info: np.ndarray, features: np.ndarray, what: str) -> np.ndarray:
    info = _as_float32(info, "Info", what)
    if info.shape[0] != features.shape[0]:
        raise ValueError(
            f"{what}: X has {features.shape[0]} rows and Info {info.shape[0]}; they must be equal"
        )
    venue_columns = info.shape[1] - INFO_FIXED_COLUMNS
    if venue_columns < COLUMNS_PER_VENUE or venue_columns % COLUMNS_PER_VENUE:
        raise ValueError(
            f"{what}: Info has {info.shape[1]} columns; it must have 3 + 4 per venue "
            "(qty, duration, unused, then fill_rate, rebate_bps, punish, latest_vol per venue)"
        )
    return info
