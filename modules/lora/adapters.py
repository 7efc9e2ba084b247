"""Checking a submitted adapter's config, and how lora puts the adapter on its base model.

The reference merges the adapter into the base weights (`merge_and_unload`) and scores the
merged model. We do the same, so the numbers match, but keep the base: the kit's `WarmBase`
(`validator/kit/warm_base.py`) copies the weights a merge touches back afterwards, bit for bit,
instead of reloading the base for every assignment.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError

from validator.kit import (
    PristineWeights,
    SubmissionRejected,
    adapter_applied,
    check_layer_replication,
    quoted,
    replicated_layers,
)

log = logging.getLogger(__name__)

KNOWN_KEYS = frozenset(field.name for field in dataclasses.fields(LoraConfig))
# A key we refuse whatever the peft version: it makes peft import modules by name.
REFUSED_KEYS = ("megatron_config",)


class _Shape(BaseModel):
    """Types of the fields that decide the adapter's arithmetic; peft does not check them."""

    model_config = ConfigDict(extra="ignore")

    r: StrictInt = Field(gt=0)
    lora_alpha: StrictInt | StrictFloat
    target_modules: str | list[str] | None = None
    rank_pattern: dict[str, StrictInt] = Field(default_factory=dict)
    alpha_pattern: dict[str, StrictInt | StrictFloat] = Field(default_factory=dict)


class AdapterRejected(SubmissionRejected):
    """The adapter cannot be scored; the assignment is marked failed at once."""


@dataclass(frozen=True)
class AdapterPlan:
    base_model: str
    config: LoraConfig
    dropped_keys: tuple[str, ...]
    # The adapter replaces whole modules or biases, so restoring weights is not enough.
    needs_base_reload: bool


def plan_adapter(
    raw: Any, supported_bases: Collection[str], dropped_keys: Collection[str] = ()
) -> AdapterPlan:
    """Validates adapter_config.json's values, as the bounded child read them (plain JSON
    values, peft's keys only: modules/lora/reading.py) with the keys it dropped; raises
    AdapterRejected with the reason."""
    if not isinstance(raw, dict):
        raise AdapterRejected("adapter_config.json must hold a JSON object")
    base = raw.get("base_model_name_or_path")
    if not isinstance(base, str) or not base.strip():
        raise AdapterRejected("adapter_config.json has no base_model_name_or_path")
    if base not in supported_bases:
        raise AdapterRejected(f"base model {quoted(base)} is not in the supported base-model list")
    peft_type = str(raw.get("peft_type") or "LORA").upper()
    if peft_type != "LORA":
        raise AdapterRejected(f"peft_type {quoted(peft_type)} is not a LoRA adapter")
    for key in REFUSED_KEYS:
        if raw.get(key):
            raise AdapterRejected(f"adapter_config.json sets {key}, which is not allowed")
    check_layer_replication(replicated_layers(raw.get("layer_replication")), AdapterRejected)
    try:
        _Shape.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise AdapterRejected(f"malformed adapter_config.json: {problems}") from exc
    values, dropped = _known_values(raw)
    # Weights come from the file; a special initialisation (PiSSA, OLoRA, LoftQ...) would
    # rewrite the base weights while the layers are created.
    # auto_mapping names classes for AutoPeftModel to import; PeftModel, used here, needs none.
    values.update(init_lora_weights=True, inference_mode=True, auto_mapping=None)
    try:
        config = LoraConfig(**values)
    except (TypeError, ValueError) as exc:
        raise AdapterRejected(f"malformed adapter_config.json: {exc}") from exc
    needs_reload = bool(
        config.modules_to_save
        or config.bias != "none"
        or config.layer_replication
        or getattr(config, "lora_bias", False)
    )
    return AdapterPlan(base, config, (*dropped_keys, *dropped), needs_reload)


def _known_values(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Adapters come from many peft versions. A key this peft does not know is dropped when it
    is empty or false (it cannot change the computation) and refused otherwise."""
    values, dropped = {}, []
    for key, value in raw.items():
        if key in KNOWN_KEYS:
            values[key] = value
        elif value in (None, False, 0, "", [], {}):
            dropped.append(key)
        else:
            raise AdapterRejected(
                f"adapter_config.json key {quoted(key)} (= {quoted(value)}) is not supported "
                "by this validator's peft; it could change the scores"
            )
    return values, dropped


def attacher(adapter_dir: Path, plan: AdapterPlan) -> Callable[[torch.nn.Module], PeftModel]:
    """How lora puts an adapter on its base (the kit's `WarmBase` then merges it, or keeps it
    attached, and undoes it): peft's load with the checked config. What peft raises here is the
    submission's fault (BaseCorrupted)."""

    def attach(base: torch.nn.Module) -> PeftModel:
        try:
            # autocast: the adapter is held in fp32 however it was saved, so a merge adds an
            # fp32 delta to 16-bit weights on any device, as on the reference's CPU.
            return PeftModel.from_pretrained(
                base, str(adapter_dir), config=plan.config, autocast_adapter_dtype=True
            )
        except Exception as exc:
            raise BaseCorrupted(f"the adapter does not fit its base model: {exc}") from exc

    return attach


def applied_adapter(
    base: torch.nn.Module,
    adapter_dir: Path,
    plan: AdapterPlan,
    merge: bool = True,
    pristine: PristineWeights | None = None,
) -> AbstractContextManager:
    """`base` with the adapter applied as the module applies it to its warm base, and `base` as
    it was again on exit (the kit's `adapter_applied`; the bench and tests use a bare model).
    A copy-out, merge or copy-back that fails is BaseNotRestored (a device fault)."""
    return adapter_applied(
        base, attacher(adapter_dir, plan), merge=merge, pristine=pristine, strict=True
    )


class BaseCorrupted(AdapterRejected):
    """peft could not load or apply the adapter's files (a tensor whose shape does not fit the
    base, a safetensors file that does not parse, a dtype peft refuses): the submission's fault.
    Whatever peft raised here is this, with its text as the reason; a device fault under it
    still restarts the process (validator.errors.classify reads the chain)."""
