"""The adapter's ranks, LoRA tensor shapes and size against its base, before peft allocates
anything (validator/kit/adapter_bounds.py), from the header the bounded child read: a refusal
is the submission's, as AdapterRejected."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from modules.lora.adapters import AdapterPlan, AdapterRejected
from validator.kit import LoraTensor, check_lora_against_base, ranks_of


def check_against_base(plan: AdapterPlan, base: nn.Module, tensors: Sequence[LoraTensor]) -> None:
    config = {"r": plan.config.r, "rank_pattern": plan.config.rank_pattern}
    check_lora_against_base(ranks_of(config), base, plan.base_model, tensors, AdapterRejected)
