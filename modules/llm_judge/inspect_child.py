"""The one child that reads a submission's metadata files (modules/llm_judge/inspection.py,
through validator.kit.inspect_in_child): a standalone script (torch and transformers only,
nothing of the validator) under the kit's CPU, memory and wall-clock limits.

`python -I inspect_child.py REQUEST.json`, by `request["phase"]`:

- "model": a full model's config.json (refused with `auto_map`: never remote code), read by
  AutoConfig and built on the meta device (the parameter count, tied parameters once, as
  `model.parameters()` gives them), its generation_config.json (the values the module bounds)
  and its safetensors index (the shard names: at most `request["max_shards"]`, each in the
  repo's listing, `request["listed"]`);
- "adapter": adapter_config.json (its base, `r`, `rank_pattern`) and its weights' header;
- "headers": the safetensors headers of the named files, read from their first bytes (names,
  dtypes, shapes, offsets checked; parameters and bytes summed).

The parent re-reads config.json, generation_config.json, the index and adapter_config.json when
transformers or peft loads the weights: what reading them took here (Python's allocations,
traced) must stay within `request["max_reread_bytes"]`, so that the re-read is cheap. An answer
is plain data; {"error": "..."} for what the submission's files do wrong.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import tracemalloc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from transformers import PretrainedConfig

T = TypeVar("T")

INDEX = "model.safetensors.index.json"
# Bits per element of every dtype the safetensors format names.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "C64": 64,
}  # fmt: skip
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own limit


class Refused(Exception):
    """The submission's files are at fault: the answer is {"error": ...}."""


def main(request_path: str) -> None:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    phase = {"model": model, "adapter": adapter, "headers": headers}[request["phase"]]
    try:
        answer = phase(request)
    except Refused as exc:
        answer = {"error": str(exc)}
    with open(request["result"], "w", encoding="utf-8") as handle:
        json.dump(answer, handle)


# -- phases -------------------------------------------------------------------------------------


def model(request: dict) -> dict:
    folder = request["folder"]
    raw = _json_object(os.path.join(folder, "config.json"), "config.json")
    if "auto_map" in raw:
        raise Refused("it asks for remote code (auto_map); never run")
    _import_config_class(raw.get("model_type"))  # our code's memory, not the config's
    tracemalloc.start()
    try:
        from transformers import AutoConfig  # noqa: PLC0415

        config = _guarded(
            lambda: AutoConfig.from_pretrained(folder, trust_remote_code=False),
            "it cannot be read",
        )
        generation = _generation_values(os.path.join(folder, "generation_config.json"))
        shards = _shards(os.path.join(folder, INDEX))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    _check_reread(peak, request, " (with generation_config.json and the index)")
    if shards is not None:
        _check_shards(shards, request)
    count, buffers = _guarded(lambda: _meta_count(config), "it does not build a model")
    return {"parameter_count": count, "buffer_count": buffers, "shards": shards, **generation}


def adapter(request: dict) -> dict:
    folder = request["folder"]
    tracemalloc.start()
    try:
        config = _json_object(os.path.join(folder, "adapter_config.json"), "adapter_config.json")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    _check_reread(peak, request, "")
    base = config.get("base_model_name_or_path")
    pattern = config.get("rank_pattern")
    peft_type = config.get("peft_type")
    return {
        "peft_type": peft_type if isinstance(peft_type, str) or peft_type is None else "?",
        "replicated_layers": _replicated_layers(config.get("layer_replication")),
        "base_model": base if isinstance(base, str) else None,
        "base_text": str(base)[:200],
        "r": config["r"] if "r" in config else None,
        "has_r": "r" in config,
        "rank_pattern": pattern if isinstance(pattern, dict) else {},
        "weights": _header(
            os.path.join(folder, request["weights"]), request["weights"], listed=True
        ),
    }


