"""A LoRA adapter's ranks and tensor shapes checked against its base before peft allocates.

peft builds every LoRA layer from `r` and `rank_pattern` before it reads a tensor: an
adapter_config.json with r = 10**6 made it allocate 8 GB for a tiny base before anything failed.
A rank larger than the smaller side of every projection of the base cannot add anything, so it
is refused, as are LoRA tensors whose shapes do not fit the projection they name (read from the
safetensors header alone, no tensor loaded). For modules that apply adapters with peft (lora,
llm_judge); it needs torch and safetensors, which their environments have.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from safetensors import SafetensorError, safe_open
from torch import nn

from validator.errors import SubmissionRejected
from validator.text import quoted

# `base_model.model.<module>.lora_A.weight`, with peft's adapter name between on some versions.
_LORA_TENSOR = re.compile(
    r"^base_model\.model\.(?P<module>.+)\.lora_(?P<side>[AB])(\.[^.]+)?\.weight$"
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
    weights: Path,
    error: type[Exception] = SubmissionRejected,
) -> None:
    """Raises `error` naming the first rank or LoRA tensor that cannot fit `base`."""
    limit = max_useful_rank(base)
    for where, rank in ranks.items():
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 < rank <= limit:
            raise error(
                f"adapter_config.json {where} = {quoted(rank)}: not a LoRA rank {base_name} "
                f"can use (1 to {limit})"
            )
    if weights.is_file():
        _check_tensor_shapes(base, weights, limit, error)


def _check_tensor_shapes(
    base: nn.Module, weights: Path, limit: int, error: type[Exception]
) -> None:
    linears = {name: m for name, m in base.named_modules() if isinstance(m, nn.Linear)}
    try:
        with safe_open(str(weights), framework="pt") as tensors:
            shapes = {key: tuple(tensors.get_slice(key).get_shape()) for key in tensors.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise error(f"adapter_model.safetensors does not parse: {exc}") from exc
    for key, shape in shapes.items():
        match = _LORA_TENSOR.match(key)
        layer = linears.get(match["module"]) if match else None
        if layer is None:
            continue  # not a LoRA tensor of a projection: peft ignores it or checks it itself
        rank, fits = _rank_and_fit(match["side"], shape, layer)
        if not fits or not 0 < rank <= limit:
            raise error(
                f"adapter tensor {quoted(key)} has shape {list(shape)}, which does not fit "
                f"{match['module']} ({layer.in_features} in, {layer.out_features} out, "
                f"rank at most {limit})"
            )


def _rank_and_fit(side: str, shape: tuple[int, ...], layer: nn.Linear) -> tuple[int, bool]:
    if len(shape) != 2:
        return 0, False
    if side == "A":  # rank x in_features
        return shape[0], shape[1] == layer.in_features
    return shape[1], shape[0] == layer.out_features  # B: out_features x rank
