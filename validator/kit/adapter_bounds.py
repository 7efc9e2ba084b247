"""A LoRA adapter's ranks, tensor shapes and size checked against its base before peft allocates.

peft builds every LoRA layer from `r` and `rank_pattern` before it reads a tensor: an
adapter_config.json with r = 10**6 made it allocate 8 GB for a tiny base before anything failed.
A rank larger than the smaller side of every projection of the base cannot add anything, so it
is refused, as are LoRA tensors whose shapes do not fit the projection they name, and an
adapter holding more elements than MAX_ELEMENTS_PER_BASE_PARAMETER per parameter of its base
(no tensor peft can use is larger than the base's own weights). The tensors come as plain
values (`LoraTensor`) from the module's bounded child that read the safetensors header
(DESIGN.md, "The trust boundary"): nothing here parses a submission's file. For modules that
apply adapters with peft (lora, llm_judge); it needs torch, which their environments have.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from torch import nn

from validator._moved import alias
from validator.errors import SubmissionRejected
from validator.text import quoted

# `base_model.model.<module>.lora_A.weight`, with peft's adapter name between on some versions.
_LORA_TENSOR = re.compile(
    r"^base_model\.model\.(?P<module>.+)\.lora_(?P<side>[AB])(\.[^.]+)?\.weight$"
)


# A LoRA factor at the largest useful rank holds at most twice its projection's weights, a
# modules_to_save copy or a tensor named like a base weight at most that weight: three elements
# per base parameter is past any adapter peft can use.
MAX_ELEMENTS_PER_BASE_PARAMETER = 3
# peft's `layer_replication` deep-copies one base layer per replicated layer, in the validator's
# process, before any weight is read: the supported bases have at most about 80 layers, and no
# trained adapter stacks more than a few times that (400 entries make 800 layer copies of a tiny
# base; 10**6 entries fit in a config of a few MB).
MAX_REPLICATED_LAYERS = 512


class LoraTensor(BaseModel):
    """One tensor of an adapter's safetensors header, as a bounded child read it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    dtype: str
    shape: tuple[int, ...]


def replicated_layers(value: object) -> int | None:
    """The layers peft's `layer_replication` ([[start, end), ...]) builds; 0 when unset, None
    when it is not a list of integer pairs (peft then refuses it itself)."""
    if value in (None, [], ()):
        return 0
    if not isinstance(value, list | tuple):
        return None
    total = 0
    for pair in value:
        if not (
            isinstance(pair, list | tuple)
            and len(pair) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
        ):
            return None
        total += max(pair[1] - pair[0], 0)
    return total


def check_layer_replication(
    layers: int | None, error: type[Exception] = SubmissionRejected
) -> None:
    """Raises `error` when an adapter's `layer_replication` builds more than
    MAX_REPLICATED_LAYERS layers (`layers` as `replicated_layers` counts them)."""
    if layers is not None and layers > MAX_REPLICATED_LAYERS:
        raise error(
            f"adapter_config.json layer_replication builds {layers} layers, over the "
            f"{MAX_REPLICATED_LAYERS} an adapter may replicate"
        )


def max_useful_rank(base: nn.Module) -> int:
    """The smaller side of the base's largest projection: no LoRA rank beyond it adds anything."""
    sides = [min(m.in_features, m.out_features) for m in base.modules() if isinstance(m, nn.Linear)]
    return max(sides, default=0)


def ranks_of(config: Mapping) -> dict[str, object]:
    """`r` (when set: peft has a default) and each `rank_pattern` entry of an adapter config,
    by where they are written."""
    ranks: dict[str, object] = {"r": config["r"]} if "r" in config else {}
    pattern = config.get("rank_pattern") or {}
    if isinstance(pattern, Mapping):
        for key, rank in pattern.items():
            ranks[f"rank_pattern[{quoted(key)}]"] = rank
    return ranks


def check_lora_against_base(
    ranks: Mapping[str, object],
    base: nn.Module,
    base_name: str,
    tensors: Sequence[LoraTensor] | Path,
    error: type[Exception] = SubmissionRejected,
) -> None:
    """Raises `error` naming the first rank or LoRA tensor that cannot fit `base`, or the
    adapter's size when it is past what the base can use. `tensors` is the header as the
    module's bounded child read it; a Path is an alias (validator/_moved.py) that reads the
    header in this process."""
    if isinstance(tensors, Path):
        alias("check_lora_against_base(..., weights: Path)").warn()
        tensors = _header_in_process(tensors, error) if tensors.is_file() else []
    limit = max_useful_rank(base)
    for where, rank in ranks.items():
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 < rank <= limit:
            raise error(
                f"adapter_config.json {where} = {quoted(rank)}: not a LoRA rank {base_name} "
                f"can use (1 to {limit})"
            )
    _check_size(base, base_name, tensors, error)
    _check_tensor_shapes(base, tensors, limit, error)


def _check_size(
    base: nn.Module, base_name: str, tensors: Sequence[LoraTensor], error: type[Exception]
) -> None:
    allowed = MAX_ELEMENTS_PER_BASE_PARAMETER * sum(p.numel() for p in base.parameters())
    total = 0
    for tensor in tensors:
        count = 1
        for dim in tensor.shape:
            count *= dim
        total += count
        if total > allowed:
            raise error(
                f"adapter_model.safetensors holds at least {total} elements, over the "
                f"{allowed} ({MAX_ELEMENTS_PER_BASE_PARAMETER} per parameter) {base_name} can use"
            )


def _check_tensor_shapes(
    base: nn.Module, tensors: Sequence[LoraTensor], limit: int, error: type[Exception]
) -> None:
    linears = {name: m for name, m in base.named_modules() if isinstance(m, nn.Linear)}
    for tensor in tensors:
        key, shape = tensor.name, tensor.shape
        match = _LORA_TENSOR.match(key)
        layer = linears.get(match["module"]) if match else None
        if match is None or layer is None:
            continue  # not a LoRA tensor of a projection: peft ignores it or checks it itself
        rank, fits = _rank_and_fit(match["side"], shape, layer)
        if not fits or not 0 < rank <= limit:
            raise error(
                f"adapter tensor {quoted(key)} has shape {list(shape)}, which does not fit "
                f"{match['module']} ({layer.in_features} in, {layer.out_features} out, "
                f"rank at most {limit})"
            )


def _header_in_process(weights: Path, error: type[Exception]) -> list[LoraTensor]:
    """The alias's reading: safetensors in this process."""
    from safetensors import SafetensorError, safe_open  # noqa: PLC0415 - the alias's path only

    try:
        with safe_open(str(weights), framework="pt") as header:
            return [
                LoraTensor(
                    name=key,
                    dtype=str(header.get_slice(key).get_dtype()),
                    shape=tuple(header.get_slice(key).get_shape()),
                )
                for key in header.keys()
            ]
    except (SafetensorError, OSError, ValueError) as exc:
        raise error(f"adapter_model.safetensors does not parse: {exc}") from exc


def _rank_and_fit(side: str, shape: tuple[int, ...], layer: nn.Linear) -> tuple[int, bool]:
    if len(shape) != 2:
        return 0, False
    if side == "A":  # rank x in_features
        return shape[0], shape[1] == layer.in_features
    return shape[1], shape[0] == layer.out_features  # B: out_features x rank
