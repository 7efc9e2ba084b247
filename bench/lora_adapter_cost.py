"""The model work an assignment needs before scoring, on each side of the lora benchmark.

Ours keeps the base loaded and cycles the adapter through it (`applied_adapter` with the base's
pristine store); the reference (FLock-io/llm-loss-validator, `load_model`) reads the base from
disk on the host every time, merges the adapter there and moves the model to the device. Both
run on any device, so the test suite times them on a CPU with a tiny shape.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import PeftModel
from safetensors.torch import save_file
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from bench.lora_common import GIB, synchronize
from devkit.tiny_models import LORA_TARGETS
from modules.lora.adapters import applied_adapter, plan_adapter
from validator.kit import PristineWeights


@dataclass(frozen=True)
class AdapterCycle:
    """Ours' per-assignment adapter work: peft load, merge, copy the touched weights back. The
    first assignment on a base also copies them out (to the base's pristine store)."""

    first_seconds: float
    later_seconds: float
    touched_bytes: int
    held: dict[str, int]  # where the pristine copies are: bytes by device type
    restored_exactly: bool


def write_random_adapter(model: PreTrainedModel, dest: Path, rank: int, base_name: str) -> Path:
    """A LoRA adapter file pair for `model` (every attention and MLP projection), with random
    non-zero A and B, written directly: peft's own wrapper would copy the whole model first."""
    generator = torch.Generator().manual_seed(1)
    tensors = {}
    for name, module in _target_linears(model):
        prefix = f"base_model.model.{name}"
        a = torch.randn(rank, module.in_features, generator=generator) * 0.01
        b = torch.randn(module.out_features, rank, generator=generator) * 0.01
        tensors[f"{prefix}.lora_A.weight"] = a.to(module.weight.dtype)
        tensors[f"{prefix}.lora_B.weight"] = b.to(module.weight.dtype)
    dest.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dest / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name,
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": LORA_TARGETS,
    }
    (dest / "adapter_config.json").write_text(json.dumps(config))
    return dest


def time_adapter_cycle(
    model: PreTrainedModel, adapter_dir: Path, base_name: str, later: int = 3
) -> AdapterCycle:
    """`applied_adapter` entered and left with nothing scored in between, as ours does it per
    assignment, with one pristine store as the module keeps per base: once while the store
    fills, then `later` times (median); two weights are compared bit for bit afterwards."""
    plan = plan_adapter(json.loads((adapter_dir / "adapter_config.json").read_text()), [base_name])
    before = [probe.detach().clone() for probe in _probe_weights(model)]
    touched = sum(
        t.numel() * t.element_size()
        for _, m in _target_linears(model)
        for t in (m.weight, m.bias)
        if t is not None
    )
    pristine = PristineWeights()
    device = model.device
    seconds = []
    for _ in range(1 + later):
        synchronize(device)
        started = time.perf_counter()
        with applied_adapter(model, adapter_dir, plan, merge=True, pristine=pristine):
            synchronize(device)
        synchronize(device)
        seconds.append(time.perf_counter() - started)
    after = _probe_weights(model)
    exact = all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    return AdapterCycle(
        seconds[0], statistics.median(seconds[1:]), touched, pristine.held_bytes(), exact
    )


def _target_linears(model: nn.Module) -> Iterator[tuple[str, nn.Linear]]:
    """The projections the bench's adapters adapt, by module name."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in LORA_TARGETS and isinstance(module, nn.Linear):
            yield name, module


def _probe_weights(model: PreTrainedModel) -> list[torch.Tensor]:
    """Two adapted weights, first layer and last, looked up afresh (peft swaps modules)."""
    layers = model.get_decoder().layers
    return [layers[0].self_attn.q_proj.weight, layers[-1].mlp.down_proj.weight]


def print_adapter_cycle(cycle: AdapterCycle, rank: int) -> None:
    held = ", ".join(f"{size / GIB:.1f} GiB on {place}" for place, size in cycle.held.items())
    print(
        f"  adapter r={rank} on every projection ({cycle.touched_bytes / GIB:.1f} GiB of weights "
        f"touched; pristine copies: {held}): load, merge, copy back {cycle.later_seconds:.2f} s "
        f"per assignment (the base's first: {cycle.first_seconds:.2f} s, copying out too); "
        f"restored bit for bit: {'yes' if cycle.restored_exactly else 'NO'}"
    )


def reference_reload(
    base_dir: Path, adapter_dir: Path, dtype: torch.dtype, device: torch.device
) -> tuple[PreTrainedModel, float]:
    """The reference's model work per assignment, timed: the base read from disk onto the host
    (it passes device_map=None), the adapter merged there, the model moved to the device (the
    Trainer does that). Returns the merged model, for checks, and the seconds."""
    synchronize(device)
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=dtype, use_cache=False)
    model = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    model.to(device)
    synchronize(device)
    return model.eval(), time.perf_counter() - started


def print_per_assignment(
    ours_scoring: float, baseline_scoring: float, cycle: AdapterCycle, reload_seconds: float
) -> None:
    ours = cycle.later_seconds + ours_scoring
    baseline = reload_seconds + baseline_scoring
    print(
        f"  per assignment (scoring plus model work): ours {ours:.2f} s "
        f"({cycle.later_seconds:.2f} s adapter), baseline {baseline:.2f} s ({reload_seconds:.2f} s "
        f"reload, merge on the host, move to the device): ratio {baseline / ours:.2f}x"
    )