def _replicated_layers(value: object) -> int | None:
    """The layers peft's layer_replication builds (validator/kit/adapter_bounds.py counts them
    the same way; this script imports nothing of the validator): 0 unset, None malformed."""
    if value in (None, [], ()):
        return 0
    if not isinstance(value, list):
        return None
    total = 0
    for pair in value:
        ints = isinstance(pair, list) and len(pair) == 2
        if not ints or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
            return None
        total += max(pair[1] - pair[0], 0)
    return total


def headers(request: dict) -> dict:
    files = []
    for name in request["files"]:
        files.append({"file": name, **_header(os.path.join(request["folder"], name), name)})
    return {"files": files}


# -- the readers --------------------------------------------------------------------------------


def _json_object(path: str, name: str) -> dict:
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read())
    except (ValueError, RecursionError) as exc:
        raise Refused(f"{name} is not JSON: {_short(exc)}") from exc
    if not isinstance(data, dict):
        raise Refused(f"{name} must be a JSON object")
    return data


def _generation_values(path: str) -> dict:
    """The generation config's values the module bounds. One that does not parse is
    transformers' to judge, as there (it falls back to the model config's defaults)."""
    if not os.path.isfile(path):
        return {"num_beams": None, "sequence_rules": 0}
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read())
    except (ValueError, RecursionError):
        data = {}
    data = data if isinstance(data, dict) else {}
    beams = data.get("num_beams")
    rules = sum(
        len(value)
        for value in (data.get(name) for name in ("bad_words_ids", "sequence_bias"))
        if isinstance(value, list | dict)
    )
    return {
        "num_beams": beams if isinstance(beams, int) and not isinstance(beams, bool) else None,
        "sequence_rules": rules,
    }


def _shards(path: str) -> list[str] | None:
    """The shard files the index names; None without an index."""
    if not os.path.isfile(path):
        return None
    index = _json_object(path, INDEX)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in weight_map.items()
    ):
        raise Refused(
            "its safetensors index or headers do not parse (weight_map is not an object of "
            "tensor names to file names)"
        )
    return sorted(set(weight_map.values()))


def _check_shards(shards: list[str], request: dict) -> None:
    """The download the index plans, before any of it: at most `max_shards` files (each one is
    a download in the validator's process), every one of them in the repo's listing."""
    if not shards:
        raise Refused("its safetensors index names no shards")
    if len(shards) > request["max_shards"]:
        raise Refused(
            f"its safetensors index names {len(shards)} shard files, over {request['max_shards']}"
        )
    listed = set(request["listed"])
    unlisted = [name for name in shards if name not in listed]
    if unlisted:
        raise Refused(
            "its safetensors index names shards the repo does not have "
            f"({', '.join(repr(name[:100]) for name in unlisted[:3])})"
        )


