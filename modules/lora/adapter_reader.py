"""The bounded child that reads a submitted adapter's files (docs/lora-scoring.md, "Reading the
adapter"): `python -I adapter_reader.py REQUEST.json`, started by `read_adapter` in
modules/lora/reading.py through the kit's `inspect_in_child`. The validator's process never
parses adapter_config.json or the safetensors header; this script does, and writes back plain
values:

    {"config": {peft key: value}, "dropped_keys": [...],
     "tensors": [{"name", "dtype", "shape"}], "data_bytes": N}

or {"error": reason} when the submission's files are at fault. The config keeps only the keys
peft's LoraConfig has (the request lists them); another key is dropped when it is empty and
refused otherwise. The header is checked as safetensors checks it (its size, its JSON, each
tensor's dtype, shape and byte range, the ranges tiling the data exactly), without reading a
tensor. A standalone script: the standard library only, nothing of the validator.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TypeGuard

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
# safetensors refuses a header longer than this (its MAX_HEADER_SIZE).
MAX_HEADER_BYTES = 100_000_000
# Bits per element of each dtype safetensors writes for torch.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64,
}  # fmt: skip
USIZE = 2**64  # safetensors' shapes and offsets are usize
QUOTED = 80
EMPTY: tuple[object, ...] = (None, False, 0, "", [], {})


class Refused(Exception):
    """The submission's files are at fault: the parent fails the assignment with this."""


def main(request_path: str) -> None:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    folder = Path(request["folder"])
    try:
        config, dropped = read_config(folder / CONFIG, frozenset(request["known_keys"]))
        tensors, data_bytes = read_header(folder / WEIGHTS)
        answer = {
            "config": config,
            "dropped_keys": dropped,
            "tensors": tensors,
            "data_bytes": data_bytes,
        }
    except Refused as exc:
        answer = {"error": str(exc)}
    with open(request["result"], "w", encoding="utf-8") as handle:
        json.dump(answer, handle)


def quoted(value: object) -> str:
    if isinstance(value, str) and len(value) > QUOTED:
        value = value[:QUOTED]
    text = repr(value)
    return text if len(text) <= QUOTED else text[:QUOTED] + "..."


def read_config(path: Path, known: frozenset[str]) -> tuple[dict, list[str]]:
    try:
        raw = json.loads(path.read_bytes())
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise Refused(f"{CONFIG} is not JSON: {str(exc)[:200]}") from None
    except RecursionError:  # nested past the interpreter's recursion limit
        raise Refused(f"{CONFIG} nests too deep to read") from None
    if not isinstance(raw, dict):
        raise Refused(f"{CONFIG} must hold a JSON object, not {type(raw).__name__}")
    config, dropped = {}, []
    for key, value in raw.items():
        if key in known:
            config[key] = value
        elif value in EMPTY:
            dropped.append(quoted(key))
        else:
            # An option of another peft version: it could change the computation.
            raise Refused(
                f"{CONFIG} key {quoted(key)} (= {quoted(value)}) is not supported by this "
                "validator's peft; it could change the scores"
            )
    return config, dropped


def read_header(path: Path) -> tuple[list[dict], int]:
    """The header's tensors and the size of the data they tile, as safetensors validates them."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        first = handle.read(8)
        if len(first) < 8:
            raise Refused(f"{WEIGHTS} does not parse: {size} bytes, shorter than its header size")
        length = int.from_bytes(first, "little")
        if length > MAX_HEADER_BYTES:
            raise Refused(f"{WEIGHTS} does not parse: a header of {length} bytes")
        if 8 + length > size:
            raise Refused(f"{WEIGHTS} does not parse: a header of {length} bytes in {size}")
        text = handle.read(length)
    try:
        header = json.loads(text.decode("utf-8"))
    except ValueError as exc:
        raise Refused(f"{WEIGHTS} does not parse: its header is not JSON: {exc}") from None
    except RecursionError:
        raise Refused(f"{WEIGHTS} does not parse: its header nests too deep") from None
    if not isinstance(header, dict):
        raise Refused(f"{WEIGHTS} does not parse: its header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise Refused(f"{WEIGHTS} does not parse: __metadata__ is not a map of strings")
    tensors = [_tensor(name, info) for name, info in header.items()]
    end = 0
    for tensor, (begin, stop) in sorted(tensors, key=lambda t: t[1]):
        if begin != end:
            raise Refused(f"{WEIGHTS} does not parse: {quoted(tensor['name'])} starts at {begin}")
        end = stop
    if 8 + length + end != size:
        raise Refused(f"{WEIGHTS} does not parse: its tensors end at {end} in {size - 8 - length}")
    return [tensor for tensor, _ in tensors], end


def _tensor(name: str, info: object) -> tuple[dict, tuple[int, int]]:
    where = f"{WEIGHTS} does not parse: tensor {quoted(name)}"
    if not isinstance(info, dict):
        raise Refused(f"{where} is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise Refused(f"{where} has dtype {quoted(dtype)}")
    if not _naturals(shape) or not _naturals(offsets) or len(offsets) != 2:
        raise Refused(f"{where} has shape {quoted(shape)} and offsets {quoted(offsets)}")
    elements = 1
    for dim in shape:
        elements *= dim
        if elements >= USIZE:
            raise Refused(f"{where} has shape {quoted(shape)}, past usize")
    begin, stop = offsets
    if begin > stop or elements * DTYPE_BITS[dtype] != (stop - begin) * 8:
        raise Refused(f"{where}: {dtype} {shape} does not fill bytes {begin}..{stop}")
    return {"name": name, "dtype": dtype, "shape": shape}, (begin, stop)


def _naturals(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < USIZE for v in value
    )


if __name__ == "__main__":
    main(sys.argv[1])
