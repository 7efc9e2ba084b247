"""The rl validation set: an `.npz` with `X` (rows of features) and `Info` (rows of `3 + 4V`
order and venue columns), read without pickles and within size limits (docs/rl-scoring.md).

The set comes from the Fed Ledger, not from the submitter; a broken one fails the assignment
with the reason (a ValueError), as upstream does, so that validators agree on it.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

INFO_FIXED_COLUMNS = 3  # qty, duration, unused
COLUMNS_PER_VENUE = 4  # fill_rate, rebate_bps, punish, latest_vol


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
        with np.load(path, allow_pickle=False) as archive:
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise ValueError(f"{what}: not an .npz archive")
            _check_unpacked_size(archive, max_unpacked_bytes, what)
            missing = [key for key in ("X", "Info") if key not in archive.files]
            if missing:
                raise ValueError(
                    f"{what}: no {' or '.join(missing)} array (it has: "
                    f"{', '.join(archive.files) or 'none'})"
                )
            features, info = archive["X"], archive["Info"]
    except ValueError as exc:
        if "pickle" in str(exc).lower():  # numpy's refusal of a pickle or an object array
            raise ValueError(f"{what}: holds pickled (object) data; never loaded") from None
        raise ValueError(str(exc) if str(exc).startswith(what) else f"{what}: {exc}") from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{what}: not a readable .npz: {exc}") from None
    except TypeError:  # np.load on a non-npz file it cannot type; never a pickle here
        raise ValueError(f"{what}: not a readable .npz") from None
    return ValidationSet(_as_float32(features, "X", what), _checked_info(info, features, what))


def _check_unpacked_size(archive: np.lib.npyio.NpzFile, limit: int, what: str) -> None:
    unpacked = sum(member.file_size for member in archive.zip.infolist())
    if unpacked > limit:
        raise ValueError(f"{what}: its arrays unpack to {unpacked} bytes, over the limit {limit}")


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