def _header(path: str, name: str, *, listed: bool = False) -> dict:
    """The header's counts; `listed`: each tensor's name, dtype and shape too (an adapter's,
    for the kit's check against the base: validator/kit/adapter_bounds.py)."""

    def refuse(why: str) -> Refused:
        return Refused(f"its safetensors index or headers do not parse ({name}: {why})")

    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        if size < 8 or length > size - 8 or length > MAX_HEADER_BYTES:
            raise refuse(f"a header of {length} bytes in a file of {size}")
        try:
            header = json.loads(handle.read(length))
        except (ValueError, RecursionError) as exc:
            raise refuse(f"the header is not JSON: {_short(exc)}") from exc
    if not isinstance(header, dict):
        raise refuse("the header is not a JSON object")
    data_bytes = size - 8 - length
    parameters = tensors = 0
    dtypes: set[str] = set()
    listing: list[dict] = []
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        dtype, shape, offsets = _entry(entry)
        if not isinstance(dtype, str) or dtype not in DTYPE_BITS:  # a list is unhashable
            raise refuse(f"tensor {key[:100]!r} has no known dtype")
        if shape is None or offsets is None:
            raise refuse(f"tensor {key[:100]!r} has no shape or offsets of integers")
        numel = math.prod(shape)
        begin, end = offsets
        bits = numel * DTYPE_BITS[dtype]
        if not 0 <= begin <= end <= data_bytes or (bits % 8 == 0 and end - begin != bits // 8):
            raise refuse(f"tensor {key[:100]!r}'s offsets do not fit its shape and the file")
        parameters += numel
        tensors += 1
        dtypes.add(dtype)
        if listed:
            listing.append({"name": key, "dtype": dtype, "shape": shape})
    answer = {"tensors": tensors, "parameters": parameters, "dtypes": sorted(dtypes)}
    return {**answer, "listing": listing} if listed else answer


def _entry(entry: object) -> tuple[object, list[int] | None, list[int] | None]:
    if not isinstance(entry, dict):
        return None, None, None
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    return entry.get("dtype"), _ints(shape), _ints(offsets) if _pair(offsets) else None


def _ints(value: object) -> list[int] | None:
    if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        return value
    return None


def _pair(value: object) -> bool:
    return isinstance(value, list) and len(value) == 2


# -- the config, built ---------------------------------------------------------------------------


def _import_config_class(model_type: object) -> None:
    """Imports the config module of `model_type` before the tracing starts (transformers
    imports it lazily on first use); an unknown type is AutoConfig's to report."""
    from transformers import CONFIG_MAPPING  # noqa: PLC0415

    if not isinstance(model_type, str):
        return
    try:
        CONFIG_MAPPING[model_type]
    except Exception:  # noqa: BLE001,S110 - AutoConfig reports it below
        pass


def _meta_count(config: PretrainedConfig) -> tuple[int, int]:
    """The parameters, and the elements of the buffers (not parameters, yet allocated when the
    validator builds the model: gpt_neo's causal masks take max_position_embeddings**2 each)."""
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    config = _as_loaded(config)
    # The meta device: every tensor is a shape without storage, however large it claims to be;
    # only the module objects themselves take memory (the limits bound them).
    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    return sum(p.numel() for p in built.parameters()), sum(b.numel() for b in built.buffers())


def _as_loaded(config: PretrainedConfig) -> PretrainedConfig:
    """The config of the model `AutoModelForCausalLM.from_pretrained` builds: for a composite
    config (Qwen3.5's own checkpoints hold a text and a vision model) whose causal LM takes
    only the text part, that part, as from_pretrained picks it (from_config does not)."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415
    from transformers.models.auto.auto_factory import _get_model_class  # noqa: PLC0415

    mapping = AutoModelForCausalLM._model_mapping
    if type(config) in mapping:
        model_class = _get_model_class(config, mapping)
        if model_class.config_class == config.sub_configs.get("text_config", None):
            return config.get_text_config()
    return config


def _guarded(call: Callable[[], T], what: str) -> T:
    try:
        return call()
    except MemoryError:
        raise  # past the memory limit: the set-up reports it as such
    except Exception as exc:  # noqa: BLE001 - a config can make transformers raise anything
        if _memory_spent():
            # An allocation failed inside C code that does not turn it into MemoryError (torch's
            # module set-up answers "SystemError: ... returned NULL without setting an
            # exception"): the limit was met, and the set-up must report it as such.
            raise MemoryError(str(exc)) from exc
        raise Refused(f"{what}: {_short(exc)}") from exc


def _check_reread(peak: int, request: dict[str, Any], besides: str) -> None:
    limit = request["max_reread_bytes"]
    if peak > limit:
        raise Refused(
            f"reading it{besides} took {peak} bytes, over {limit} (max_reread_bytes): the "
            "validator reads it again when it loads the weights"
        )


def _memory_spent(share: float = 0.9) -> bool:
    """Whether this process's peak address space came within `share` of its RLIMIT_AS."""
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit == resource.RLIM_INFINITY:
        return False
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmPeak:"):
                return int(line.split()[1]) * 1024 >= share * limit
    return False


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text if len(text) <= 300 else text[:300] + "..."


if __name__ == "__main__":
    main(sys.argv[1])
